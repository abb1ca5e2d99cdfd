"""The teacher stage: a teacher fine-tuned on the task from ``teacher.base_model``, or the given fine-tuned
``teacher.model`` scored on dev and saved, into ``<output_dir>/teacher/``."""


from __future__ import annotations

import logging
from pathlib import Path

import datasets
import torch

from distill.config import (
    PipelineConfig,
)
from distill.job.stages import open_stage, start_stage
from distill.method.checkpoint import (
    mark_stage_done,
)
from distill.method.processes import on_main
from distill.tasks import record_serving, record_tuned
from distill.tasks.base import TaskSpec
from distill.tasks.evaluate import evaluate_task
from teachers import (
    check_teacher_quality,
    finetune_teacher,
    load_teacher,
    load_tokenizer,
)
from teachers.finetune import dev_labels

logger = logging.getLogger(__name__)


def teacher_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, out: Path, *,
                  device: torch.device) -> dict:
    """Fine-tune a teacher from ``teacher.base_model``, or take the given fine-tuned ``teacher.model``; on
    ``device``."""
    folder = out / "teacher"
    run_id, config, record = open_stage("teacher", config, folder)
    if record is not None:
        logger.info("teacher: done (dev %s), skipping", record["dev"])
        return record
    start_stage("teacher", folder)
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
