"""The pruning stage: a student cut from the fine-tuned teacher in depth and width, before task distillation.

With ``student.init: pruned`` the stage measures the teacher's importance on a calibration sample of the task's
training data, plans what a student of ``student``'s shape keeps and prunes the teacher to it
(:mod:`students.pruning`); the intermediate step then starts from that student, its projections W (student → teacher
width) from the selection of the kept channels. The stage writes ``pruned/``: the student (a plain checkpoint with the
tokenizer), ``importance.safetensors``, ``pruning.json`` (what was kept) and ``stage.json`` with the pruned student's
dev metrics before distillation. Its run id covers the teacher, the task data, the student section and the layer map.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import DataCollatorWithPadding

from distill.method.checkpoint import finished_or_superseded, mark_stage_done, mark_stage_started
from distill.tasks.base import TaskSpec
from distill.tasks.data import collator, tokenize
from distill.tasks.evaluate import evaluate_task
from distill.method.layer_map import build_layer_map
from distill.job.processes import on_main
from distill.job.stages import STAGES
from students import student_shape
from students.build import student_config
from students.pruning import compute_importance, Importance, plan_pruning, prune_model, select_layers
from teachers import load_teacher, load_tokenizer

logger = logging.getLogger(__name__)

IMPORTANCE_FILE = "importance.safetensors"
PLAN_FILE = "pruning.json"
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


def pruned_stage(config, spec: TaskSpec, data, teacher_record: dict, out: Path, folder: Path, *,
                 device: torch.device) -> dict:
    """Prune the fine-tuned teacher in ``out/teacher`` to the student's shape into ``folder`` (skipped unless
    ``student.init`` is "pruned" and no ``student.model`` is given).

    Returns:
        {"run_id", "folder", "layer_map"}: the pruned student's folder and the teacher layers it kept (the
        distillation's layer map); {"run_id": "none", "folder": None} when skipped.

    Raises:
        PruningError: a student shape pruning cannot reach (preflight refuses it first).
    """
    if config.student.init != "pruned" or config.student.model is not None:
        return dict(NONE)
    spec_stage = STAGES["pruned"]
    run_id = spec_stage.run_id(config, {"teacher": teacher_record["run_id"]})
    view = spec_stage.view(config)
    if finished_or_superseded(folder, run_id) is None:
        logger.info("=== stage: pruned student (teacher pruned to the student's shape) -> %s", folder)
    record = on_main(folder, run_id, lambda: _prune(view, spec, data, out, folder, run_id, device))
    return {"run_id": run_id, "folder": str(folder), "layer_map": record["layer_map"]}


def _prune(config, spec: TaskSpec, data, out: Path, folder: Path, run_id: str, device: torch.device) -> None:
    if finished_or_superseded(folder, run_id) is not None:
        return
    mark_stage_started(folder)
    tokenizer = load_tokenizer(str(out / "teacher"))
    teacher = load_teacher(str(out / "teacher"), spec)
    pruning = config.student.pruning
    shape = student_shape(config.student, teacher.config)
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
    student = prune_model(teacher, plan, student_config(teacher.config, shape, init="teacher"))
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / PLAN_FILE).write_text(json.dumps(plan.to_dict()), encoding="utf-8")
    metrics = evaluate_task(student.to(device), data, tokenizer, spec, config.task.max_seq_length, device=device)
    logger.info("pruned student (before distillation): layers %s, %s, dev %s", plan.layers, shape, metrics)
    mark_stage_done(folder, run_id, {"layer_map": plan.layers, "shape": shape, "dev": metrics,
                                     "num_examples": importance.num_examples, "layers": pruning.layers,
                                     "importance": pruning.importance,
                                     "device": str(device)})


def kept_channels(folder: str | Path) -> list[int] | None:
    """The teacher's residual channels a pruned student in ``folder`` kept (ascending), or None for another start."""
    path = Path(folder) / PLAN_FILE
    return json.loads(path.read_text(encoding="utf-8"))["residual"] if path.is_file() else None


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
