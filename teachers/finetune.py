"""Make a teacher: fine-tune a pre-trained encoder (by default the bundled MiniLM) on the task."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import datasets
import torch
from transformers import AutoModelForSequenceClassification, set_seed

from distill.checkpoint import mark_stage_done
from distill.config import TaskConfig, TeacherConfig
from distill.data import TaskSpec, collator, tokenize
from distill.evaluate import evaluate_task
from distill.objective import ModelLossObjective
from distill.trainer import train
from teachers.models import ModelError, load_tokenizer, resolve_model

logger = logging.getLogger(__name__)


def chance_level(spec: TaskSpec) -> float:
    """Metric of a model that guesses uniformly: 1/C for classification metrics, 0 for correlations."""
    return 0.0 if spec.is_regression else 1.0 / spec.num_labels


def check_teacher_quality(metrics: dict, spec: TaskSpec, minimum: float | None, name: str) -> None:
    """Refuse a teacher whose first dev metric is below ``minimum`` (default: chance + 0.05).

    Raises:
        ModelError: naming the metric, its value and the threshold.
    """
    metric = spec.metrics[0]
    threshold = chance_level(spec) + 0.05 if minimum is None else minimum
    if metrics[metric] < threshold:
        raise ModelError(
            f"teacher {name!r} has dev {metric} {metrics[metric]:.4f}, below {threshold:.4f} (chance is "
            f"{chance_level(spec):.2f}): it is not fine-tuned for {spec.name} or is broken. Distilling it would give "
            "a garbage student. Train it longer, or lower teacher.min_dev_metric if you mean it."
        )


def finetune_teacher(
    config: TeacherConfig, task: TaskConfig, spec: TaskSpec, data: datasets.DatasetDict, stage_dir: Path, run_id: str,
    *, device: torch.device,
) -> dict:
    """Fine-tune ``config.base_model`` with a new classification head on ``data["train"]``; save to ``stage_dir``.

    The run checkpoints into ``stage_dir/checkpoints`` and resumes from there; the final model and tokenizer are saved
    as a plain HF checkpoint in ``stage_dir`` and the stage is marked done with its dev metrics. Training and the
    dev evaluation run on ``device``.

    Returns:
        The stage record: {"run_id", "dev": {metric: value}, "num_train_examples", "device"}.
    """
    tokenizer = load_tokenizer(config.base_model)
    set_seed(config.train.seed)  # the new classifier head is drawn from the global RNG: same seed, same teacher
    # Label names only for classification: an explicit id2label=None would reset num_labels (regression has one).
    names = {"id2label": dict(enumerate(spec.label_names)),
             "label2id": {name: i for i, name in enumerate(spec.label_names)}} if spec.label_names else {}
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model(config.base_model),
        num_labels=spec.num_labels,
        problem_type="regression" if spec.is_regression else "single_label_classification",
        **names,
    )
    train_set = tokenize(data["train"], tokenizer, spec, task.max_seq_length)
    objective = ModelLossObjective(model)
    train(objective, train_set, collator(tokenizer), config.train, stage_dir, run_id, "teacher fine-tuning",
          device=device)
    model.save_pretrained(stage_dir)
    tokenizer.save_pretrained(stage_dir)
    metrics = evaluate_task(model, data, tokenizer, spec, task.max_seq_length, device=device)
    logger.info("teacher dev metrics: %s", metrics)
    check_teacher_quality(metrics, spec, config.min_dev_metric, str(stage_dir))
    shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
    return mark_stage_done(stage_dir, run_id, {"dev": metrics, "num_train_examples": len(train_set),
                                               "device": str(device)})
