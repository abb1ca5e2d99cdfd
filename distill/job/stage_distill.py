"""The student's stages of task distillation (TinyBERT §3.4): the general-distilled start, the intermediate step
(embedding, hidden and attention losses, with the teacher-output cache), the teacher logits and the prediction step,
into ``general.json``, ``student_intermediate/``, ``teacher_outputs/``, ``teacher_logits/`` and ``student/``."""


from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow
import torch
from accelerate import PartialState
from safetensors.torch import load_file
from torch import nn
from transformers import set_seed

from distill.config import (
    ConfigError,
    PipelineConfig,
    TrainConfig,
    fingerprint,
)
from distill.job.general import (
    PROJECTIONS_FILE,
    cache_folder,
    exclusive,
    general_config,
    general_run_id,
    run_general_distillation,
    save_projections,
)
from distill.job.pruned import (
    init_projections,
    kept_channels,
    pruned_stage,
    pruning_skip,
    stage_config,
    stage_shapes,
    stage_source,
)
from distill.job.stages import STAGES, ConfigView, banner, open_stage, start_stage
from distill.method.checkpoint import (
    finished_or_superseded,
    mark_stage_done,
    mark_stage_started,
    write_json_atomic,
)
from distill.method.layer_map import build_layer_map
from distill.method.objective import (
    DistillationObjective,
    intermediate_terms,
    prediction_terms,
)
from distill.method.processes import is_main_process, on_main
from distill.method.teacher_cache import (
    CacheLayout,
    TeacherCache,
    build_teacher_cache,
    cached_logits,
    storage_dtype,
    with_cache_index,
)
from distill.method.terms import teacher_reads
from distill.method.trainer import train
from distill.tasks import record_serving, record_tuned
from distill.tasks.base import TaskSpec, TaskType
from distill.tasks.data import collator
from distill.tasks.evaluate import evaluate_against_teacher, evaluate_task, predict
from students import build_student
from teachers import (
    check_same_vocabulary,
    load_teacher,
    load_tokenizer,
)
from teachers.models import load_config as load_model_config

logger = logging.getLogger(__name__)


def general_skip(config: PipelineConfig) -> str | None:
    """Why the job has no general-distillation stage, or None when it has one: the rule the run and the dry run both
    follow."""
    if not config.general.enabled:
        return "general.enabled is false"
    return "student.model is given" if config.student.model is not None else None


def general_stage(config: PipelineConfig, out: Path, *, device: torch.device) -> dict:
    """General distillation for this job's teacher encoder and student shape (TinyBERT §3.4), made once in the cache
    (:func:`distill.job.general.cache_folder`) and reused by every task and output folder; the intermediate step starts
    its student from it. Skipped when ``general.enabled`` is false or ``student.model`` names a start.

    Returns:
        {"run_id", "folder"} of the general-distilled student; "none" and no folder when skipped. Written to
        ``<out>/general.json``.
    """
    if general_skip(config):
        if is_main_process():
            write_json_atomic(out / "general.json", {"run_id": "none", "folder": None})
        return {"run_id": "none", "folder": None}
    general = general_config(config)
    run_id, _ = general_run_id(general)
    folder = cache_folder(general, run_id)
    processes = PartialState()
    with exclusive(folder):  # the job's other processes go on once its main process holds the lock
        if processes.is_main_process and finished_or_superseded(folder, run_id) is None:
            banner("general distillation (cached for reuse)", folder)
        processes.wait_for_everyone()
        record = run_general_distillation(general, folder, device=device)
    reference = {"run_id": record["run_id"], "folder": str(folder), "teacher": general.teacher,
                 "corpus": general.corpus, "steps": record["steps"], "seconds": record["seconds"],
                 "resumed": bool(record.get("resumed", False))}
    if is_main_process():  # the others' seconds are their own wall time
        write_json_atomic(out / "general.json", reference)
    return reference


def _student(config: ConfigView, spec: TaskSpec, teacher, teacher_tokenizer, layer_map: list[int] | None,
             start: str | None = None, shape: dict | None = None):
    """A new student of ``config.student``'s shape (its layers cut from teacher layers ``layer_map`` with init
    "teacher"), or one started from a checkpoint (``student.model``, or the general-distilled ``start``) with the
    teacher's labels and a new head; either way with the head config of the task's type
    (:meth:`~distill.tasks.TaskType.head_config`: a ``problem_type`` where it gives one, so that ``pipeline()``
    applies the right output function)."""
    start = config.student.model or start
    head = spec.type.head_config(spec)
    if start is None:
        student = build_student(teacher, config.student, layer_map, shape=shape)
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


def hidden_projection(folder: Path) -> nn.Linear | None:
    """The hidden-state projection W_h (H_S -> H_T) the intermediate step learnt and saved in ``folder`` (the
    shared W where one served the embedding and every layer), as an ``nn.Linear``; None where it saved none."""
    path = folder / PROJECTIONS_FILE
    if not path.is_file():
        return None
    saved = load_file(path)
    name = "hidden" if "hidden.weight" in saved else "shared" if "shared.weight" in saved else None
    if name is None:
        return None
    weight = saved[f"{name}.weight"]
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=f"{name}.bias" in saved)
    linear.load_state_dict({key.removeprefix(f"{name}."): value for key, value in saved.items()
                            if key.startswith(f"{name}.")})
    return linear


def student_layers(config: ConfigView, shape: dict | None, start: str | None = None) -> int:
    """The student's depth: that of the checkpoint it starts from (``student.model``, or the general-distilled
    ``start``), else of ``shape``, the student's shape as the job resolved it (:attr:`distill.job.table.Job.shape`)."""
    if (checkpoint := config.student.model or start) is not None:
        return load_model_config(checkpoint).num_hidden_layers
    return shape["num_hidden_layers"]


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


def distill_step(
    name: str, config: ConfigView, spec: TaskSpec, teacher, student, tokenizer, train_set: datasets.Dataset,
    terms: dict[str, float], train_config: TrainConfig, folder: Path, run_id: str, device: torch.device,
    layer_map: list[int], start: str | None = None, teacher_cache: tuple[Path, str] | None = None,
) -> DistillationObjective:
    """One run of the loop with a :class:`DistillationObjective` (under a multi-process launch, every process's share
    of it); the caller saves the student (:func:`save_student`).

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


def ship_tuned(folder: Path, model, spec: TaskSpec, metrics: dict) -> dict:
    """Save the settings the model's type chose on the dev set's tuning half (a multi-label decision threshold) in
    ``folder/config.json`` beside its weights (:func:`distill.tasks.record_tuned`); returns {"tuned": settings} for
    its stage record, {} when none."""
    tuned = record_tuned(model, spec, metrics)
    if tuned:
        model.config.save_pretrained(folder)
        logger.info("%s: ships with %s, chosen on the dev set's tuning half", folder,
                    ", ".join(f"{name} {value}" for name, value in tuned.items()))
    return {"tuned": tuned} if tuned else {}


def save_student(folder: Path, student, tokenizer, objective: DistillationObjective | None = None,
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
                      data_run_id: str, general: dict, out: Path, folder: Path, *, device: torch.device,
                      shape: dict | None) -> dict:
    """The intermediate step (embedding, hidden and attention losses) into ``folder``, the student starting from the
    general-distilled or the pruned one when there is one (``general``: that start's {"run_id", "folder"}, and for a
    pruned student its "layer_map", the teacher layers it kept; its run id enters this step's as "general", so the
    run ids of jobs without a pruned student are those from before the pruning stage); returns its record.
    ``shape``: the student's shape as the job resolved it (:attr:`distill.job.table.Job.shape`), for a student built
    here (none started from a checkpoint)."""
    inputs = {"teacher": teacher_record["run_id"], "augmented": data_run_id, "general": general["run_id"]}
    full_config = config
    run_id, config, record = open_stage("student_intermediate", config, folder, inputs)
    if record is not None:
        return record
    banner("task distillation, intermediate step", folder)
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher"), spec)
    terms = intermediate_terms(config.distill.weights)
    start = config.student.model or general["folder"]
    cut = start is None and config.student.init == "teacher"  # student layers copied from teacher layers
    # The configured map picks the teacher layers a cut student copies also when no layer is matched (logit-only).
    layer_map = (general.get("layer_map") or build_layer_map(
        config.distill.layer_map, teacher.config.num_hidden_layers,
        student_layers(config, shape, general["folder"])) if terms or cut else None)
    set_seed(config.distill.intermediate.seed)  # student weights and projections are drawn from the global RNG
    student = _student(config, spec, teacher, tokenizer, layer_map, start=general["folder"], shape=shape)
    record = {"copied_layers": layer_map if cut else None, "start": start or config.student.init,
              "device": str(device)}
    if general.get("layer_map"):  # a pruned student: the teacher layers it kept, and how it scored before distilling
        pruned = json.loads((Path(general["folder"]) / "stage.json").read_text(encoding="utf-8"))
        record["pruned"] = {key: pruned.get(key) for key in ("layer_map", "layers", "importance", "num_examples", "dev")}
    if not terms:  # logit-only distillation: the student goes straight to the prediction step
        logger.info("intermediate step skipped: every intermediate loss weight is 0 (logit-only distillation)")
        mark_stage_started(folder)
        return on_main(folder, run_id, lambda: save_student(
            folder, student, tokenizer, record=(run_id, {"layer_map": None, "skipped": True, "weights": {}, **record})))
    cache = None
    if config.distill.teacher_cache is not None:  # shared by a sweep's students that read the same teacher layers
        cache_id = teacher_outputs_run_id(full_config, teacher_record["run_id"], data_run_id, terms, layer_map)
        cache = (teacher_cache_folder(folder.parent, out, cache_id), cache_id)
        record["teacher_cache"] = cache[1]
    objective = distill_step("intermediate", config, spec, teacher, student, tokenizer, train_set, terms,
                              config.distill.intermediate, folder, run_id, device, layer_map, start=general["folder"],
                              teacher_cache=cache)
    record_serving(student, spec, config.task.max_seq_length)
    return on_main(folder, run_id, lambda: save_student(  # one process saves it; the others then read its record
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
    banner("task distillation, prediction step", folder)
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher"), spec).to(device)
    # The intermediate step's teacher-output cache, when it had one, holds this teacher's logits on these rows.
    cache = ((teacher_cache_folder(folder.parent, out, step1["teacher_cache"]), step1["teacher_cache"])
             if step1.get("teacher_cache") else None)
    train_set = with_teacher_logits(train_set, teacher, tokenizer, out / "teacher_logits", logits_run_id,
                                    task_type=spec.type, device=device, cache=cache)
    mark_stage_started(folder)  # the step's wall time leaves out the teacher logits, timed in their own folder
    student = spec.type.prediction_model(spec, spec.type.model_class(spec).from_pretrained(
        folder.parent / "student_intermediate"), teacher, hidden_projection(folder.parent / "student_intermediate"))
    weight = config.distill.weights.get("prediction", 1.0)
    distill_step("prediction", config, spec, teacher, student, tokenizer, train_set, {"prediction": weight},
                  config.distill.prediction, folder, run_id, device,
                  list(range(1, student.config.num_hidden_layers + 1)))  # no layer is matched: logits alone

    def finish() -> None:  # one process saves and scores the student; the others then read its record
        record_serving(student, spec, config.task.max_seq_length)  # how it is served as scored (a QA reader's windows)
        save_student(folder, student, tokenizer)
        spec.type.finish_folder(spec, student, folder, config.task.max_seq_length)  # e.g. sentence-transformers files
        metrics = evaluate_task(student, data, tokenizer, spec, config.task.max_seq_length, device=device)
        # and read against the teacher's outputs where the type scores that (embeddings searched in its index)
        metrics.update(evaluate_against_teacher(student, teacher, data, tokenizer, spec, config.task.max_seq_length,
                                                device=device))
        logger.info("student dev metrics: %s", metrics)
        tuned = ship_tuned(folder, student, spec, metrics)
        weights = prediction_terms(config.distill.weights, config.distill.hard_label_weight)
        mark_stage_done(folder, run_id, {"dev": metrics, "weights": weights, "device": str(device), **tuned})

    return on_main(folder, run_id, finish)


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
            start_stage("teacher logits (cached for the prediction step)", folder)
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


def pruned_start(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, teacher_record: dict,
                 train_set: datasets.Dataset, data_run_id: str, out: Path, student_dir: Path, *,
                 device: torch.device, teacher_config, shape: dict | None) -> dict:
    """The student pruned from the teacher (:func:`distill.job.pruned.pruned_stage`'s record) into
    ``student_dir/pruned``; when pruning in stages (``student.pruning.stages``), each stage's shape pruned and
    distilled in turn into ``student_dir/pruning/stage-<n>/`` (pruned, intermediate and prediction steps) first, each
    pruning the one before. ``train_set``: the tokenized distillation set; ``teacher_config`` and ``shape``: the
    fine-tuned teacher's model config and the student's shape, as the job resolved them once
    (:class:`distill.job.table.Job`)."""
    source = None
    if not pruning_skip(config):
        for number, stage_shape in enumerate(stage_shapes(config.student, teacher_config), 1):
            stage_dir, stage = student_dir / "pruning" / f"stage-{number}", stage_config(config, stage_shape)
            pruned = pruned_stage(stage, spec, data, teacher_record, out, stage_dir / "pruned", device=device,
                                  source=source, shape=stage_shape)
            step1 = intermediate_step(stage, spec, teacher_record, train_set, data_run_id, pruned, out,
                                      stage_dir / "student_intermediate", device=device, shape=stage_shape)
            record = prediction_step(stage, spec, data, teacher_record, train_set, data_run_id, step1, out,
                                     stage_dir / "student", device=device)
            logger.info("pruning stage %d (%s): dev %s", number, stage_shape, record["dev"])
            source = stage_source(stage_dir, pruned, record)
    return pruned_stage(config, spec, data, teacher_record, out, student_dir / "pruned", device=device,
                        source=source, shape=shape)
