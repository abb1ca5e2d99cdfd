"""TinyBERT data augmentation: masked-LM candidates for single-piece words, word-vector neighbours for the rest;
string columns (sentences) and word-list columns (token classification, word for word: :mod:`augment.tokens`).

The `augment` command, which augments a training set into a resumable stage folder, is the job's
(:func:`distill.job.augmentation.run_augment`, also ``distill.run_augment``)."""

from augment.augmenter import (
    CandidateGenerator,
    load_stopwords,
    match_case,
    sample_copies,
    sample_word_copies,
    split_words,
)
from augment.dataset import (
    augment_dataset,
    augment_examples,
    augment_fingerprint,
    claim_shards,
    examples_to_augment,
    load_shards,
    save_dataset,
    shard_folders,
)
from augment.generator import build_generator, generator_factory
from augment.tokens import TagMask, only_tags, replacement_stats, word_candidates
from augment.vectors import NeighbourCache, VectorsError, check_word_vectors, load_word_vectors

__all__ = [
    "CandidateGenerator",
    "NeighbourCache",
    "TagMask",
    "VectorsError",
    "augment_dataset",
    "augment_examples",
    "augment_fingerprint",
    "build_generator",
    "check_word_vectors",
    "claim_shards",
    "generator_factory",
    "load_shards",
    "save_dataset",
    "shard_folders",
    "load_stopwords",
    "load_word_vectors",
    "match_case",
    "only_tags",
    "replacement_stats",
    "sample_copies",
    "sample_word_copies",
    "split_words",
    "word_candidates",
]
