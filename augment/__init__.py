"""TinyBERT data augmentation: masked-LM candidates for single-piece words, word-vector neighbours for the rest;
string columns (sentences) and word-list columns (token classification, word for word: :mod:`augment.tokens`)."""

import functools

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
    "run_augment",
    "sample_copies",
    "sample_word_copies",
    "split_words",
    "word_candidates",
]


def generator_factory(config, masked_lm_name: str, *, device) -> "functools.partial[CandidateGenerator]":
    """A picklable zero-argument callable that builds the generator (what worker processes need)."""
    return functools.partial(build_generator, config, masked_lm_name, device=device)


def build_generator(config, masked_lm_name: str, *, device) -> CandidateGenerator:
    """A :class:`CandidateGenerator` from an :class:`~distill.config.AugmentConfig` and a masked LM name or path,
    with the masked LM and the word-vector neighbour search on ``device`` (the run's device).

    Raises:
        teachers.ModelError: the masked LM has no MLM head.
        VectorsError: the word vectors cannot be found.
    """
    from teachers.models import load_masked_lm, load_tokenizer

    vectors = load_word_vectors(config.word_vectors, config.max_vocab)
    return CandidateGenerator(
        load_masked_lm(masked_lm_name),
        load_tokenizer(masked_lm_name),
        NeighbourCache(vectors, config.num_candidates, device=device),
        load_stopwords(config.stopwords),
        config.num_candidates,
        config.mlm_context,
        config.batch_size,
        device,
    )


from augment.run import run_augment  # noqa: E402  (needs generator_factory above)
