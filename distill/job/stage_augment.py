"""The masked-LM and augmentation stages: the distillation training set, augmented (TinyBERT §3.3) with a masked LM
adapted here or given, and any unlabelled transfer text (ranked by the teacher where asked), into ``mlm/`` and
``augmented/``."""


from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import torch
from accelerate import PartialState

from augment import (
    augment_dataset,
    claim_shards,
    examples_to_augment,
    generator_factory,
    load_shards,
    save_dataset,
    shard_folders,
)
from augment.dataset import masked_lm_words
from distill.config import (
    ConfigError,
    PipelineConfig,
    fingerprint,
    to_dict,
)
from distill.job.corpus import sample_lines
from distill.job.stages import STAGES, open_stage, start_stage
from distill.method.checkpoint import (
    mark_stage_done,
)
from distill.method.processes import (
    failure_marked,
    on_main,
    several_processes,
    wait_for,
)
from distill.tasks.base import TaskSpec
from distill.tasks.data import (
    data_source_kind,
    load_task_data_with_source,
    task_spec,
    tokenize,
)
from distill.tasks.evaluate import predict
from teachers import (
    adapt_mlm,
    load_teacher,
    load_tokenizer,
)

logger = logging.getLogger(__name__)


def mlm_run_id(config: PipelineConfig) -> str:
    """The masked LM's part of the augmented set's run id: "none" without copies (``augment.num_copies`` 0),
    "given" for ``mlm.model``, else the run id of the masked LM adapted here."""
    if config.augment.num_copies == 0:
        return "none"
    return "given" if config.mlm.model is not None else STAGES["mlm"].run_id(config, {})


def augmented_inputs(config: PipelineConfig, teacher_id: str) -> dict[str, str]:
    """The augmented set's inputs for its run id: the masked LM's (:func:`mlm_run_id`) and, when the teacher ranks
    the unlabelled text (``augment.unlabelled_ranked``), the teacher's with it in one fingerprint, so that a set made
    without ranking keeps the run id it had."""
    mlm = mlm_run_id(config)
    if config.augment.unlabelled and config.augment.unlabelled_ranked is not None:
        mlm = fingerprint(mlm, "unlabelled text ranked by the teacher", teacher_id)
    return {"mlm": mlm}


def mlm_skip(config: PipelineConfig, copies: bool | None) -> str | None:
    """Why no masked LM is adapted here (the ``mlm`` stage does not run), or None when one is: the rule the run and
    the dry run both follow. ``copies``: whether augmentation makes any copy of the training set
    (:func:`makes_copies`); None when that cannot be known without the data (the hub's), counted as yes."""
    if not config.augment.enabled:
        return "augment.enabled is false"
    if config.augment.num_copies == 0:
        return "augment.num_copies is 0"
    if config.mlm.model is not None:
        return "mlm.model is given"
    if config.augment.max_examples == 0:
        return "augment.max_examples is 0"
    if copies is False:
        budgets = ", ".join(f"augment.{name} {value}" for name, value in (
            ("max_rows", config.augment.max_rows), ("max_mlm_words", config.augment.max_mlm_words))
            if value is not None)
        return f"the training set leaves no room for copies under {budgets or 'augment.max_examples'}"
    return None


def mlm_stage(config: PipelineConfig, out: Path, *, device: torch.device) -> tuple[str, str]:
    """The masked LM adapted here for augmentation (:func:`mlm_skip` says when it is not). Returns (folder, run
    id)."""
    folder = out / "mlm"
    run_id, config, record = open_stage("mlm", config, folder)
    if record is None:
        start_stage("adapt-mlm", folder)
        adapt_mlm(config.mlm, folder, run_id, device=device)
    return str(folder), run_id


def augment_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, out: Path,
                  teacher_record: dict, *, device: torch.device) -> tuple[datasets.Dataset, str]:
    """The distillation training set: augmented (TinyBERT §3.3) or the original, with the masked LM and word-vector
    search on ``device``, and any unlabelled text (ranked by the teacher of ``teacher_record`` in ``out/teacher`` with
    ``augment.unlabelled_ranked``). Returns (dataset, run id)."""
    if not config.augment.enabled:
        return data["train"], STAGES["augmented"].run_id(config, {"mlm": "none"})
    # No copies to make: augment.num_copies 0, or a training set that fills augment.max_rows (or max_examples 0) on
    # its own; the set is the training set and any unlabelled text, and no masked LM is adapted. The run id still
    # names the masked LM the config asks for, so that the plan, which reads no data, gives the same one.
    copies = makes_copies(config, spec, data["train"])
    if config.augment.num_copies > 0 and not copies:
        logger.info("augmentation: the %d training examples leave no room for copies (augment.max_rows %s, "
                    "augment.max_examples %s, augment.max_mlm_words %s); every example is kept as it is and no masked "
                    "LM is adapted", len(data["train"]), config.augment.max_rows, config.augment.max_examples,
                    config.augment.max_mlm_words)
    # The masked LM's run id is known without it (mlm_run_id), so a finished augmented set is found before the masked
    # LM is adapted: a deleted mlm/ folder is not trained again for a set that is already made.
    whole, folder = config, out / "augmented"
    run_id, config, record = open_stage("augmented", config, folder, augmented_inputs(config, teacher_record["run_id"]))
    dev = dev_texts(data, spec) if config.augment.unlabelled else frozenset()  # never drawn as unlabelled text
    rank = partial(teacher_ranks, out / "teacher", spec, config.task.max_seq_length, device=device)
    if record is not None:
        logger.info("augmentation: done (%d rows), skipping", record["num_rows"])
        return with_unlabelled(load_shards(folder), config, spec, folder, dev, rank), run_id
    mlm = (None if not copies else whole.mlm.model if mlm_skip(whole, copies)  # given (copies: nothing else skips it)
           else mlm_stage(whole, out, device=device)[0])
    start_stage("augmentation", folder)
    factory = generator_factory(config.augment, mlm, device=device) if mlm is not None else None  # None: no copies
    replaceable = spec.type.replaceable_words(spec, config.augment.replace_entities)
    shared = factory is not None and several_processes()
    if shared:
        _augment_shared(data["train"], spec.text_columns, factory, config.augment, folder, run_id, replaceable)
    made = {}

    def augment() -> None:  # the main process augments (or, after a shared run, writes the rest); the others read it
        augmented = augment_dataset(data["train"], spec.text_columns, factory, config.augment, folder, run_id,
                                    replaceable=replaceable)
        made["set"] = training_set = with_unlabelled(augmented, config, spec, folder, dev, rank)
        augmented_rows, unlabelled = num_augmented(augmented), len(training_set) - len(augmented)
        processes = {"num_processes": PartialState().num_processes} if shared else {}  # each on its own device
        mark_stage_done(folder, run_id, {"num_rows": len(training_set), "num_augmented": augmented_rows,
                                         "num_unlabelled": unlabelled, "device": str(device), **processes})
        logger.info("augmentation: %d rows (%d augmented, %d unlabelled) from %d examples", len(training_set),
                    augmented_rows, unlabelled, len(data["train"]))

    on_main(folder, run_id, augment)
    if "set" in made:
        return made["set"], run_id
    return with_unlabelled(load_shards(folder), config, spec, folder, dev, rank), run_id


def _augment_shared(dataset: datasets.Dataset, text_columns: tuple[str, ...], factory, config, folder: Path,
                    run_id: str, replaceable) -> None:
    """Under a multi-process launch every process writes its share of the augmented shards, each with its own masked
    LM on its own device (:func:`augment.augment_dataset`'s ``share``; each example draws from its own RNG, so the
    set is the one a single process makes); returns in the main process once every shard is written. A process that
    fails marks it, and the main process stops with its error instead of waiting."""
    processes = PartialState()
    with failure_marked(folder):
        if processes.is_main_process:
            claim_shards(folder, run_id)
        processes.wait_for_everyone()  # no shard is written before a killed run's partial ones are cleared
        augment_dataset(dataset, text_columns, factory, config, folder, run_id, replaceable,
                        share=(processes.process_index, processes.num_processes))
        if processes.is_main_process:
            shards = shard_folders(folder, dataset, text_columns, config)
            wait_for(folder, lambda: True if all(shard.is_dir() for shard in shards) else None)


UNLABELLED = "unlabelled"


def num_augmented(train_data: datasets.Dataset) -> int:
    """Augmented copies in the distillation set (``is_augmented``, rows of unlabelled text left out; 0 for a set that
    was not augmented)."""
    if "is_augmented" not in train_data.column_names:
        return 0
    copies = np.asarray(train_data["is_augmented"], dtype=bool)
    if "source_index" in train_data.column_names:
        copies &= np.asarray(train_data["source_index"]) != -1  # unlabelled sentences are marked augmented too
    return int(np.sum(copies))


def num_unlabelled(train_data: datasets.Dataset) -> int:
    """Rows of unlabelled text in the distillation set (``source_index`` -1)."""
    if "source_index" not in train_data.column_names:
        return 0
    return int(np.sum(np.asarray(train_data["source_index"]) < 0))


def dev_texts(data: datasets.DatasetDict, spec: TaskSpec) -> set[str]:
    """The dev sets' texts, whitespace-normalised (a word list joined by spaces), each also as its words joined by
    spaces (:func:`~distill.tasks.words.joined_words`): unlabelled text must not hold them, or the student would be
    fitted to the teacher's outputs on the examples it is scored on (:func:`~distill.job.corpus.sample_lines`
    compares a line in both forms, so a tweet tokenised in the dev file matches its untokenised copy)."""
    from distill.tasks.words import joined_words

    texts = set()
    for split in spec.dev_splits:
        for column in spec.text_columns:
            for value in data[split][column]:
                text = " ".join(value) if isinstance(value, list) else " ".join(str(value).split())
                texts.update((text, joined_words(text)))
    return texts


def with_unlabelled(augmented: datasets.Dataset, config: PipelineConfig, spec: TaskSpec, folder: Path,
                    exclude: set[str] = frozenset(), rank=None) -> datasets.Dataset:
    """The augmented set and, with ``augment.unlabelled``, sentences of that text drawn at random
    (:func:`distill.job.corpus.sample_lines`, seeded by ``augment.seed``; none of ``exclude``, the dev texts) to fill the
    room ``augment.max_rows`` leaves, or, with ``augment.unlabelled_ranked`` r, up to room / r of them drawn and
    the r share of those that ``rank`` (rows -> (N,) scores: :func:`teacher_ranks`) scores highest, in the order
    drawn: the room when the text holds room / r sentences or more, fewer rows when it holds fewer (the shipped
    transfer set's 50,000 at r 0.33: about 16,500 rows, all of it scored):
    rows of the task's columns (:meth:`~distill.tasks.TaskType.unlabelled_rows`) with ``source_index`` -1, a
    placeholder label, and the teacher's logits as their only target (a transfer set, as in Hinton et al., 2015,
    §2). Written once to ``<folder>/unlabelled`` by a write-then-rename, read back on a rerun."""
    if not config.augment.unlabelled:
        return augmented
    path = folder / UNLABELLED
    if not path.is_dir():
        for leftover in folder.glob(".tmp-*"):  # a write killed before its rename
            shutil.rmtree(leftover, ignore_errors=True)
        room = max(0, config.augment.max_rows - len(augmented))
        ranked = config.augment.unlabelled_ranked
        drawn = room if ranked is None else math.ceil(round(room / ranked, 6))
        texts = sample_lines(config.augment.unlabelled, drawn, seed=config.augment.seed, exclude=exclude)
        if not texts:
            logger.warning("augment.unlabelled: no room left (augment.max_rows %d, %d rows augmented) or no line of "
                           "three words or more in the text; the set has no unlabelled rows", config.augment.max_rows,
                           len(augmented))
            return augmented
        columns = spec.type.unlabelled_rows(spec, texts)
        if ranked is not None:
            if rank is None:
                raise ValueError("augment.unlabelled_ranked needs rank, the teacher's scores of the drawn rows")
            scores = rank(columns)
            keep = min(room, math.ceil(round(ranked * len(texts), 6)))  # round: 0.07 * 100 is 7.000000000000001
            kept = np.sort(np.argsort(-scores, kind="stable")[:keep])
            logger.info("augment.unlabelled_ranked %g: the teacher kept %d of %d sentences drawn (mean score %.3f, "
                        "%.3f over all drawn)", ranked, keep, len(texts), scores[kept].mean(), scores.mean())
            texts = [texts[i] for i in kept]
            columns = {name: [values[i] for i in kept] for name, values in columns.items()}
        columns.update(source_index=[-1] * len(texts), is_augmented=[True] * len(texts))
        rows = datasets.Dataset.from_dict({name: columns.get(name, [None] * len(texts)) for name in augmented.features},
                                          features=augmented.features)
        save_dataset(rows, path)
        logger.info("augment.unlabelled: %d sentences in the room of %d rows augment.max_rows %d leaves", len(texts),
                    room, config.augment.max_rows)
    return datasets.concatenate_datasets([augmented, datasets.load_from_disk(str(path))])


def teacher_ranks(teacher_dir: Path, spec: TaskSpec, max_seq_length: int, columns: dict[str, list], *,
                  device: torch.device) -> np.ndarray:
    """The task type's transfer scores (:meth:`~distill.tasks.TaskType.transfer_scores`) of unlabelled rows
    ({column: N values}, as :meth:`~distill.tasks.TaskType.unlabelled_rows` makes them), by the fine-tuned teacher in
    ``teacher_dir`` on ``device``: (N,) float64, higher first."""
    tokenizer = load_tokenizer(str(teacher_dir))
    teacher = load_teacher(str(teacher_dir), spec).to(device)
    rows = tokenize(datasets.Dataset.from_dict(columns), tokenizer, spec, max_seq_length)
    logger.info("augment.unlabelled_ranked: the teacher scores %d sentences", len(rows))
    logits = predict(teacher, rows, tokenizer, task_type=spec.type, device=device, batch_size=128)
    scores = spec.type.transfer_scores(spec, logits, rows["labels"])
    if scores is None:
        raise ConfigError(f"augment.unlabelled_ranked: a {spec.type.description} has no transfer score; drop it")
    return np.asarray(scores, dtype=np.float64)


def makes_no_copy(config: PipelineConfig) -> bool | None:
    """Whether augmentation will make no copy of any training example (so no masked LM is adapted), as
    :func:`augment_stage` decides it from the training set; None when the data cannot be read here (the hub's)."""
    key = json.dumps({"task": to_dict(config.task), "augment": to_dict(config.augment)}, sort_keys=True)
    if key not in _NO_COPY:
        try:
            spec = task_spec(config.task)
            if spec.hub is not None and data_source_kind(config.task, spec) == "hub":
                raise OSError("hub data")
            train = load_task_data_with_source(config.task, spec)[0]["train"]
        except (OSError, ValueError):
            _NO_COPY[key] = None
        else:
            _NO_COPY[key] = not makes_copies(config, spec, train)
    return _NO_COPY[key]


def makes_copies(config: PipelineConfig, spec: TaskSpec, train: datasets.Dataset) -> bool:
    """Whether augmentation makes any copy of ``train``'s examples: ``augment.num_copies`` above 0, room for copies
    under ``augment.max_rows`` and ``max_examples`` (:func:`augment.examples_to_augment`), and the first example's
    masked-LM work within ``augment.max_mlm_words``."""
    copies = config.augment.num_copies > 0 and examples_to_augment(
        len(train), dataclasses.replace(config.augment, max_mlm_words=None)) > 0
    if copies and config.augment.max_mlm_words is not None:  # the first example's masked-LM work alone exceeds it
        copies = masked_lm_words(train[0], spec.text_columns, config.augment.mlm_context) <= \
            config.augment.max_mlm_words
    return copies


_NO_COPY: dict[str, bool | None] = {}  # per task and augmentation settings: read once per process
