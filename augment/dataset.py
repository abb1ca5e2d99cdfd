"""Augment a whole dataset into shards on disk, resumably.

Output rows keep every input column (the label and any untouched text column unchanged) and add provenance:
``source_index`` (row of the input example) and ``is_augmented``. A text column is a string column (a sentence) or a
word-list column (Arrow ``list<string>``: token classification), the latter augmented word for word
(:mod:`augment.tokens`) so each copy keeps its source's per-word labels. The original examples are kept; exact duplicate
rows of an example (including copies equal to the original) are dropped. Each shard is written under a temporary
name and renamed when complete, so a killed run re-run continues at the first missing shard and no partial shard is
ever read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import datasets
import torch
from tqdm.auto import tqdm

from augment.augmenter import CandidateGenerator, sample_copies, sample_word_copies, split_words
from augment.tokens import check_words, is_word_list_feature, word_candidates, word_masks
from distill.method.checkpoint import CheckpointError, write_json_atomic
from distill.config import AugmentConfig, fingerprint, hashed_dict
from distill.method.fingerprints import content_or_name

logger = logging.getLogger(__name__)

SHARDS = "shards"
# Examples whose candidate lists are built together: their masked rows are sorted by length across all of them.
EXAMPLES_PER_PASS = 256
RUN_FILE = "run.json"


def augment_fingerprint(config: AugmentConfig, *inputs) -> str:
    """Run id of an augmentation: its settings (less the speed-only ones: :func:`distill.config.hashed_dict`) and
    whatever identifies its inputs."""
    settings = hashed_dict(config)
    for name in ("word_vectors", "stopwords"):  # a local file counts by its bytes
        settings[name] = content_or_name(settings[name])
    return fingerprint(settings, *inputs)


def example_rng(seed: int, index: int, column: str) -> random.Random:
    """The RNG of one example's column: depends only on (seed, index, column), not on batching or workers."""
    return random.Random(f"{seed}:{index}:{column}")


def augment_examples(
    examples: list[dict],
    indices: list[int],
    text_columns: tuple[str, ...],
    generator: CandidateGenerator,
    config: AugmentConfig,
    replaceable: Callable[[dict], list[bool]] | None = None,
) -> list[dict]:
    """Original and augmented rows for a batch of examples (TinyBERT, Jiao et al., 2020, §3.3, Algorithm 1).

    Each text column is augmented independently (pair tasks: both sentences); copy i of an example combines copy i
    of each column (``config.pair_copies == "both"``), or changes column i mod 2 only and keeps the other as it is
    (``"one"``). Rows identical to the original or to an earlier copy are dropped. A column whose values are lists
    of words is augmented word for word (:func:`augment.tokens.word_candidates`): a copy has as many words as its
    source, so a per-word label list stays aligned.

    Args:
        examples: rows (dicts) with the text columns and any others.
        indices: each example's row number in the dataset (its RNG: :func:`example_rng`).
        text_columns: the columns to augment, strings or lists of words.
        generator: builds candidate lists.
        config: N, p, seed, pair_copies.
        replaceable: for a word-list column, an example row -> one flag per word (W flags; False: the word keeps
            itself), e.g. :func:`augment.tokens.only_tags` for words tagged ``O``; None: every word may be replaced
            (if alphabetic and not a stop word, the algorithm's own rule).

    Returns:
        Rows in order: each original followed by its copies, with ``source_index`` and ``is_augmented`` added.

    Raises:
        ValueError: ``replaceable`` is given but ``text_columns`` do not hold exactly one word-list column.
        DataError: a word-list value is not a list of strings, or a mask has not one flag per word.
    """
    word_columns = word_list_columns(examples, text_columns)
    if replaceable is not None and examples and len(word_columns) != 1:
        raise ValueError(f"replaceable masks the words of one word-list column; {list(text_columns)} hold "
                         f"{len(word_columns)} ({word_columns})")
    candidates = {}
    for c in text_columns:
        if c in word_columns:
            sentences = [check_words(e[c], c, i) for e, i in zip(examples, indices)]
            candidates[c] = word_candidates(generator, sentences, word_masks(examples, indices, c, replaceable))
        else:
            candidates[c] = generator.candidates(["" if e[c] is None else str(e[c]) for e in examples])
    rows = []
    for j, (example, index) in enumerate(zip(examples, indices)):
        rows.append({**example, "source_index": index, "is_augmented": False})
        seen = {_hashable(example[c] for c in text_columns)}
        copies = {c: _copies(example[c], candidates[c][j], c in word_columns, config, index, c) for c in text_columns}
        for i in range(config.num_copies):
            if config.pair_copies == "one" and len(text_columns) == 2:
                texts = tuple(copies[c][i] if k == i % 2 else example[c] for k, c in enumerate(text_columns))
            else:
                texts = tuple(copies[c][i] for c in text_columns)
            if _hashable(texts) not in seen:
                seen.add(_hashable(texts))
                rows.append({**example, **dict(zip(text_columns, texts)), "source_index": index, "is_augmented": True})
    return rows


def word_list_columns(examples: list[dict], text_columns: tuple[str, ...]) -> tuple[str, ...]:
    """The text columns whose values are lists of words (any example's value a list)."""
    return tuple(c for c in text_columns if any(isinstance(e[c], (list, tuple)) for e in examples))


def _copies(value, candidates: dict, is_word_list: bool, config: AugmentConfig, index: int, column: str) -> list:
    if value is None:  # a missing text (an empty cell, a pair task's absent second text) stays missing in every copy
        return [None] * config.num_copies
    rng = example_rng(config.seed, index, column)
    if is_word_list:
        return sample_word_copies(list(value), candidates, config.num_copies, config.replace_prob, rng)
    return sample_copies(str(value), candidates, config.num_copies, config.replace_prob, rng)


def _hashable(texts) -> tuple:
    """The texts of a row as a key for duplicate detection (word lists as tuples)."""
    return tuple(tuple(t) if isinstance(t, list) else t for t in texts)


def _rows_to_dataset(rows: list[dict], features: datasets.Features) -> datasets.Dataset:
    columns = {name: [row[name] for row in rows] for name in features}
    return datasets.Dataset.from_dict(columns, features=features)


def _output_features(dataset: datasets.Dataset) -> datasets.Features:
    features = dataset.features.copy()
    features["source_index"] = datasets.Value("int64")
    features["is_augmented"] = datasets.Value("bool")
    return features


def examples_to_augment(num_examples: int, config: AugmentConfig, mlm_words: list[int] | None = None) -> int:
    """How many of the first examples are augmented: ``max_examples`` (None: all), and under ``max_rows`` no more
    than (max_rows − n) / num_copies, so the augmented set stays within about ``max_rows`` rows whatever the size of
    the task (a small task is augmented in full, a large one in part); under ``max_mlm_words``, no more than the first
    examples whose masked-LM work (``mlm_words``, :func:`masked_lm_words`) sums to at most that, so that long texts,
    whose every word is a masked row as long as the text, cannot make augmentation run for hours. With
    ``num_copies`` 0, none (no copy to make: the masked LM is not run)."""
    if config.num_copies == 0:
        return 0
    limit = num_examples if config.max_examples is None else min(config.max_examples, num_examples)
    if config.max_rows is not None and config.num_copies > 0:
        limit = min(limit, max(0, (config.max_rows - num_examples) // config.num_copies))
    if config.max_mlm_words is not None and config.num_copies > 0:
        if mlm_words is None:
            raise ValueError("examples_to_augment: max_mlm_words needs each example's masked-LM work (mlm_words)")
        total = 0
        for index in range(limit):
            total += mlm_words[index]
            if total > config.max_mlm_words:
                return index
    return limit


def masked_lm_words(example: dict, text_columns: tuple[str, ...], mlm_context: str) -> int:
    """An example's masked-LM work in words: per text, (its words) × (the words of a masked row: the text, twice
    with ``mlm_context`` "pair", which appends the original). Every word counts, an upper bound of the rows the
    augmenter sends (it skips stop words and words of several pieces); word pieces are about 1.2-1.4 words'."""
    work = 0
    for column in text_columns:
        value = example[column]
        words = len(value) if isinstance(value, (list, tuple)) else len(split_words(value or ""))
        work += words * words * (2 if mlm_context == "pair" else 1)
    return work


def augment_dataset(
    dataset: datasets.Dataset,
    text_columns: tuple[str, ...],
    generator: CandidateGenerator | Callable[[], CandidateGenerator],
    config: AugmentConfig,
    output_dir: Path,
    run_id: str | None = None,
    replaceable: Callable[[dict], list[bool]] | None = None,
    share: tuple[int, int] = (0, 1),
) -> datasets.Dataset | None:
    """Augment ``dataset`` (the first :func:`examples_to_augment` examples, as ``config.max_examples``,
    ``max_rows`` and ``max_mlm_words`` allow; the rest are kept as they are) into shards
    (TinyBERT, Jiao et al., 2020, §3.3, Algorithm 1; see :func:`augment_examples`).

    Shards of ``config.shard_size`` source examples are written atomically; a re-run skips complete shards, so a
    killed run continues where it stopped. With ``config.num_workers`` > 1, shards are spread over that many
    processes, each building its own generator; the output is the same for any worker count or batch size because
    every example draws from its own RNG (:func:`example_rng`), up to float rounding: a masked LM's two candidates
    whose logits tie to the last bit may rank in another order in another batch (padding, kernels), which changes
    the candidate drawn; not seen on this project's runs, but possible.

    Args:
        dataset: input rows with the text column(s) and any others (label, ...).
        text_columns: the columns to augment: strings, or lists of words (``list<string>``, augmented word for word:
            every copy keeps its source's word count, so a per-word ``label`` list stays true).
        generator: builds candidate lists (masked LM + word vectors), or a picklable zero-argument factory of one
            (needed for worker processes; called only when a shard is missing).
        config: N, p, K, seed, shard size, workers.
        output_dir: shards go to ``output_dir/shards/shard-00000`` ...; existing complete shards are reused.
        run_id: fingerprint of the settings; shards written under another run id are refused, not mixed in. It
            must also identify ``replaceable`` (the caller's: e.g. the task's augmentation setting).
        replaceable: which words of the word-list column may be replaced, an example row -> W flags (see
            :func:`augment_examples`); picklable when ``config.num_workers`` > 1 (e.g.
            :class:`augment.tokens.TagMask`). None: every word.
        share: (this process's index, number of processes) when several processes write the shards together (a
            multi-process launch): this one writes the missing shards ``k`` with ``k % number == index`` and returns
            None; the caller claims the folder first (:func:`claim_shards`), and once every share is written (see
            :func:`shard_folders`) calls this again without ``share`` for the rest and the whole set. The set is the one
            a single process makes, each example drawing from its own RNG.

    Returns:
        All shards concatenated (see :func:`load_shards`); None with a ``share`` of several processes.

    Raises:
        CheckpointError: ``output_dir`` holds shards of another run.
        ValueError: ``replaceable`` is given but ``text_columns`` do not hold exactly one word-list column.
        DataError: a word-list value is not a list of strings, or a mask has not one flag per word.
    """
    word_columns = [c for c in text_columns if c in dataset.features and is_word_list_feature(dataset.features[c])]
    if replaceable is not None and len(word_columns) != 1:
        raise ValueError(f"replaceable masks the words of one word-list column; {list(text_columns)} hold "
                         f"{len(word_columns)} ({word_columns})")
    shard_dir = Path(output_dir) / SHARDS
    index, processes = share
    if processes == 1:
        _claim(shard_dir, run_id)
    features = _output_features(dataset)
    limit, mlm_words = _augmented_examples(dataset, text_columns, config)
    if mlm_words is not None:
        logger.info("augment.max_mlm_words %d: %d of the first %d examples augmented (%d words of masked-LM work)",
                    config.max_mlm_words, limit, len(mlm_words), sum(mlm_words[:limit]))
    jobs = [
        (k, list(range(k * config.shard_size, min((k + 1) * config.shard_size, limit))))
        for k in range(math.ceil(limit / config.shard_size))
        if k % processes == index and not (shard_dir / f"shard-{k:05d}").is_dir()
    ]
    if processes > 1:
        logger.info("augmentation: process %d of %d writes %d of the shards", index, processes, len(jobs))
    mine = sum(len(range(k * config.shard_size, min((k + 1) * config.shard_size, limit)))
               for k in range(index, math.ceil(limit / config.shard_size), processes))  # this process's share
    progress = tqdm(total=mine, initial=mine - sum(len(i) for _, i in jobs), desc="augment", unit="ex")
    tasks = ((dataset.select(indices).to_list(), indices, shard_dir / f"shard-{k:05d}") for k, indices in jobs)
    if config.num_workers > 1 and len(jobs) > 1:
        factory = generator if not isinstance(generator, CandidateGenerator) else None
        if factory is None:
            raise ValueError("num_workers > 1 needs a picklable generator factory, not a built generator")
        threads = max(1, torch.get_num_threads() // config.num_workers)
        context = multiprocessing.get_context("spawn")
        with context.Pool(config.num_workers, _init_worker, (factory, threads)) as pool:
            arguments = [(examples, indices, text_columns, config, features, final, replaceable)
                         for examples, indices, final in tasks]
            for count in pool.imap_unordered(_worker_shard, arguments):
                progress.update(count)
    elif jobs:
        built = generator if isinstance(generator, CandidateGenerator) else generator()
        for examples, indices, final in tasks:
            _write_shard(examples, indices, text_columns, built, config, features, final, progress.update, replaceable)
    progress.close()
    if processes > 1:
        return None
    rest = shard_dir / f"shard-{math.ceil(limit / config.shard_size):05d}"
    if limit < len(dataset) and not rest.is_dir():  # examples beyond max_examples, kept unaugmented
        tail = dataset.select(range(limit, len(dataset)))
        tail = tail.add_column("source_index", list(range(limit, len(dataset))))
        tail = tail.add_column("is_augmented", [False] * len(tail)).cast(features)
        save_dataset(tail, rest)
    return load_shards(output_dir)


def _augmented_examples(dataset: datasets.Dataset, text_columns: tuple[str, ...], config: AugmentConfig
                        ) -> tuple[int, list[int] | None]:
    """How many of the first examples are augmented (:func:`examples_to_augment`), and the masked-LM work of each of
    the candidates when ``config.max_mlm_words`` is set (else None)."""
    mlm_words = None
    if config.max_mlm_words is not None:
        first = examples_to_augment(len(dataset), dataclasses.replace(config, max_mlm_words=None))
        texts = dataset.select_columns(list(text_columns)).select(range(first))
        mlm_words = [masked_lm_words(example, text_columns, config.mlm_context) for example in texts]
    return examples_to_augment(len(dataset), config, mlm_words), mlm_words


def shard_folders(output_dir: Path, dataset: datasets.Dataset, text_columns: tuple[str, ...], config: AugmentConfig
                  ) -> list[Path]:
    """The folders :func:`augment_dataset` writes the augmented examples to, ``<output_dir>/shards/shard-00000`` ...
    (the examples kept as they are go to one more, written last)."""
    limit, _ = _augmented_examples(dataset, text_columns, config)
    return [Path(output_dir) / SHARDS / f"shard-{k:05d}" for k in range(math.ceil(limit / config.shard_size))]


def claim_shards(output_dir: Path, run_id: str | None) -> None:
    """Make ``<output_dir>/shards`` ready for :func:`augment_dataset`'s shares: remove the partial shards a killed run
    left, and refuse shards of another run id (CheckpointError) or mark the folder as ``run_id``'s."""
    _claim(Path(output_dir) / SHARDS, run_id)


def _write_shard(examples, indices, text_columns, generator, config, features, final: Path, advance,
                 replaceable=None) -> int:
    rows = []
    for first in range(0, len(examples), EXAMPLES_PER_PASS):
        batch = slice(first, first + EXAMPLES_PER_PASS)
        rows += augment_examples(examples[batch], indices[batch], text_columns, generator, config, replaceable)
        advance(len(indices[batch]))
    save_dataset(_rows_to_dataset(rows, features), final)
    return len(indices)


_WORKER: dict = {}  # the generator of a worker process, built once by _init_worker


def _init_worker(factory: Callable[[], CandidateGenerator], num_threads: int) -> None:
    torch.set_num_threads(num_threads)
    _WORKER["generator"] = factory()


def _worker_shard(arguments: tuple) -> int:
    examples, indices, text_columns, config, features, final, replaceable = arguments
    return _write_shard(examples, indices, text_columns, _WORKER["generator"], config, features, final, lambda n: None,
                        replaceable)


def _claim(shard_dir: Path, run_id: str | None) -> None:
    """Create ``shard_dir``, remove partial shards a killed run left, and check the folder belongs to ``run_id``."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    for partial in shard_dir.glob(".tmp-*"):
        shutil.rmtree(partial, ignore_errors=True)
    if run_id is None:
        return
    marker = shard_dir / RUN_FILE
    if marker.exists():
        previous = json.loads(marker.read_text(encoding="utf-8"))["run_id"]
        if previous != run_id:
            raise CheckpointError(
                f"{shard_dir} holds shards of another augmentation run (run id {previous}, this run {run_id}): the "
                f"settings or the input changed. Use a new --output-dir, or delete {shard_dir} to start over."
            )
    else:
        write_json_atomic(marker, {"run_id": run_id})


def save_dataset(shard: datasets.Dataset, final: Path) -> None:
    """Save ``shard`` to the folder ``final`` whole or not at all: written under a temporary name beside it, then
    renamed (a killed run leaves no partial folder at ``final``)."""
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
    shard.save_to_disk(str(tmp / "data"))
    os.replace(tmp / "data", final)
    shutil.rmtree(tmp, ignore_errors=True)


def load_shards(output_dir: Path) -> datasets.Dataset:
    """The augmented dataset written by :func:`augment_dataset`, shards in order."""
    shards = sorted((Path(output_dir) / SHARDS).glob("shard-*"))
    if not shards:
        raise FileNotFoundError(f"no augmented shards in {output_dir}/{SHARDS}; run the augmentation stage first")
    return datasets.concatenate_datasets([datasets.load_from_disk(str(p)) for p in shards])
