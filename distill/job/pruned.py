"""The pruning stage: a student cut from the fine-tuned teacher in depth and width, before task distillation.

With ``student.init: pruned`` the stage measures the teacher's importance on a calibration sample of the task's
training data, plans what a student of ``student``'s shape keeps and prunes the teacher to it
(:mod:`students.pruning`); the intermediate step then starts from that student, its projections W (student → teacher
width) from the selection of the kept channels. The stage writes ``pruned/``: the student (a plain checkpoint with the
tokenizer), ``importance.safetensors``, ``pruning.json`` (what was kept) and ``stage.json`` with the pruned student's
dev metrics before distillation. Its run id covers the teacher, the task data, the student section and the layer map.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import DataCollatorWithPadding

from distill.config import STAGE_SHAPE, fingerprint
from distill.job.general import PROJECTIONS_FILE
from distill.method.checkpoint import (finished_or_superseded, mark_stage_done, mark_stage_started,
                                      write_json_atomic)
from distill.tasks.base import TaskSpec
from distill.tasks.data import collator, tokenize
from distill.tasks.evaluate import evaluate_task
from distill.method.layer_map import build_layer_map
from distill.method.processes import on_main
from distill.job.stages import STAGES
from students import student_shape
from students.build import student_config
from students.pruning import compute_importance, Importance, plan_pruning, prune_model, select_layers
from teachers import load_teacher, load_tokenizer

logger = logging.getLogger(__name__)

IMPORTANCE_FILE = "importance.safetensors"
PLAN_FILE = "pruning.json"
RUN_FILE = "run.json"  # the run id of the pruning under way: an interrupted folder of another run is moved aside
NONE = {"run_id": "none", "folder": None}
CALIBRATION_SEED = 0


def calibration_batches(train_data, tokenizer, spec: TaskSpec, max_seq_length: int, num_examples: int,
                        batch_size: int = 32, labels: bool = False) -> list[dict]:
    """The calibration sample: ``num_examples`` training examples drawn with a fixed seed (all when there are fewer),
    tokenized as the task does, in batches of similar length (sorted), padded by the task's collator; model inputs
    only, or with ``labels`` what the model's own loss reads too (the Taylor criterion)."""
    count = min(num_examples, len(train_data))
    rows = np.sort(np.random.default_rng(CALIBRATION_SEED).choice(len(train_data), size=count, replace=False))
    encoded = tokenize(train_data.select(rows.tolist()), tokenizer, spec, max_seq_length)
    if not labels:
        encoded = encoded.select_columns([c for c in ("input_ids", "attention_mask", "token_type_ids")
                                          if c in encoded.column_names])
    order = np.argsort([len(ids) for ids in encoded["input_ids"]], kind="stable")
    pad = collator(tokenizer, spec) if labels else DataCollatorWithPadding(tokenizer, return_tensors="pt")
    return [pad([encoded[int(i)] for i in order[start:start + batch_size]])
            for start in range(0, len(order), batch_size)]


def stage_shapes(student, teacher_config) -> list[dict]:
    """The shapes of ``student.pruning.stages`` (:class:`distill.config.PruningConfig`), each a shape dict as
    :func:`students.student_shape` gives: a preset name read as that preset (a relative one against
    ``teacher_config``), a mapping as its four sizes; nothing of the student's own fields is read.

    Raises:
        ValueError: an unknown preset, or one of another family (a stage keeps the teacher's).
    """
    shapes = []
    for stage in student.pruning.stages:
        fields = {"preset": stage} if isinstance(stage, str) else {"preset": None, **{k: int(v) for k, v in
                                                                                       stage.items()}}
        fields = {"model": None, "model_type": None, "embedding_size": None, "num_hidden_groups": None,
                  **{key: None for key in STAGE_SHAPE}, **fields}
        shape = student_shape(dataclasses.replace(student, **fields), teacher_config)
        if "model_type" in shape:
            raise ValueError(f"stage {stage!r} is a {shape['model_type']} shape; a stage is pruned from the teacher "
                             "and keeps its family: use a preset of plain sizes or a mapping of the four sizes")
        shapes.append(shape)
    return shapes


def stage_config(config, shape: dict):
    """The job's config for one stage of pruning in stages: the student of ``shape``, pruned in one shot from the
    stage before it."""
    pruning = dataclasses.replace(config.student.pruning, stages=[])
    student = dataclasses.replace(config.student, preset=None, pruning=pruning,
                                  **{key: shape[key] for key in STAGE_SHAPE})
    return dataclasses.replace(config, student=student)


def stage_source(stage_dir: Path, pruned: dict, record: dict) -> dict:
    """What the next stage prunes: the distilled student of one stage in ``stage_dir`` (``pruned``: its pruned
    stage's result; ``record``: its prediction step's record), with the teacher layers and channels it stands for."""
    return {"folder": str(stage_dir / "student"), "run_id": record["run_id"], "layers": pruned["layer_map"],
            "residual": kept_channels(pruned["folder"]),
            "projections": str(stage_dir / "student_intermediate" / PROJECTIONS_FILE)}


def pruning_skip(config) -> str | None:
    """Why no student is pruned from the teacher (the pruning stage does not run), or None when one is: the rule the
    run and the dry run both follow."""
    if config.student.init != "pruned":
        return f"student.init is {config.student.init}"
    return "student.model is given" if config.student.model is not None else None


def pruned_stage(config, spec: TaskSpec, data, teacher_record: dict, out: Path, folder: Path, *,
                 device: torch.device, source: dict | None = None, shape: dict | None = None) -> dict:
    """Prune the fine-tuned teacher in ``out/teacher`` (or ``source``, the distilled student of the stage before,
    when pruning in stages) to the student's shape into ``folder`` (skipped unless ``student.init`` is "pruned" and no
    ``student.model`` is given).

    Args:
        source: {"folder", "run_id", "layers", "residual", "projections"} (:func:`stage_source`): the model pruned,
            the teacher layers (1-based) and residual channels it stands for, and its learnt projections W
            (h_source -> h_T); None prunes the teacher. The plan's layers and channels are then the teacher's
            (composed through the source's), and W starts as the source's W restricted to the kept channels.
        shape: the student's shape as the job resolved it (:attr:`distill.job.table.Job.shape`); needed unless the
            stage is skipped.

    Returns:
        {"run_id", "folder", "layer_map"}: the pruned student's folder and the teacher layers it kept (the
        distillation's layer map); {"run_id": "none", "folder": None} when skipped.

    Raises:
        PruningError: a student shape pruning cannot reach (preflight refuses it first).
    """
    if pruning_skip(config):
        return dict(NONE)
    spec_stage = STAGES["pruned"]
    run_id = spec_stage.run_id(config, {"teacher": teacher_record["run_id"]})
    if source is not None:  # what it prunes is the stage before's student, made from the same teacher and data
        run_id = fingerprint(run_id, source["run_id"])
    view = spec_stage.view(config)
    if finished_or_superseded(folder, run_id) is None:
        what = "teacher" if source is None else f"student of the stage before ({source['folder']})"
        logger.info("=== stage: pruned student (%s pruned to the student's shape) -> %s", what, folder)
    record = on_main(folder, run_id, lambda: _prune(view, spec, data, out, folder, run_id, device, shape, source))
    return {"run_id": run_id, "folder": str(folder), "layer_map": record["layer_map"]}


def _prune(config, spec: TaskSpec, data, out: Path, folder: Path, run_id: str, device: torch.device, shape: dict,
           source: dict | None = None) -> None:
    if finished_or_superseded(folder, run_id) is not None:
        return
    mark_stage_started(folder)
    write_json_atomic(folder / RUN_FILE, {"run_id": run_id})  # what an interrupted run's importance was measured for
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher") if source is None else source["folder"], spec)
    pruning = config.student.pruning
    path = folder / IMPORTANCE_FILE
    if path.is_file():  # computed by an earlier, interrupted run of this stage
        importance = Importance.from_tensors(load_file(path))
    else:
        taylor = pruning.importance == "taylor"
        batches = calibration_batches(data["train"], tokenizer, spec, config.task.max_seq_length, pruning.num_examples,
                                      labels=taylor)
        importance = compute_importance(teacher, batches, device=device, criterion=pruning.importance)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(importance.to_tensors(), str(path))
    teacher = teacher.cpu()
    if pruning.layers == "importance":
        layers = select_layers(importance, shape["num_hidden_layers"])
    else:
        layers = build_layer_map(config.distill.layer_map, teacher.config.num_hidden_layers,
                                 shape["num_hidden_layers"])
    plan = plan_pruning(importance, teacher.config, shape, layers)
    def probe(model_config):  # traced to build the dependency graph: inputs of the task type's layout
        generator = torch.Generator().manual_seed(0)
        inputs = spec.type.example_inputs(model_config, 2, 8, generator)
        inputs["attention_mask"][1, ..., 5:] = 0
        return inputs

    student = prune_model(teacher, plan, student_config(teacher.config, shape, init="teacher"), example_inputs=probe)
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    saved = plan.to_dict()
    (folder / PROJECTIONS_FILE).unlink(missing_ok=True)
    if source is not None:  # the plan indexes the source's units; the distillation reads the teacher's
        saved["teacher_layers"] = [source["layers"][layer - 1] for layer in plan.layers]
        saved["teacher_residual"] = [source["residual"][channel] for channel in plan.residual]
        if Path(source["projections"]).is_file():  # W (h_T x h_source) -> its columns of the kept channels
            kept = torch.as_tensor(plan.residual)
            save_file({name: (value[:, kept] if name.endswith("weight") else value).contiguous()
                       for name, value in load_file(source["projections"]).items()}, str(folder / PROJECTIONS_FILE))
    (folder / PLAN_FILE).write_text(json.dumps(saved), encoding="utf-8")
    layer_map = saved.get("teacher_layers", plan.layers)
    metrics = evaluate_task(student.to(device), data, tokenizer, spec, config.task.max_seq_length, device=device)
    logger.info("pruned student (before distillation): layers %s, %s, dev %s", layer_map, shape, metrics)
    mark_stage_done(folder, run_id, {"layer_map": layer_map, "shape": shape, "dev": metrics,
                                     "num_examples": importance.num_examples, "layers": pruning.layers,
                                     "importance": pruning.importance,
                                     "device": str(device)})


def kept_channels(folder: str | Path) -> list[int] | None:
    """The teacher's residual channels a pruned student in ``folder`` kept (ascending), or None for another start."""
    path = Path(folder) / PLAN_FILE
    if not path.is_file():
        return None
    plan = json.loads(path.read_text(encoding="utf-8"))
    return plan.get("teacher_residual", plan["residual"])  # pruned in stages: the teacher's, through the stages


@torch.no_grad()
def init_projections(projections: torch.nn.ModuleDict, channels: list[int]) -> None:
    """Start every projection W (h_S → h_T) as the selection of the kept channels: student channel j maps onto
    teacher channel ``channels[j]``, bias 0, so the pruned student's hidden states are compared with the teacher's
    channels they came from and the hidden loss starts where pruning left it."""
    for projection in projections.values():
        projection.weight.zero_()
        projection.weight[torch.as_tensor(channels), torch.arange(len(channels))] = 1.0
        if projection.bias is not None:
            projection.bias.zero_()
