"""The `augment` command: augment any training set (a GLUE task or a user's file or dataset) into shards on disk.

Output folder: ``shards/`` (the augmented dataset, ``datasets`` Arrow shards: the input's columns plus
``source_index`` and ``is_augmented``), ``stage.json`` (run id and counts, written last), and optionally one flat
file (``--export``) for tools that do not read Arrow.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from pathlib import Path
from typing import Callable

import datasets

from augment.dataset import augment_dataset, augment_fingerprint, load_shards
from augment.tokens import is_word_list_feature
from augment.vectors import check_word_vectors
from distill.config import ConfigError, PipelineConfig, to_dict
from distill.device import run_device
from distill.job.stages import with_contents
from distill.method.checkpoint import mark_stage_done, stage_done
from distill.method.fingerprints import content_or_name
from distill.tasks.base import DataError
from distill.tasks.data import load_task_data, task_spec
from distill.tasks.files import read_table, require_columns

logger = logging.getLogger(__name__)


def default_text_columns(columns: list[str], source: str) -> tuple[str, ...]:
    """The text column(s) of a table whose user named none: the first present of the text columns of the named tasks
    whose type augmentation keeps true (:data:`distill.tasks.TASKS`: pairs before single columns, e.g. ``sentence1``
    and ``sentence2``, then ``sentence``), else ``text``.

    Raises:
        DataError: none is present (the present columns are listed).
    """
    from distill.tasks import TASKS

    named = dict.fromkeys(spec.text_columns for spec in TASKS.values() if spec.type.supports_augmentation)
    for candidate in [*sorted(named, key=len, reverse=True), ("text",)]:
        if all(c in columns for c in candidate):
            return candidate
    raise DataError(f"{source}: say which column(s) to augment with --text-columns; present: {columns}")


def _input(config: PipelineConfig, source: str | None, text_columns: list[str] | None, split: str):
    """(dataset, text columns, what identifies the input) for a user source or the configured task."""
    if source is None:
        spec = task_spec(config.task)
        data = load_task_data(config.task, spec)["train"]
        identity = {"task": to_dict(config.task)}
        with_contents(identity, config)  # its data files by their bytes, as in the pipeline's run ids
        return data, tuple(text_columns or spec.text_columns), identity["task"]
    data = read_table(source, split)
    columns = tuple(text_columns) if text_columns else default_text_columns(data.column_names, source)
    return data, columns, {"source": content_or_name(source), "split": split}


def run_augment(
    config: PipelineConfig,
    source: str | None = None,
    text_columns: list[str] | None = None,
    split: str = "train",
    export: str | None = None,
    device=None,
    replaceable: Callable[[dict], list[bool]] | None = None,
) -> dict:
    """Augment a training set into ``config.output_dir`` (resuming a killed run), optionally export it.

    Args:
        config: ``augment`` (N, p, K, seed, vectors, workers ...), ``mlm.model`` (the masked LM), ``task`` (used when
            ``source`` is None) and ``output_dir``.
        source: see :func:`distill.tasks.data.read_table`; None augments the training set of ``config.task``.
        text_columns: one column, or two for pair tasks (each augmented independently); a column of strings, or of
            lists of words (token classification: augmented word for word, see :mod:`augment.tokens`).
        split: split of a saved ``DatasetDict`` or hub dataset.
        export: a ``.jsonl``, ``.csv`` or ``.tsv`` path to also write the result to.
        device: where the masked LM and the word-vector search run; None: the run's device
            (:func:`distill.device.run_device`).
        replaceable: which words of a word-list column may change, an example row -> one flag per word; its repr
            enters the run id, so give one with a stable repr (:class:`augment.tokens.TagMask`, e.g. from
            :func:`augment.tokens.only_tags`; a lambda's repr changes every run). None: every word.

    Returns:
        {"num_examples", "num_rows", "num_augmented", "seconds", "output", "sample" (first rows)}.

    Raises:
        ConfigError: no masked LM given, a task whose labels word replacement would change (question answering),
        or a multi-process launch (``WORLD_SIZE`` above 1). DataError: unreadable input, missing or non-text columns (neither strings
        nor lists of strings). ValueError: ``replaceable`` given without exactly one word-list column.
        CheckpointError: the output folder holds another run's shards. ModelError: the masked LM has no MLM head.
    """
    from augment.generator import generator_factory
    from distill.method.processes import several_processes
    from teachers.models import load_masked_lm

    if several_processes():  # every process would write the same shards
        raise ConfigError("augment runs in one process; under a multi-process launch the pipeline's augmentation "
                          "stage shares the work out (or use augment.num_workers for worker processes)")
    if config.mlm.model is None:
        raise ConfigError("mlm.model: augment needs a masked LM: pass --mlm (a ...ForMaskedLM checkpoint; an encoder "
                          "without an MLM head gets one with `run_distill.py adapt-mlm`)")
    kind = task_spec(config.task).type if source is None else None
    if kind is not None and not kind.supports_augmentation:  # before any data is read
        raise ConfigError(f"augment --task {config.task.name}: TinyBERT's word replacement would change the labels of "
                          f"a {kind.description} (answers and their offsets); augment a classification or token "
                          "classification task, or a table with --input")
    data, columns, identity = _input(config, source, text_columns, split)
    if source is None and replaceable is None:  # the task's own rule, as the pipeline's augmentation stage has it
        spec = task_spec(config.task)
        replaceable = spec.type.replaceable_words(spec, config.augment.replace_entities)
    require_columns(data, columns, source or config.task.name)
    not_text = [c for c in columns if not _is_text(data.features[c]) and not is_word_list_feature(data.features[c])]
    if not_text:
        raise DataError(f"{source or config.task.name}: column(s) {not_text} are not text ({data.features[not_text[0]]})")
    out = Path(config.output_dir)
    # Local inputs count by their bytes, as in the pipeline's augmentation stage: an edited table, a masked LM trained
    # again into the same folder or another vectors file at the same path is a new run, not the old shards.
    inputs = (identity, len(data), data.column_names, columns, content_or_name(config.mlm.model))
    run_id = augment_fingerprint(config.augment, *inputs, *(() if replaceable is None else (repr(replaceable),)))
    record = stage_done(out, run_id)
    if record is None:
        check_word_vectors(config.augment.word_vectors)
        if config.augment.num_workers > 1:
            load_masked_lm(config.mlm.model)  # fail here, not in every worker
        start = time.perf_counter()
        device = device if device is not None else run_device()
        factory = generator_factory(config.augment, config.mlm.model, device=device)
        augmented = augment_dataset(data, columns, factory, config.augment, out, run_id, replaceable)
        num_augmented = int(sum(augmented["is_augmented"]))
        record = mark_stage_done(out, run_id, {
            "num_examples": len(data), "num_rows": len(augmented), "num_augmented": num_augmented,
            "seconds": time.perf_counter() - start, "text_columns": list(columns), "device": str(device),
        })
    else:
        logger.info("augmentation in %s is complete; skipping (delete the folder to redo it)", out)
        augmented = load_shards(out)
    if export:
        export_table(augmented, Path(export))
    sample = augmented.select(range(min(6, len(augmented)))).to_list()
    return {**record, "output": str(out / "shards"), "sample": sample}


def _is_text(feature) -> bool:
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def export_table(dataset: datasets.Dataset, path: Path) -> None:
    """Write ``dataset`` to one ``.jsonl``, ``.csv`` (quoted as needed) or ``.tsv`` (GLUE style, no quoting) file,
    atomically.

    Raises:
        DataError: unknown suffix, or a TSV export of text holding tabs or newlines (use .csv or .jsonl).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".jsonl":
        dataset.to_json(str(tmp), lines=True, force_ascii=False)
    elif path.suffix == ".csv":
        dataset.to_csv(str(tmp), index=False)
    elif path.suffix == ".tsv":
        for name, feature in dataset.features.items():
            if _is_text(feature) and any("\t" in t or "\n" in t for t in dataset[name]):
                raise DataError(f"column {name!r} holds tabs or newlines, which TSV cannot carry; export .csv or .jsonl")
        dataset.to_csv(str(tmp), index=False, sep="\t", quoting=csv.QUOTE_NONE)
    else:
        raise DataError(f"cannot export to {path}: use a .jsonl, .csv or .tsv file name")
    os.replace(tmp, path)
    logger.info("exported %d rows to %s", len(dataset), path)
