"""Building the candidate generator of augmentation from its config: the masked LM, the word vectors' neighbour search
and the stop words, picklable for worker processes."""

from __future__ import annotations

import functools

from augment.augmenter import CandidateGenerator, load_stopwords
from augment.vectors import NeighbourCache, load_word_vectors


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
