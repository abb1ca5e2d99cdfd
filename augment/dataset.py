"""Augment a whole dataset into shards on disk, resumably.

Output rows keep every input column (the label and any untouched text column unchanged) and add provenance:
``source_index`` (row of the input example) and ``is_augmented``. The original examples are kept; exact duplicate
rows of an example (including copies equal to the original) are dropped. Each shard is written under a temporary
name and renamed when complete, so a killed run re-run continues at the first missing shard and no partial shard is
ever read.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

import datasets
from tqdm.auto import tqdm

from augment.augmenter import CandidateGenerator, sample_copies
from distill.config import AugmentConfig

logger = logging.getLogger(__name__)

SHARDS = "shards"


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
    of each column. Rows identical to the original or to an earlier copy are dropped.

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


def augment_dataset(
    dataset: datasets.Dataset,
    text_columns: tuple[str, ...],
    generator: CandidateGenerator,
    config: AugmentConfig,
    output_dir: Path,
) -> datasets.Dataset:
    """Augment ``dataset`` (the first ``config.max_examples`` examples; the rest are kept as they are) into shards.

    Args:
        dataset: input rows with the text column(s) and any others (label, ...).
        text_columns: the columns to augment.
        generator: builds candidate lists (masked LM + word vectors).
        config: N, p, K, seed, shard size.
        output_dir: shards go to ``output_dir/shards/shard-00000`` ...; existing complete shards are reused.

    Returns:
        All shards concatenated (see :func:`load_shards`).
    """
    shard_dir = output_dir / SHARDS
    shard_dir.mkdir(parents=True, exist_ok=True)
    features = _output_features(dataset)
    limit = len(dataset) if config.max_examples is None else min(config.max_examples, len(dataset))
    num_shards = math.ceil(limit / config.shard_size)
    done = sum(1 for k in range(num_shards) if (shard_dir / f"shard-{k:05d}").is_dir())
    progress = tqdm(total=limit, initial=min(limit, done * config.shard_size), desc="augment", unit="ex")
    for k in range(num_shards):
        final = shard_dir / f"shard-{k:05d}"
        if final.is_dir():
            continue
        indices = list(range(k * config.shard_size, min((k + 1) * config.shard_size, limit)))
        examples = dataset.select(indices).to_list()
        rows = []
        for first in range(0, len(examples), config.batch_size):
            rows += augment_examples(
                examples[first : first + config.batch_size], indices[first : first + config.batch_size],
                text_columns, generator, config,
            )
            progress.update(min(config.batch_size, len(examples) - first))
        _save_shard(_rows_to_dataset(rows, features), final)
    progress.close()
    rest = shard_dir / f"shard-{num_shards:05d}"
    if limit < len(dataset) and not rest.is_dir():  # examples beyond max_examples, kept unaugmented
        tail = dataset.select(range(limit, len(dataset)))
        tail = tail.add_column("source_index", list(range(limit, len(dataset))))
        tail = tail.add_column("is_augmented", [False] * len(tail)).cast(features)
        _save_shard(tail, rest)
    return load_shards(output_dir)


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
