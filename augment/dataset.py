"""Augment a whole dataset into shards on disk, resumably.

Output rows keep every input column (the label and any untouched text column unchanged) and add provenance:
``source_index`` (row of the input example) and ``is_augmented``. The original examples are kept; exact duplicate
rows of an example (including copies equal to the original) are dropped. Each shard is written under a temporary
name and renamed when complete, so a killed run re-run continues at the first missing shard and no partial shard is
ever read.
"""

from __future__ import annotations

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

from augment.augmenter import CandidateGenerator, sample_copies
from distill.checkpoint import CheckpointError, write_json_atomic
from distill.config import AugmentConfig, fingerprint, to_dict

logger = logging.getLogger(__name__)

SHARDS = "shards"
# Examples whose candidate lists are built together: their masked rows are sorted by length across all of them.
EXAMPLES_PER_PASS = 256
RUN_FILE = "run.json"


OUTPUT_NEUTRAL = ("batch_size", "num_workers")  # settings that change the speed, not the output


def augment_fingerprint(config: AugmentConfig, *inputs) -> str:
    """Run id of an augmentation: its settings (less the speed-only ones) and whatever identifies its inputs."""
    settings = {k: v for k, v in to_dict(config).items() if k not in OUTPUT_NEUTRAL}
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
) -> list[dict]:
    """Original and augmented rows for a batch of examples.

    Each text column is augmented independently (pair tasks: both sentences); copy i of an example combines copy i
    of each column (``config.pair_copies == "both"``), or changes column i mod 2 only and keeps the other as it is
    (``"one"``). Rows identical to the original or to an earlier copy are dropped.

    Returns:
        Rows in order: each original followed by its copies, with ``source_index`` and ``is_augmented`` added.
    """
    candidates = {c: generator.candidates([str(e[c]) for e in examples]) for c in text_columns}
    rows = []
    for j, (example, index) in enumerate(zip(examples, indices)):
        rows.append({**example, "source_index": index, "is_augmented": False})
        seen = {tuple(example[c] for c in text_columns)}
        copies = {
            c: sample_copies(
                str(example[c]), candidates[c][j], config.num_copies, config.replace_prob, example_rng(config.seed, index, c)
            )
            for c in text_columns
        }
        for i in range(config.num_copies):
            if config.pair_copies == "one" and len(text_columns) == 2:
                texts = tuple(copies[c][i] if k == i % 2 else example[c] for k, c in enumerate(text_columns))
            else:
                texts = tuple(copies[c][i] for c in text_columns)
            if texts not in seen:
                seen.add(texts)
                rows.append({**example, **dict(zip(text_columns, texts)), "source_index": index, "is_augmented": True})
    return rows


def _rows_to_dataset(rows: list[dict], features: datasets.Features) -> datasets.Dataset:
    columns = {name: [row[name] for row in rows] for name in features}
    return datasets.Dataset.from_dict(columns, features=features)


def _output_features(dataset: datasets.Dataset) -> datasets.Features:
    features = dataset.features.copy()
    features["source_index"] = datasets.Value("int64")
    features["is_augmented"] = datasets.Value("bool")
    return features


def examples_to_augment(num_examples: int, config: AugmentConfig) -> int:
    """How many of the first examples are augmented: ``max_examples`` (None: all), and under ``max_rows`` no more
    than (max_rows − n) / num_copies, so the augmented set stays within about ``max_rows`` rows whatever the size of
    the task (a small task is augmented in full, a large one in part)."""
    limit = num_examples if config.max_examples is None else min(config.max_examples, num_examples)
    if config.max_rows is not None and config.num_copies > 0:
        limit = min(limit, max(0, (config.max_rows - num_examples) // config.num_copies))
    return limit


def augment_dataset(
    dataset: datasets.Dataset,
    text_columns: tuple[str, ...],
    generator: CandidateGenerator | Callable[[], CandidateGenerator],
    config: AugmentConfig,
    output_dir: Path,
    run_id: str | None = None,
) -> datasets.Dataset:
    """Augment ``dataset`` (the first ``config.max_examples`` examples; the rest are kept as they are) into shards.

    Shards of ``config.shard_size`` source examples are written atomically; a re-run skips complete shards, so a
    killed run continues where it stopped. With ``config.num_workers`` > 1, shards are spread over that many
    processes, each building its own generator; the output is the same for any worker count or batch size because
    every example draws from its own RNG (:func:`example_rng`).

    Args:
        dataset: input rows with the text column(s) and any others (label, ...).
        text_columns: the columns to augment.
        generator: builds candidate lists (masked LM + word vectors), or a picklable zero-argument factory of one
            (needed for worker processes; called only when a shard is missing).
        config: N, p, K, seed, shard size, workers.
        output_dir: shards go to ``output_dir/shards/shard-00000`` ...; existing complete shards are reused.
        run_id: fingerprint of the settings; shards written under another run id are refused, not mixed in.

    Returns:
        All shards concatenated (see :func:`load_shards`).

    Raises:
        CheckpointError: ``output_dir`` holds shards of another run.
    """
    shard_dir = Path(output_dir) / SHARDS
    _claim(shard_dir, run_id)
    features = _output_features(dataset)
    limit = examples_to_augment(len(dataset), config)
    jobs = [
        (k, list(range(k * config.shard_size, min((k + 1) * config.shard_size, limit))))
        for k in range(math.ceil(limit / config.shard_size))
        if not (shard_dir / f"shard-{k:05d}").is_dir()
    ]
    progress = tqdm(total=limit, initial=limit - sum(len(i) for _, i in jobs), desc="augment", unit="ex")
    tasks = ((dataset.select(indices).to_list(), indices, shard_dir / f"shard-{k:05d}") for k, indices in jobs)
    if config.num_workers > 1 and len(jobs) > 1:
        factory = generator if not isinstance(generator, CandidateGenerator) else None
        if factory is None:
            raise ValueError("num_workers > 1 needs a picklable generator factory, not a built generator")
        threads = max(1, torch.get_num_threads() // config.num_workers)
        context = multiprocessing.get_context("spawn")
        with context.Pool(config.num_workers, _init_worker, (factory, threads)) as pool:
            arguments = [(examples, indices, text_columns, config, features, final) for examples, indices, final in tasks]
            for count in pool.imap_unordered(_worker_shard, arguments):
                progress.update(count)
    elif jobs:
        built = generator if isinstance(generator, CandidateGenerator) else generator()
        for examples, indices, final in tasks:
            _write_shard(examples, indices, text_columns, built, config, features, final, progress.update)
    progress.close()
    rest = shard_dir / f"shard-{math.ceil(limit / config.shard_size):05d}"
    if limit < len(dataset) and not rest.is_dir():  # examples beyond max_examples, kept unaugmented
        tail = dataset.select(range(limit, len(dataset)))
        tail = tail.add_column("source_index", list(range(limit, len(dataset))))
        tail = tail.add_column("is_augmented", [False] * len(tail)).cast(features)
        _save_shard(tail, rest)
    return load_shards(output_dir)


def _write_shard(examples, indices, text_columns, generator, config, features, final: Path, advance) -> int:
    rows = []
    for first in range(0, len(examples), EXAMPLES_PER_PASS):
        batch = slice(first, first + EXAMPLES_PER_PASS)
        rows += augment_examples(examples[batch], indices[batch], text_columns, generator, config)
        advance(len(indices[batch]))
    _save_shard(_rows_to_dataset(rows, features), final)
    return len(indices)


_WORKER: dict = {}  # the generator of a worker process, built once by _init_worker


def _init_worker(factory: Callable[[], CandidateGenerator], num_threads: int) -> None:
    torch.set_num_threads(num_threads)
    _WORKER["generator"] = factory()


def _worker_shard(arguments: tuple) -> int:
    examples, indices, text_columns, config, features, final = arguments
    return _write_shard(examples, indices, text_columns, _WORKER["generator"], config, features, final, lambda n: None)


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


def _save_shard(shard: datasets.Dataset, final: Path) -> None:
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
