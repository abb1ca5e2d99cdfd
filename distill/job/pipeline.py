"""The main job: teacher → masked LM → augmentation → task distillation (intermediate, prediction) → report.

Every stage writes its own folder under ``output_dir`` and a ``stage.json`` marker when it is complete; a complete
stage is skipped on re-run, an interrupted one resumes from its last checkpoint or shard. Each stage's run id is
derived from the config fields it declares and its inputs' run ids (:mod:`distill.job.stages`), and its code reads the
config through a view that allows those fields only. A folder holding the output of another run id (the config of
that stage, or of a stage before it, changed) is moved to ``superseded/`` and the stage is run again; stages whose
run id did not change are reused.

Layout: ``teacher/`` (HF checkpoint), ``mlm/`` (HF masked LM), ``augmented/`` (dataset shards),
``teacher_logits/`` (cached teacher logits), ``student_intermediate/`` (after the intermediate step, plus
``projections.safetensors``), ``student/`` (final HF checkpoint), ``report.json``, ``report.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import logging
import math
import shutil
from datetime import datetime
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pyarrow
import torch
from safetensors.torch import load_file
from accelerate import PartialState
from transformers import set_seed

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
from distill.publish.card import (describe_init, latency_note, public_name, push_to_hub, recipe_lines,
                                  student_card)
from distill.method.checkpoint import (
    STAGE_FILE,
    finished_or_superseded,
    mark_stage_done,
    mark_stage_started,
    output_lock,
    stage_status,
    write_json_atomic,
)
from distill.config import (
    ConfigError,
    PipelineConfig,
    TrainConfig,
    fingerprint,
    to_dict,
    with_absolute_paths,
    with_overrides,
)
from distill.job.corpus import sample_lines
from distill.tasks.base import DataError, TaskSpec, TaskType
from distill.tasks.data import ASSETS, DataSource, collator, load_task_data_with_source, task_spec, tokenize
from distill.device import is_accelerator, run_device
from distill.tasks.evaluate import evaluate_task, predict
from distill.tasks.split import REPORT, half_key
from distill.publish.export import export_student
from distill.job.general import (
    PROJECTIONS_FILE,
    cache_folder,
    exclusive,
    general_config,
    general_run_id,
    run_general_distillation,
    save_projections,
)
from distill.method.layer_map import build_layer_map
from distill.method.objective import DistillationObjective, intermediate_terms, prediction_terms
from distill.job.preflight import prepare, preflight
from distill.job.pruned import init_projections, kept_channels, pruned_stage, stage_config, stage_shapes, stage_source
from distill.method.processes import (failure_marked, is_main_process, on_main, recorded, several_processes,
                                   wait_for)
from distill.publish.report import (
    build_report,
    count_parameters,
    size_mb,
    stage_seconds,
    stored_timing,
    time_models,
    timing_key,
    write_report,
)
from distill.job.stages import STAGES, ConfigView
from distill.tasks import record_serving, record_tuned
from distill.method.teacher_cache import (CacheLayout, TeacherCache, build_teacher_cache, cached_logits, storage_dtype,
                                          with_cache_index)
from distill.method.terms import teacher_reads
from distill.method.trainer import train
from students import build_student, student_shape
from teachers import (
    adapt_mlm,
    check_same_vocabulary,
    check_teacher_quality,
    finetune_teacher,
    load_teacher,
    load_tokenizer,
)
from teachers.finetune import chance, dev_labels
from teachers.models import load_config as load_model_config

logger = logging.getLogger(__name__)


def _banner(name: str, folder: Path) -> None:
    logger.info("=== stage: %s -> %s", name, folder)


def _start(name: str, folder: Path) -> None:
    """A stage with a ``stage.json`` begins to run: log it and note the time (its record gets ``seconds``)."""
    _banner(name, folder)
    mark_stage_started(folder)


def open_stage(name: str, config: PipelineConfig, folder: Path, inputs: dict[str, str] | None = None
               ) -> tuple[str, ConfigView, dict | None]:
    """A stage's run id (from the fields it declares and its inputs' run ids), the config as it may read it, and its
    record when it is finished under that run id (None: run it; a folder of another run id was moved aside)."""
    spec = STAGES[name]
    run_id = spec.run_id(config, inputs or {})
    return run_id, spec.view(config), finished_or_superseded(folder, run_id)


def teacher_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, out: Path, *,
                  device: torch.device) -> dict:
    """Fine-tune a teacher from ``teacher.base_model``, or take the given fine-tuned ``teacher.model``; on
    ``device``."""
    folder = out / "teacher"
    run_id, config, record = open_stage("teacher", config, folder)
    if record is not None:
        logger.info("teacher: done (dev %s), skipping", record["dev"])
        return record
    _start("teacher", folder)
    if config.teacher.model is None:
        return finetune_teacher(config.teacher, config.task, spec, data, folder, run_id, device=device)

    def take_given_teacher() -> None:  # one process evaluates and saves it; the others read its record
        teacher = load_teacher(config.teacher.model, spec, config.teacher.remap_labels).to(device)
        tokenizer = load_tokenizer(config.teacher.model)
        metrics = evaluate_task(teacher, data, tokenizer, spec, config.task.max_seq_length, device=device)
        check_teacher_quality(metrics, spec, config.teacher.min_dev_metric, config.teacher.model,
                              dev_labels(data, spec))
        record_serving(teacher, spec, config.task.max_seq_length)
        record_tuned(teacher, spec, metrics)
        teacher.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        spec.type.finish_folder(spec, teacher, folder, config.task.max_seq_length)  # e.g. sentence-transformers files
        mark_stage_done(folder, run_id, {"dev": metrics, "source": config.teacher.model, "device": str(device)})

    return on_main(folder, run_id, take_given_teacher)


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


def mlm_stage(config: PipelineConfig, out: Path, *, device: torch.device) -> tuple[str, str]:
    """The masked LM for augmentation: the configured one, or one adapted here. Returns (name or folder, run id)."""
    if config.mlm.model is not None:
        return config.mlm.model, mlm_run_id(config)  # mlm.model itself is read by the augmentation stage
    folder = out / "mlm"
    run_id, config, record = open_stage("mlm", config, folder)
    if record is None:
        _start("adapt-mlm", folder)
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
    mlm = mlm_stage(whole, out, device=device)[0] if copies else None
    _start("augmentation", folder)
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


def _recipe(config: PipelineConfig, spec: TaskSpec, teacher_record: dict, general: dict, step1: dict,
            train_data: datasets.Dataset, step2: dict) -> list[str]:
    """The card's recipe lines (:func:`distill.publish.card.recipe_lines`) with the counts read from the distillation set."""
    return recipe_lines(config, teacher_record, general, step1, len(train_data), step2,
                        num_unlabelled=num_unlabelled(train_data), num_augmented=num_augmented(train_data),
                        temperature=spec.type.uses_temperature(spec))


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


def general_stage(config: PipelineConfig, out: Path, *, device: torch.device) -> dict:
    """General distillation for this job's teacher encoder and student shape (TinyBERT §3.4), made once in the cache
    (:func:`distill.job.general.cache_folder`) and reused by every task and output folder; the intermediate step starts
    its student from it. Skipped when ``general.enabled`` is false or ``student.model`` names a start.

    Returns:
        {"run_id", "folder"} of the general-distilled student; "none" and no folder when skipped. Written to
        ``<out>/general.json``.
    """
    if not config.general.enabled or config.student.model is not None:
        if is_main_process():
            write_json_atomic(out / "general.json", {"run_id": "none", "folder": None})
        return {"run_id": "none", "folder": None}
    general = general_config(config)
    run_id, _ = general_run_id(general)
    folder = cache_folder(general, run_id)
    processes = PartialState()
    with exclusive(folder):  # the job's other processes go on once its main process holds the lock
        if processes.is_main_process and finished_or_superseded(folder, run_id) is None:
            _banner("general distillation (cached for reuse)", folder)
        processes.wait_for_everyone()
        record = run_general_distillation(general, folder, device=device)
    reference = {"run_id": record["run_id"], "folder": str(folder), "teacher": general.teacher,
                 "corpus": general.corpus, "steps": record["steps"], "seconds": record["seconds"],
                 "resumed": bool(record.get("resumed", False))}
    if is_main_process():  # the others' seconds are their own wall time
        write_json_atomic(out / "general.json", reference)
    return reference


def _student(config: ConfigView, spec: TaskSpec, teacher, teacher_tokenizer, layer_map: list[int] | None,
             start: str | None = None):
    """A new student of ``config.student``'s shape (its layers cut from teacher layers ``layer_map`` with init
    "teacher"), or one started from a checkpoint (``student.model``, or the general-distilled ``start``) with the
    teacher's labels and a new head; either way with the head config of the task's type
    (:meth:`~distill.tasks.TaskType.head_config`: a ``problem_type`` where it gives one, so that ``pipeline()``
    applies the right output function)."""
    start = config.student.model or start
    head = spec.type.head_config(spec)
    if start is None:
        student = build_student(teacher, config.student, layer_map)
        if "problem_type" in head:
            student.config.problem_type = head["problem_type"]
        return student
    check_same_vocabulary(teacher_tokenizer, load_tokenizer(start), start)
    return spec.type.model_class(spec).from_pretrained(
        start, **{**head, "id2label": teacher.config.id2label, "label2id": teacher.config.label2id})


def load_projections(objective: DistillationObjective, folder: Path) -> bool:
    """Start the objective's projections from those learnt with the student (general distillation), when the
    folder has them and they fit; returns whether they were loaded."""
    path = folder / PROJECTIONS_FILE
    projections = objective.trainable["projections"]
    if not path.is_file() or not len(projections):
        return False
    saved = load_file(path)
    current = projections.state_dict()
    if saved.keys() != current.keys() or any(saved[k].shape != current[k].shape for k in saved):
        logger.warning("projections in %s (%s) do not fit this objective (%s); new ones are trained", path,
                       sorted(saved), sorted(current))
        return False
    projections.load_state_dict(saved)
    logger.info("projections loaded from %s", path)
    return True


def _student_layers(config: ConfigView, teacher_config, start: str | None = None) -> int:
    """The student's depth: that of the checkpoint it starts from (``student.model``, or the general-distilled
    ``start``), else of its configured shape (a relative preset read against ``teacher_config``)."""
    if (checkpoint := config.student.model or start) is not None:
        return load_model_config(checkpoint).num_hidden_layers
    return student_shape(config.student, teacher_config)["num_hidden_layers"]


def teacher_cache_folder(student_dir: Path, out: Path, cache_id: str) -> Path:
    """Where the teacher-output cache of the student whose steps go to ``student_dir`` lives.

    ``teacher_outputs/`` beside the steps, except for a sweep's student (``out/students/<name>``): there it is
    ``out/teacher_outputs-<cache_id>``, one folder for every student of the sweep whose cache has that run id (the run
    id names the teacher layers read and the data, not the student's width, so the students of one depth share it and
    a further width costs only its own pruning and steps). A sweep student that already holds a cache in its own
    ``teacher_outputs/`` (a sweep run before the cache was shared) keeps reading it there."""
    own = student_dir / "teacher_outputs"
    if student_dir.parent != out / "students" or own.is_dir():
        return own
    return out / f"teacher_outputs-{cache_id}"


def teacher_outputs_run_id(config: PipelineConfig, teacher_id: str, data_id: str, terms, layer_map: list[int]) -> str:
    """The teacher-output cache's run id: the teacher, the training set, ``task.max_seq_length``, the storage dtype
    and the teacher buffers the intermediate terms read with ``layer_map``."""
    reads = sorted(teacher_reads(terms, layer_map))
    return fingerprint(STAGES["teacher_outputs"].run_id(config, {"teacher": teacher_id, "augmented": data_id}),
                       [list(read) for read in reads])


def _distill_step(
    name: str, config: ConfigView, spec: TaskSpec, teacher, student, tokenizer, train_set: datasets.Dataset,
    terms: dict[str, float], train_config: TrainConfig, folder: Path, run_id: str, device: torch.device,
    layer_map: list[int], start: str | None = None, teacher_cache: tuple[Path, str] | None = None,
) -> DistillationObjective:
    """One run of the loop with a :class:`DistillationObjective` (under a multi-process launch, every process's share
    of it); the caller saves the student (:func:`_save_student`).

    With ``teacher_cache`` (its folder and run id; intermediate step), the teacher's outputs are computed once into
    that folder (or found there) and every batch reads them from it (:mod:`distill.method.teacher_cache`). The step's wall
    time starts after the cache (timed in its own folder)."""
    if name == "intermediate":
        settings = {"share_projection": config.distill.share_projection,
                    "relation_heads": config.distill.relation_heads, "hidden_loss": config.distill.hidden_loss}
    else:
        settings = {"temperature": config.distill.temperature,
                    "temperature_squared": config.distill.temperature_squared,
                    "hard_label_weight": config.distill.hard_label_weight}
    objective = DistillationObjective(teacher, student, terms, layer_map, head=spec.type.prediction_head(spec),
                                      **settings)
    start = config.student.model or start if name == "intermediate" else None
    if start is not None and not load_projections(objective, Path(start)) \
            and (channels := kept_channels(start)) is not None and len(objective.trainable["projections"]):
        init_projections(objective.trainable["projections"], channels)  # a pruned student: W selects its channels
        logger.info("projections start as the selection of the %d teacher channels the pruned student kept",
                    len(channels))
    collate = collator(tokenizer, spec)
    if teacher_cache is not None:
        cache_dir, cache_id = teacher_cache
        if spec.type.input_dims != ("batch", "sequence"):  # the cache stores each example's (T_i, ...) buffers
            raise ConfigError(f"distill.teacher_cache: the teacher-output cache holds (batch, sequence) inputs, and a "
                              f"{spec.type.description}'s are {spec.type.input_dims}; set distill.teacher_cache: null")
        layout = CacheLayout.of(objective.teacher_reads, teacher.config)
        on_main(cache_dir, cache_id, lambda: build_teacher_cache(  # one process builds it; the others read it
            objective.teacher.to(device), train_set, collate, layout, cache_dir, cache_id,
            storage_dtype(config.distill.teacher_cache), device=device, batch_size=train_config.batch_size,
            logits=spec.type.logits, per_token=spec.type.per_token))  # the prediction step's logits, same pass
        cache = TeacherCache(cache_dir)
        if len(cache) != len(train_set):
            raise RuntimeError(f"the teacher-output cache in {cache_dir} has {len(cache)} rows, the data "
                               f"{len(train_set)}; delete the folder to rebuild it")
        collate = cache.collator(collate)
        train_set = with_cache_index(train_set)
    if name == "intermediate":
        mark_stage_started(folder)
    lengths = spec.type.example_lengths(train_set) if train_config.group_by_length else None
    train(objective, train_set, collate, train_config, folder, run_id, f"distill ({name} step)", device=device,
          lengths=lengths)
    return objective


def _ship_tuned(folder: Path, model, spec: TaskSpec, metrics: dict) -> dict:
    """Save the settings the model's type chose on the dev set's tuning half (a multi-label decision threshold) in
    ``folder/config.json`` beside its weights (:func:`distill.tasks.record_tuned`); returns {"tuned": settings} for
    its stage record, {} when none."""
    tuned = record_tuned(model, spec, metrics)
    if tuned:
        model.config.save_pretrained(folder)
        logger.info("%s: ships with %s, chosen on the dev set's tuning half", folder,
                    ", ".join(f"{name} {value}" for name, value in tuned.items()))
    return {"tuned": tuned} if tuned else {}


def _save_student(folder: Path, student, tokenizer, objective: DistillationObjective | None = None,
                  record: tuple[str, dict] | None = None) -> None:
    """Save a step's student with the tokenizer (and the objective's learnt projections, when given) into ``folder``
    and drop its training checkpoints; then, with ``record`` (run id, results), mark the step done."""
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if objective is not None:
        save_projections(objective, folder)
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    if record is not None:
        mark_stage_done(folder, *record)


def intermediate_step(config: PipelineConfig, spec: TaskSpec, teacher_record: dict, train_set: datasets.Dataset,
                      data_run_id: str, general: dict, out: Path, folder: Path, *, device: torch.device) -> dict:
    """The intermediate step (embedding, hidden and attention losses) into ``folder``, the student starting from the
    general-distilled or the pruned one when there is one (``general``: that start's {"run_id", "folder"}, and for a
    pruned student its "layer_map", the teacher layers it kept; its run id enters this step's as "general", so the
    run ids of jobs without a pruned student are those from before the pruning stage); returns its record."""
    inputs = {"teacher": teacher_record["run_id"], "augmented": data_run_id, "general": general["run_id"]}
    full_config = config
    run_id, config, record = open_stage("student_intermediate", config, folder, inputs)
    if record is not None:
        return record
    _banner("task distillation, intermediate step", folder)
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher"), spec)
    terms = intermediate_terms(config.distill.weights)
    start = config.student.model or general["folder"]
    cut = start is None and config.student.init == "teacher"  # student layers copied from teacher layers
    # The configured map picks the teacher layers a cut student copies also when no layer is matched (logit-only).
    layer_map = (general.get("layer_map") or build_layer_map(
        config.distill.layer_map, teacher.config.num_hidden_layers,
        _student_layers(config, teacher.config, general["folder"])) if terms or cut else None)
    set_seed(config.distill.intermediate.seed)  # student weights and projections are drawn from the global RNG
    student = _student(config, spec, teacher, tokenizer, layer_map, start=general["folder"])
    record = {"copied_layers": layer_map if cut else None, "start": start or config.student.init,
              "device": str(device)}
    if general.get("layer_map"):  # a pruned student: the teacher layers it kept, and how it scored before distilling
        pruned = json.loads((Path(general["folder"]) / "stage.json").read_text(encoding="utf-8"))
        record["pruned"] = {key: pruned.get(key) for key in ("layer_map", "layers", "importance", "num_examples", "dev")}
    if not terms:  # logit-only distillation: the student goes straight to the prediction step
        logger.info("intermediate step skipped: every intermediate loss weight is 0 (logit-only distillation)")
        mark_stage_started(folder)
        return on_main(folder, run_id, lambda: _save_student(
            folder, student, tokenizer, record=(run_id, {"layer_map": None, "skipped": True, "weights": {}, **record})))
    cache = None
    if config.distill.teacher_cache is not None:  # shared by a sweep's students that read the same teacher layers
        cache_id = teacher_outputs_run_id(full_config, teacher_record["run_id"], data_run_id, terms, layer_map)
        cache = (teacher_cache_folder(folder.parent, out, cache_id), cache_id)
        record["teacher_cache"] = cache[1]
    objective = _distill_step("intermediate", config, spec, teacher, student, tokenizer, train_set, terms,
                              config.distill.intermediate, folder, run_id, device, layer_map, start=general["folder"],
                              teacher_cache=cache)
    record_serving(student, spec, config.task.max_seq_length)
    return on_main(folder, run_id, lambda: _save_student(  # one process saves it; the others then read its record
        folder, student, tokenizer, objective, record=(run_id, {"layer_map": [0, *layer_map], "weights": terms,
                                                                **record})))


def prediction_step(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, teacher_record: dict,
                    train_set: datasets.Dataset, data_run_id: str, step1: dict, out: Path, folder: Path, *,
                    device: torch.device) -> dict:
    """The prediction step (soft cross-entropy on cached teacher logits, plus the gold-label term at
    ``distill.hard_label_weight`` when that is above 0) into ``folder``, then the student's dev metrics; returns its
    record, whose ``weights`` are the terms that ran (:func:`distill.method.objective.prediction_terms`)."""
    logits_run_id, _, _ = open_stage("teacher_logits", config, out / "teacher_logits",
                                     {"teacher": teacher_record["run_id"], "augmented": data_run_id})
    inputs = {"student_intermediate": step1["run_id"], "teacher_logits": logits_run_id}
    run_id, config, record = open_stage("student", config, folder, inputs)
    if record is not None:
        logger.info("student: done (dev %s), skipping", record["dev"])
        return record
    _banner("task distillation, prediction step", folder)
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher"), spec).to(device)
    # The intermediate step's teacher-output cache, when it had one, holds this teacher's logits on these rows.
    cache = ((teacher_cache_folder(folder.parent, out, step1["teacher_cache"]), step1["teacher_cache"])
             if step1.get("teacher_cache") else None)
    train_set = with_teacher_logits(train_set, teacher, tokenizer, out / "teacher_logits", logits_run_id,
                                    task_type=spec.type, device=device, cache=cache)
    mark_stage_started(folder)  # the step's wall time leaves out the teacher logits, timed in their own folder
    student = spec.type.model_class(spec).from_pretrained(folder.parent / "student_intermediate")
    weight = config.distill.weights.get("prediction", 1.0)
    _distill_step("prediction", config, spec, teacher, student, tokenizer, train_set, {"prediction": weight},
                  config.distill.prediction, folder, run_id, device,
                  list(range(1, student.config.num_hidden_layers + 1)))  # no layer is matched: logits alone

    def finish() -> None:  # one process saves and scores the student; the others then read its record
        record_serving(student, spec, config.task.max_seq_length)  # how it is served as scored (a QA reader's windows)
        _save_student(folder, student, tokenizer)
        spec.type.finish_folder(spec, student, folder, config.task.max_seq_length)  # e.g. sentence-transformers files
        metrics = evaluate_task(student, data, tokenizer, spec, config.task.max_seq_length, device=device)
        logger.info("student dev metrics: %s", metrics)
        tuned = _ship_tuned(folder, student, spec, metrics)
        weights = prediction_terms(config.distill.weights, config.distill.hard_label_weight)
        mark_stage_done(folder, run_id, {"dev": metrics, "weights": weights, "device": str(device), **tuned})

    return on_main(folder, run_id, finish)


def distill_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, teacher_record: dict,
                  train_data: datasets.Dataset, data_run_id: str, out: Path, student_dir: Path | None = None, *,
                  device: torch.device) -> dict:
    """Task distillation (TinyBERT §3.4): intermediate step (embedding, hidden, attention), then prediction step,
    on ``device`` (training, the teacher-logit cache and the student's evaluation).

    The steps write ``student_intermediate/`` and ``student/`` in ``student_dir`` (default ``out``); the teacher
    and the cached teacher logits are read from ``out``, so several students can share them (a sweep)."""
    student_dir = student_dir or out
    tokenizer = load_tokenizer(str(out / "teacher"))
    columns = [*spec.text_columns, "label"]
    train_set = tokenize(train_data.select_columns(columns), tokenizer, spec, config.task.max_seq_length)
    general = general_stage(config, student_dir, device=device)
    source = None
    if config.student.init == "pruned" and config.student.model is None:  # pruning in stages: each distilled in turn
        for number, shape in enumerate(stage_shapes(config.student, load_model_config(str(out / "teacher"))), 1):
            stage_dir, stage = student_dir / "pruning" / f"stage-{number}", stage_config(config, shape)
            pruned = pruned_stage(stage, spec, data, teacher_record, out, stage_dir / "pruned", device=device,
                                  source=source)
            step1 = intermediate_step(stage, spec, teacher_record, train_set, data_run_id, pruned, out,
                                      stage_dir / "student_intermediate", device=device)
            record = prediction_step(stage, spec, data, teacher_record, train_set, data_run_id, step1, out,
                                     stage_dir / "student", device=device)
            logger.info("pruning stage %d (%s): dev %s", number, shape, record["dev"])
            source = stage_source(stage_dir, pruned, record)
    pruned = pruned_stage(config, spec, data, teacher_record, out, student_dir / "pruned", device=device,
                          source=source)
    step1 = intermediate_step(config, spec, teacher_record, train_set, data_run_id,
                              pruned if pruned["folder"] else general, out, student_dir / "student_intermediate",
                              device=device)
    return prediction_step(config, spec, data, teacher_record, train_set, data_run_id, step1, out,
                           student_dir / "student", device=device)


def with_teacher_logits(train_set: datasets.Dataset, teacher, tokenizer, folder: Path, run_id: str, *,
                        task_type: TaskType, device: torch.device,
                        cache: tuple[Path, str] | None = None) -> datasets.Dataset:
    """Add a ``teacher_logits`` column, (C,) per example, or (T_i, C) per example for a model with an output per
    token (no padding stored), computed once on ``device`` (where ``teacher`` is) and cached on disk: the prediction
    step then skips the teacher forward.

    ``cache``: the folder and run id of a teacher-output cache built over these same rows by this same teacher (the
    intermediate step's). When that build kept the logits of its forward pass
    (:func:`distill.method.teacher_cache.cached_logits`) they are taken from it and the teacher does not run again;
    they equal a fresh pass's to float rounding (other batches, other padding: about 1e-7 relative)."""

    def compute() -> None:  # one process computes them; the others then read them
        if finished_or_superseded(folder, run_id) is None:
            _start("teacher logits (cached for the prediction step)", folder)
            logits = cached_logits(*cache) if cache is not None else None
            if logits is not None and len(logits) == len(train_set):
                logger.info("teacher logits: %d rows taken from the teacher-output cache in %s (stored by its forward "
                            "pass)", len(logits), cache[0])
                source = "teacher_outputs"
            else:
                logits = predict(teacher, train_set, tokenizer, task_type=task_type, device=device, batch_size=128)
                source = "teacher"
            value = datasets.Value("float32")  # the logits' own dtype: the same numbers in half the space of float64
            feature = datasets.Sequence(datasets.Sequence(value) if isinstance(logits, list) else value)
            datasets.Dataset(pyarrow.table({"teacher_logits": logit_rows(logits)})).cast(
                datasets.Features({"teacher_logits": feature})).save_to_disk(str(folder / "data"))
            mark_stage_done(folder, run_id, {"num_rows": len(logits), "device": str(device), "source": source})

    on_main(folder, run_id, compute)
    cached = datasets.load_from_disk(str(folder / "data"))
    if len(cached) != len(train_set):
        raise RuntimeError(f"cached teacher logits in {folder} have {len(cached)} rows, the data {len(train_set)}")
    # side by side, Arrow to Arrow (the column never becomes Python lists)
    return datasets.concatenate_datasets([train_set.flatten_indices() if train_set._indices is not None
                                          else train_set, cached], axis=1)


def logit_rows(logits: np.ndarray | list[np.ndarray]) -> pyarrow.ListArray:
    """Logits as an Arrow list column, built from the arrays' memory without Python floats: (N, C) -> N lists of C;
    N arrays (T_i, C) -> N lists of T_i lists of C (a QA set's 88,000 features of 256 x 2 are 45M floats, which as
    Python lists take gigabytes)."""
    if not isinstance(logits, list):
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        count, width = logits.shape
        return pyarrow.ListArray.from_arrays(np.arange(0, count * width + 1, width, dtype=np.int32),
                                             pyarrow.array(logits.reshape(-1)))
    lengths = np.asarray([len(row) for row in logits], dtype=np.int64)
    width = logits[0].shape[-1] if logits else 0
    if int(lengths.sum()) * max(width, 1) >= 2**31 or any(row.ndim != 2 or row.shape[-1] != width for row in logits):
        raise ValueError("logit_rows: per-token logits must be (T_i, C) arrays of one C, fewer than 2^31 values in all")
    values = np.concatenate([np.asarray(row, dtype=np.float32).reshape(-1) for row in logits]) if logits else \
        np.zeros(0, dtype=np.float32)
    tokens = pyarrow.ListArray.from_arrays(np.arange(0, len(values) + 1, max(width, 1), dtype=np.int32),
                                           pyarrow.array(values))
    return pyarrow.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32), tokens)


def stages_used(config: PipelineConfig) -> list[str]:
    """The stage folders a job with this config runs or reuses (for its report's stage times)."""
    mlm = config.mlm.model is None and config.augment.num_copies > 0
    augment = ["mlm"] * mlm + ["augmented"] if config.augment.enabled else []
    cache = ["teacher_outputs"] if config.distill.teacher_cache is not None else []
    pruned = ["pruned"] if config.student.init == "pruned" and config.student.model is None else []
    pruned = ["pruning"] * bool(pruned and config.student.pruning.stages) + pruned
    return ["teacher", *augment, "general", *pruned, *cache, "student_intermediate", "teacher_logits", "student"]


def report_stage(config: PipelineConfig, spec: TaskSpec, teacher_record: dict, student_record: dict, out: Path, *,
                 device: torch.device, chance: dict | None = None, run: dict | None = None, write: bool = True) -> dict:
    """Time teacher and student interleaved on the CPU (and on ``device`` too when it is an accelerator) and write
    ``report.json`` / ``report.md``.

    A re-run whose models (the teacher and student stages' run ids) and timing setup are those ``report.json`` was
    timed with reuses that timing (:func:`distill.publish.report.timing_key`), so the same models do not get new latency
    numbers on every run; the report says when they were timed. ``chance`` (:func:`teachers.finetune.chance`) flags
    a model at chance; ``run`` (task, data, config) heads report.md (see :func:`distill.publish.report.build_report`).
    ``write=False``: build the report without writing it (a multi-process job's other processes, which reuse the
    timing its main process wrote)."""
    _banner("report", out)
    accelerator = device.type if is_accelerator(device) else None
    key = timing_key({"teacher": teacher_record["run_id"], "student": student_record["run_id"]}, config.report,
                     accelerator)
    models, entries = {}, {}
    for name, record in (("teacher", teacher_record), ("student", student_record)):
        folder = out / name
        model = spec.type.model_class(spec).from_pretrained(folder).eval()
        models[name] = model
        entries[name] = {"dev": record["dev"], "size_mb": size_mb(folder), "path": name, **count_parameters(model),
                         **({"selection": record["selection"]} if "selection" in record else {})}
    stored = stored_timing(out, key)
    if stored is not None:
        timed_at = stored["teacher"].pop("timed_at")
        stored["student"].pop("timed_at")
        logger.info("report: these models were timed %s with the same settings; that timing is reused (delete "
                    "report.json to time again)", timed_at)
        timings, timed = [stored], {"key": key, "timed_at": timed_at, "reused": True}
    else:
        timed = {"key": key, "timed_at": datetime.now().astimezone().isoformat(timespec="seconds"), "reused": False}
        timings = [time_models(models, config.report, task_type=spec.type)]
        if accelerator:
            timings.append(time_models(models, config.report, device, prefix=f"{device.type}_", task_type=spec.type))
    for timing in timings:
        for name, values in timing.items():
            entries[name]["latency_ms"] = {**entries[name].get("latency_ms", {}), **values.pop("latency_ms")}
            entries[name].update(values)
    report = build_report(entries, config.report, accelerator=accelerator,
                          stages=stage_seconds(out, stages_used(config), len(config.student.pruning.stages)),
                          chance=chance, run=run, timed=timed,
                          sections=spec.type.report_sections(spec, {name: e["dev"] for name, e in entries.items()}))
    if write:
        write_report(report, out)
    return report


def run_record(spec: TaskSpec, source: DataSource, out: Path) -> dict:
    """What a run used, for its report and card: the task, the data (:class:`distill.tasks.data.DataSource` with its
    description) and the config file."""
    return {"task": spec.name, "data": source.public(), "config": f"{out.name}/config.json"}


def publish_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, out: Path, report: dict,
                  recipe: list[str], command: str) -> None:
    """What ships with the student: ONNX files checked on the dev set (``export.onnx``), the model card
    (``student/README.md``) and, with ``export.push_to_hub``, the upload."""
    folder = out / "student"
    export = (export_student(folder, spec, data["dev"], config.task.max_seq_length, config.export.int8)
              if config.export.onnx else None)
    rows = []
    for name, entry in report["models"].items():
        label = (f"teacher (`{public_name(config.teacher.model or config.teacher.base_model)}`, fine-tuned)"
                 if name == "teacher" else "student")
        rows.append({"name": label, "dev": entry["dev"], "num_parameters": entry["num_parameters"],
                     "size_mb": entry["size_mb"], "faster_by": entry["ratios"]["faster_by"],
                     "faster_by_range": entry["ratios"].get("faster_by_range"),
                     "retained": entry["ratios"]["metric_retained"], "latency_ms": entry["latency_ms"]})
    card = student_card(name=f"{Path(config.output_dir).name}-student", spec=spec,
                        teacher=config.teacher.model or config.teacher.base_model, rows=rows, recipe=recipe,
                        command=command, export=export, license=config.export.license,
                        data=(report.get("run") or {}).get("data"), chance=report.get("chance"),
                        latency_note=latency_note(report["timing"]))
    card.save(folder / "README.md")
    if config.export.push_to_hub:
        push_to_hub(folder, config.export.push_to_hub)


def _teacher_and_data(config: PipelineConfig, device: torch.device) -> tuple:
    """The stages every student of a run shares: config record, task data, teacher, augmented training set.

    Returns:
        (output folder, task spec, task data, its :class:`~distill.tasks.data.DataSource`, teacher stage record,
        training set, its run id).
    """
    out = Path(config.output_dir)
    spec = task_spec(config.task)
    data, source = load_task_data_with_source(config.task, spec)
    # Written once the config and the data are known to be good: a run refused before here leaves a finished
    # folder's record of its config as it was.
    if is_main_process():
        write_json_atomic(out / "config.json", to_dict(with_absolute_paths(config)))  # read from any folder
    teacher_record = teacher_stage(config, spec, data, out, device=device)
    train_data, data_run_id = augment_stage(config, spec, data, out, teacher_record, device=device)
    return out, spec, data, source, teacher_record, train_data, data_run_id


def run_sweep(config: PipelineConfig, device: torch.device | None = None) -> dict | None:
    """Several students distilled from one teacher and one augmented set, then benchmarked together.

    The teacher, masked LM, augmentation and teacher logits are made once in ``output_dir`` (as the pipeline does);
    each entry of ``config.sweep`` gets ``students/<name>/`` with its two steps; the benchmark over the teacher, every
    student and ``benchmark.students`` goes to ``benchmark/``. Every stage resumes and is skipped when done. Every
    stage runs on ``device`` (None: :func:`distill.device.run_device`).

    Returns:
        The benchmark report; None in the other processes of a multi-process launch (the main process alone
        benchmarks the students, after every process has trained them).

    Raises:
        FolderInUseError: another process is running a job in ``output_dir``. DataError: a ``benchmark.students``
            folder that does not exist (checked before any stage runs).
    """
    from distill.publish.benchmark import resolve_model_folder

    if not config.sweep:
        raise ConfigError("sweep: the config lists no students; add a `sweep:` list (see configs/sweep_sst2.yaml)")
    device = device if device is not None else run_device()
    config = for_device(prepare(config), device)
    entries = sweep_entries(config)
    for entry_config in entries.values():
        preflight(entry_config)
    for extra in config.benchmark.students:  # a wrong path is an error now, not after every student has trained
        try:
            resolve_model_folder(Path(extra), "student")
        except FileNotFoundError as error:
            raise DataError(f"benchmark.students: {error}") from None
    with output_lock(Path(config.output_dir)):
        return _sweep(config, entries, device)


def sweep_entries(config: PipelineConfig) -> dict[str, PipelineConfig]:
    """Each ``sweep:`` entry's job by name: ``config`` with the entry's student and, when it names one, its layer map."""
    entries = {}
    for entry in config.sweep:
        distill = dataclasses.replace(config.distill, layer_map=entry.layer_map or config.distill.layer_map)
        entries[entry.name] = dataclasses.replace(config, student=entry.student, distill=distill)
    return entries


def _sweep(config: PipelineConfig, entries: dict[str, PipelineConfig], device: torch.device,
           benchmark_dir: Path | None = None) -> dict | None:
    from distill.publish.benchmark import resolve_model_folder, run_benchmark, unique_name

    out, spec, data, source, teacher_record, train_data, data_run_id = _teacher_and_data(config, device)
    students = {}
    for name, student_config in entries.items():
        _banner(f"sweep student {name}", out / "students" / name)
        record = distill_stage(student_config, spec, data, teacher_record, train_data, data_run_id, out,
                               student_dir=out / "students" / name, device=device)
        logger.info("sweep student %s: dev %s", name, record["dev"])
        students[name] = (out / "students" / name / "student",
                          describe_init(student_config.student, student_config.distill.layer_map,
                                        student_config.general.enabled))
    if not is_main_process():  # the main process times the models alone and writes the benchmark and the cards
        return None
    for extra in config.benchmark.students:
        students[unique_name(Path(extra).name, {"teacher", *students})] = resolve_model_folder(Path(extra), "student")
    benchmark_dir = benchmark_dir or out / "benchmark"
    _banner("benchmark", benchmark_dir)
    report = run_benchmark(out / "teacher", students, spec, data["dev"], config.benchmark, benchmark_dir,
                           config.task.max_seq_length, device=device)
    rows = {row["name"]: row for row in report["rows"] if row["variant"] == "pytorch"}
    halves = [half_key(REPORT, name) for name in spec.metrics]
    for name, student_config in entries.items():
        card_rows = [{"name": f"{label} (`{public_name(config.teacher.model or config.teacher.base_model)}`)"
                      if label == "teacher"
                      else name, "dev": {m: rows[label][m] for m in (*spec.metrics, *halves) if m in rows[label]},
                      "num_parameters": rows[label]["num_parameters"], "size_mb": rows[label]["size_mb"],
                      "faster_by": rows[label]["ratios"]["faster_by"], "retained": rows[label]["ratios"]["metric_retained"],
                      "latency_ms": rows[label]["latency_ms"]} for label in ("teacher", name)]
        step1 = json.loads((out / "students" / name / "student_intermediate" / "stage.json").read_text(encoding="utf-8"))
        step2 = json.loads((out / "students" / name / "student" / "stage.json").read_text(encoding="utf-8"))
        general = json.loads((out / "students" / name / "general.json").read_text(encoding="utf-8"))
        recipe = _recipe(student_config, spec, teacher_record, general, step1, train_data, step2)
        student_card(name=f"{Path(config.output_dir).name}-{name}", spec=spec,
                     teacher=config.teacher.model or config.teacher.base_model, rows=card_rows, recipe=recipe,
                     command=f"python run_distill.py sweep --config {public_name(str(out))}/config.json",
                     license=config.export.license, data=run_record(spec, source, out)["data"],
                     chance=chance(spec, dev_labels(data, spec)),
                     latency_note="Latency from the benchmark of the sweep (see benchmark/benchmark.md of the run)."
                     ).save(out / "students" / name / "student" / "README.md")
    return report


def run_pipeline(config: PipelineConfig, device: torch.device | None = None, command: str | None = None) -> dict:
    """Run every stage of the main job (skipping finished ones) and return the report.

    One run at a time per output folder: the folder is locked while the job runs
    (:func:`distill.method.checkpoint.output_lock`).

    Args:
        config: the job.
        device: where every stage computes (None: :func:`distill.device.run_device`, accelerate's choice).
        command: the command line that started it, for the model card (None: the one that reruns the saved config).

    Raises:
        FolderInUseError: another process is running a job in ``output_dir``; and whatever a stage raises
            (ConfigError, DataError, ModelError, ...), finished stages kept.
    """
    device = device if device is not None else run_device()
    config = for_device(prepare(config), device)
    preflight(config)
    logger.info("device: %s", device)
    with output_lock(Path(config.output_dir), command):
        return _pipeline(config, device, command)


def for_device(config: PipelineConfig, device: torch.device) -> PipelineConfig:
    """``config`` with the budget rules that depend on where the job runs resolved, so that run ids and the saved
    config say what runs: on a CPU, ``task.max_train_examples_cpu`` caps ``task.max_train_examples`` and
    ``teacher.max_train_examples_cpu`` stays (the teacher's share of them); on an accelerator both are dropped (the
    whole training set, or ``max_train_examples``, for the teacher and the student alike), and so is the teacher's
    share when ``teacher.model`` names a fine-tuned teacher (nothing is fine-tuned)."""
    cap = config.task.max_train_examples_cpu
    overrides = {}
    if cap is not None:
        limit = config.task.max_train_examples
        if device.type == "cpu":
            limit = cap if limit is None else min(limit, cap)
            logger.info("task.max_train_examples_cpu: the first %d training examples on the CPU", limit)
        overrides.update({"task.max_train_examples": limit, "task.max_train_examples_cpu": None})
    if config.teacher.max_train_examples_cpu is not None:
        if device.type == "cpu" and config.teacher.model is None:
            logger.info("teacher.max_train_examples_cpu: the teacher is fine-tuned on the first %d of them",
                        config.teacher.max_train_examples_cpu)
        else:
            overrides["teacher.max_train_examples_cpu"] = None
    return with_overrides(config, overrides) if overrides else config


def rescored(record: dict, folder: Path, config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict,
             device: torch.device) -> dict:
    """A finished teacher or student stage's record with dev metrics of the current scorer: a record that lacks a
    metric the task names now, or one its type adds to the seeds summary (scored by an older version, e.g. NER before
    ``f1_strict`` stood beside the standard ``f1``, or before the dev set's report half), is scored again from the
    saved model by the main process, and its ``stage.json`` updated (run id and wall time kept; a teacher's
    fine-tuning history, scored the old way, dropped), so the report never compares a teacher and a student scored
    two ways."""
    def missing(found: dict | None) -> list[str]:
        names = (*spec.metrics, *spec.type.summary_metrics, half_key(REPORT, spec.metrics[0]))
        return list(names) if found is None else [name for name in names if name not in found.get("dev", {})]

    stale = missing(record)
    if not stale:
        return record
    if not is_main_process():  # the main process scores it; the others read the record it writes
        return wait_for(folder, lambda: None if missing(found := recorded(folder, record["run_id"])) else found)
    with failure_marked(folder):
        logger.info("%s: its dev metrics predate %s; scoring the saved model again", folder, ", ".join(stale))
        model = spec.type.model_class(spec).from_pretrained(folder).eval().to(device)
        metrics = evaluate_task(model, data, load_tokenizer(str(folder)), spec, config.task.max_seq_length,
                                device=device)
        kept = {key: value for key, value in record.items() if key not in ("dev", "selection")}
        updated = {**kept, "dev": metrics, "rescored": True, **_ship_tuned(folder, model, spec, metrics)}
        write_json_atomic(folder / STAGE_FILE, updated)
    return updated


def _pipeline(config: PipelineConfig, device: torch.device, command: str | None) -> dict:
    out, spec, data, source, teacher_record, train_data, data_run_id = _teacher_and_data(config, device)
    student_record = distill_stage(config, spec, data, teacher_record, train_data, data_run_id, out, device=device)
    teacher_record = rescored(teacher_record, out / "teacher", config, spec, data, device)
    student_record = rescored(student_record, out / "student", config, spec, data, device)
    # Under a multi-process launch the main process times the models and writes the report, the ONNX files and the
    # card; the others then build the same report from the timing it stored (no second timing on shared cores, no
    # two writers of one file).
    processes = PartialState()
    with processes.main_process_first():
        report = report_stage(config, spec, teacher_record, student_record, out, device=device,
                              chance=chance(spec, dev_labels(data, spec)), run=run_record(spec, source, out),
                              write=processes.is_main_process)
    if processes.is_main_process:
        general = json.loads((out / "general.json").read_text(encoding="utf-8"))
        step1 = json.loads((out / "student_intermediate" / "stage.json").read_text(encoding="utf-8"))
        recipe = _recipe(config, spec, teacher_record, general, step1, train_data, student_record)
        publish_stage(config, spec, data, out, report, recipe,
                      command or f"python run_distill.py pipeline --config {out / 'config.json'}")
    processes.wait_for_everyone()
    return report


def plan_pipeline(config: PipelineConfig, student_dir: Path | None = None) -> list[dict]:
    """What :func:`run_pipeline` would do with ``config``, read from the output folder and the cache without changing
    anything (``pipeline --dry-run``). ``student_dir``: where the student's own stages go (default the output folder;
    a sweep's ``students/<name>``), as :func:`distill_stage` takes it.

    Returns:
        One row per stage, in order: ``stage``, ``folder``, ``run_id`` and ``action``: ``reuse`` (finished under this
        run id), ``resume`` (unfinished work of this run id), ``run``, ``replace`` (the folder holds another run's
        output, moved to ``superseded/`` when the job runs) or ``skip``; ``why`` says why a stage is skipped.

    Raises:
        ConfigError, ModelError: what :func:`distill.job.preflight.preflight` refuses before any stage.
    """
    config = for_device(prepare(config), run_device())
    preflight(config)
    out = Path(config.output_dir)
    student_dir = student_dir or out
    rows: list[dict] = []

    def add(stage: str, folder: Path | None, run_id: str | None, why: str | None = None) -> str | None:
        action = ("skip" if why else "run" if folder is None else "unknown" if run_id is None
                  else stage_status(folder, run_id))
        rows.append({"stage": stage, "folder": str(folder) if folder else None, "run_id": run_id, "action": action,
                     **({"why": why} if why else {})})
        return run_id

    teacher_id = add("teacher", out / "teacher", STAGES["teacher"].run_id(config, {}))
    if not config.augment.enabled:
        add("mlm", None, None, "augment.enabled is false")
        add("augmented", None, None, "augment.enabled is false")
        data_id = STAGES["augmented"].run_id(config, {"mlm": "none"})
    else:
        mlm_id = mlm_run_id(config)
        if config.augment.num_copies == 0:
            add("mlm", None, None, "augment.num_copies is 0")
        elif config.mlm.model is not None:
            add("mlm", None, None, "mlm.model is given")
        elif config.augment.max_examples == 0:
            add("mlm", None, None, "augment.max_examples is 0")
        elif config.augment.max_rows is not None and _makes_no_copy(config) is True:
            add("mlm", None, None, f"the training set leaves no room for copies under augment.max_rows "
                                   f"{config.augment.max_rows}")
        else:
            add("mlm", out / "mlm", mlm_id)
            if rows[-1]["action"] != "reuse" and config.augment.max_rows is not None and _makes_no_copy(config) is None:
                rows[-1]["note"] = "not if the training set leaves no room for copies under augment.max_rows"
        data_id = add("augmented", out / "augmented", STAGES["augmented"].run_id(
            config, augmented_inputs(config, teacher_id)))
    if not config.general.enabled or config.student.model is not None:
        general_id = "none"
        add("general", None, None, "student.model is given" if config.general.enabled else "general.enabled is false")
    else:
        general = general_config(config)
        general_id = general_run_id(general)[0]
        add("general", cache_folder(general, general_id), general_id)
    logits_id = STAGES["teacher_logits"].run_id(config, {"teacher": teacher_id, "augmented": data_id})
    if config.student.init == "pruned" and config.student.model is None:
        source_id = None
        teacher_config = _planned_teacher_config(config, out) if config.student.pruning.stages else None
        for number, shape in enumerate(stage_shapes(config.student, teacher_config) if teacher_config else [], 1):
            stage, where = stage_config(config, shape), student_dir / "pruning" / f"stage-{number}"
            pruned_id = STAGES["pruned"].run_id(stage, {"teacher": teacher_id})
            pruned_id = add(f"pruning stage {number}: pruned", where / "pruned",
                            pruned_id if source_id is None else fingerprint(pruned_id, source_id))
            step_id = add(f"pruning stage {number}: student_intermediate", where / "student_intermediate",
                          STAGES["student_intermediate"].run_id(
                              stage, {"teacher": teacher_id, "augmented": data_id, "general": pruned_id}))
            if stage.distill.teacher_cache is not None:  # its run id follows the layers the stage's pruning keeps
                rows[-1]["note"] = f"with its teacher-output cache in {where / 'teacher_outputs'}"
            source_id = add(f"pruning stage {number}: student", where / "student", STAGES["student"].run_id(
                stage, {"student_intermediate": step_id, "teacher_logits": logits_id}))
        pruned_id = STAGES["pruned"].run_id(config, {"teacher": teacher_id})
        general_id = add("pruned", student_dir / "pruned", None if config.student.pruning.stages and teacher_config is None
                         else pruned_id if source_id is None else fingerprint(pruned_id, source_id))
        if general_id is None:
            rows[-1]["note"] = "in stages, whose shapes are read against the teacher's config: not readable yet"
    if config.distill.teacher_cache is not None:
        cache_id = _planned_cache_id(config, out, teacher_id, data_id, student_dir)
        add("teacher_outputs", teacher_cache_folder(student_dir, out, cache_id) if cache_id
            else student_dir / "teacher_outputs", cache_id,
            None if cache_id else "no intermediate term, or the teacher's config cannot be read yet")
    step1_id = add("student_intermediate", student_dir / "student_intermediate", None if general_id is None else
                   STAGES["student_intermediate"].run_id(
                       config, {"teacher": teacher_id, "augmented": data_id, "general": general_id}))
    if step1_id and rows[-1]["action"] == "reuse" and rows[-2]["stage"] == "teacher_outputs" \
            and rows[-2]["action"] != "reuse":
        rows[-2].update(action="skip", why="the intermediate step is finished; its teacher outputs are not needed")
    add("teacher_logits", out / "teacher_logits", logits_id)
    if config.distill.teacher_cache is not None and rows[-1]["action"] in ("run", "resume", "replace") \
            and not rows[-1].get("note"):
        rows[-1]["note"] = "from the teacher-output cache's own forward pass when that kept them"
    add("student", student_dir / "student", None if step1_id is None else STAGES["student"].run_id(
        config, {"student_intermediate": step1_id, "teacher_logits": logits_id}))
    if rows[-1]["action"] == "reuse" and rows[-2]["action"] != "reuse":  # only the prediction step reads the cache
        rows[-2].update(action="skip", why="the student is finished; the teacher logits are not needed")
    add("report", None, None)
    add("export", None, None, None if config.export.onnx else "export.onnx is false")
    return rows


def _makes_no_copy(config: PipelineConfig) -> bool | None:
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


def data_source_kind(task, spec: TaskSpec) -> str:
    """Where ``task.source`` "auto" reads a named task from: "local" (a data folder), "bundled" or "hub"."""
    if task.source != "auto":
        return task.source
    return "local" if task.data_dir else "bundled" if (ASSETS / spec.name).is_dir() else "hub"


def shared_row(row: dict, made_by: dict, key: str, maker: str) -> dict:
    """A dry-run row of a stage that several runs share (one ``key``: its run id or folder): the first row that would
    make it (``run``, ``resume``, ``replace``) is kept and ``maker`` recorded in ``made_by[key]``; a later one becomes
    ``reuse`` with the note ``made by <maker>'s run``. Rows with any other action are returned as they are."""
    if row["action"] not in ("run", "resume", "replace"):
        return row
    if key in made_by:
        return {**row, "action": "reuse", "note": f"made by {made_by[key]}'s run"}
    made_by[key] = maker
    return row


def plan_sweep(config: PipelineConfig) -> list[dict]:
    """What :func:`run_sweep` would do with ``config`` (``sweep --dry-run``), changing nothing: the shared stages
    (teacher, masked LM, augmentation, teacher logits) once, then each entry's own stages in ``students/<name>/``
    (their ``stage`` prefixed with the entry's name), then the benchmark. Rows as :func:`plan_pipeline`'s; the teacher
    logits are skipped only when every student is finished; a teacher-output cache shared by several students
    (:func:`teacher_cache_folder`) is made by the first that needs it and reused by the others.

    Raises:
        ConfigError: no ``sweep:`` list; and what :func:`distill.job.preflight.preflight` refuses for an entry (named).
    """
    if not config.sweep:
        raise ConfigError("sweep: the config lists no students; add a `sweep:` list (see configs/sweep_sst2.yaml)")
    out = Path(config.output_dir)
    shared, logits, students, cache_made_by = [], [], [], {}
    for name, entry_config in sweep_entries(config).items():
        try:
            rows = plan_pipeline(entry_config, student_dir=out / "students" / name)
        except ConfigError as error:
            raise ConfigError(f"sweep entry {name!r}: {error}") from None
        split = next(index for index, row in enumerate(rows) if row["stage"] == "general")
        shared = shared or rows[:split]
        own = [row for row in rows[split:] if row["stage"] not in ("report", "export")]
        logits.append(next(row for row in own if row["stage"] == "teacher_logits"))
        for row in own:
            if row is logits[-1]:
                continue
            if row["stage"] == "teacher_outputs":  # a shared cache: the first student that needs it makes it
                row = shared_row(row, cache_made_by, row["folder"], name)
            students.append({**row, "stage": f"{name}: {row['stage']}"})
    needed = [row for row in logits if row["action"] != "skip"]  # a student still to train reads them
    logits = needed[0] if needed else {**logits[0], "why": "every student is finished; the teacher logits are not "
                                                           "needed"}
    benchmark = {"stage": "benchmark", "folder": str(out / "benchmark"), "run_id": None, "action": "run"}
    return [*shared, logits, *students, benchmark]


def _planned_teacher_config(config: PipelineConfig, out: Path):
    """The teacher's config as the run will read it (the fine-tuned one in ``out/teacher``, else the configured
    model), or None when it cannot be read yet (a hub teacher offline)."""
    teacher = out / "teacher"
    try:
        return load_model_config(str(teacher) if (teacher / "config.json").is_file()
                                 else config.teacher.model or config.teacher.base_model)
    except (OSError, ValueError):  # ModelError is a ValueError
        return None


def _planned_cache_id(config: PipelineConfig, out: Path, teacher_id: str, data_id: str,
                      student_dir: Path) -> str | None:
    """The teacher-output cache's run id as the pipeline will compute it, or None when there is no intermediate term
    or the teacher's config cannot be read (a hub teacher offline, before the teacher stage ran)."""
    terms = intermediate_terms(config.distill.weights)
    if not terms:
        return None
    teacher_config = _planned_teacher_config(config, out)
    if teacher_config is None:
        return None
    try:
        layers = _student_layers(config, teacher_config)
    except (OSError, ValueError):  # ModelError is a ValueError
        return None
    layer_map = build_layer_map(config.distill.layer_map, teacher_config.num_hidden_layers, layers)
    if config.student.init == "pruned" and (config.student.pruning.layers == "importance"
                                            or config.student.pruning.stages):
        pruned = student_dir / "pruned" / "stage.json"  # the layers the pruning stage chose (its stages too), once run
        if not pruned.is_file():
            return None
        layer_map = json.loads(pruned.read_text(encoding="utf-8"))["layer_map"]
    return teacher_outputs_run_id(config, teacher_id, data_id, terms, layer_map)


def data_preview(config: PipelineConfig, num_rows: int = 3) -> str:
    """The task data as the run will read it, for ``pipeline --dry-run``: read in full with the run's own readers
    (file layout, every label, every answer's offset), so that what the run would refuse at reading the dry run
    refuses too; then where it comes from, its columns and labels and its first training rows, as lines. Data from the
    hub is not fetched (the run reads it when it starts).

    Raises:
        DataError: what reading the data raises (the file and its line named).
    """
    spec = task_spec(config.task)
    task = config.task
    if spec.hub is not None:
        source = task.source if task.source != "auto" else (
            "local" if task.data_dir else "bundled" if (ASSETS / spec.name).is_dir() else "hub")
        if source == "hub":
            return f"data: {'/'.join(spec.hub)} from the hub, read when the run starts (not fetched by a dry run)"
    elif not all(Path(name).exists() for name in (task.train_file, task.dev_file)):
        return f"data: {task.train_file}, {task.dev_file} (hub data sets), read when the run starts"
    data, source = load_task_data_with_source(task, spec)
    labels = spec.type.describe_labels(spec)
    lines = [f"data: {source.describe(public=False)}",
             f"{spec.type.description} ({spec.task_type}): columns {', '.join(spec.text_columns)}; labels: {labels}"]
    train = data["train"]
    for index in range(min(num_rows, len(train))):
        lines.append(f"  train {index}: {_preview_row(train[index], spec)}")
    return "\n".join(lines)


def _preview_row(row: dict, spec: TaskSpec, width: int = 60) -> str:
    """One example in a line: each text cut to ``width`` characters, labels by their names."""
    def shown(value):
        if isinstance(value, str):
            return repr(value if len(value) <= width else value[:width] + "...")
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(spec.label_names) \
                and spec.type.labels_are_classes:
            return spec.label_names[value]
        if isinstance(value, list):
            items = [shown(v) for v in value[:12]]
            return "[" + ", ".join(items) + (", ..." if len(value) > 12 else "") + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
        return repr(value)

    return "; ".join(f"{name} {shown(value)}" for name, value in row.items())


def plan_markdown(rows: list[dict], minutes: dict[str, float] | None = None) -> str:
    """:func:`plan_pipeline`'s rows as a plain-text table, one stage a line, with each stage's estimated minutes
    (:func:`plan_minutes`) where given."""
    width = max(22, *(len(row["stage"]) + 2 for row in rows))
    shown = minutes is not None
    lines = [f"{'stage':<{width}}{'action':<9}" + ("min    " if shown else "") + f"{'run id':<18}folder"]
    for row in rows:
        where = row.get("why") and f"({row['why']})" or row["folder"] or ""
        note = f" ({row['note']})" if row.get("note") else ""
        cost = (f"{minutes[row['stage']]:<7.1f}" if row["stage"] in minutes else f"{'-':<7}") if shown else ""
        lines.append(f"{row['stage']:<{width}}{row['action']:<9}{cost}{row['run_id'] or '-':<18}{where}{note}")
    return "\n".join(lines)


def plan_minutes(config: PipelineConfig, rows: list[dict], entries: dict | None = None
                 ) -> tuple[dict[str, float] | None, str]:
    """Each stage's estimated minutes on this machine (:func:`distill.job.estimate.estimate_minutes`) and how they
    were reached, or (None, why not): the data or a model cannot be read here yet (a hub data set or teacher
    offline)."""
    from distill.job.estimate import Clock, estimate_minutes

    if os.environ.get("TINYDISTILL_ESTIMATE", "on").lower() in ("off", "0", "false", "no"):
        return None, "TINYDISTILL_ESTIMATE is off"
    spec = task_spec(config.task)
    if spec.hub is not None and data_source_kind(config.task, spec) == "hub":
        return None, "the data come from the hub when the run starts"
    clock = Clock()
    try:
        data, _ = load_task_data_with_source(config.task, spec)
        minutes = estimate_minutes(config, rows, data, spec, clock, entries)
    except (OSError, ValueError) as error:  # a teacher or masked LM not readable offline (ModelError is one)
        return None, f"{str(error).splitlines()[0]}"
    timed = (f"timed {clock.measured} model shape{'s' if clock.measured != 1 else ''} here"
             if clock.measured else "from the model shapes' timings on this machine")
    if clock.busy and clock.measured:
        timed += (", while other work kept the cores busy: high, and not kept (dry-run again on an idle machine "
                  "for a true estimate)")
    return minutes, f"{timed}; the work counted from the config and the data: steps, rows, masked-LM words"
