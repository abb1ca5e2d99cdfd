"""Make a teacher: fine-tune a pre-trained encoder (by default the bundled MiniLM) on the task."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import datasets
import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, set_seed

from distill.checkpoint import mark_stage_done
from distill.config import TaskConfig, TeacherConfig
from distill.data import TaskSpec, collator, tokenize
from distill.evaluate import evaluate, evaluate_task
from distill.objective import ModelLossObjective
from distill.trainer import BEST_FOLDER, Selection, train
from teachers.models import ModelError, load_tokenizer, resolve_model

logger = logging.getLogger(__name__)


def chance_level(spec: TaskSpec, dev_labels=None) -> float:
    """What a model that has learnt nothing scores on the task's primary metric (``spec.metrics[0]``).

    - accuracy: 1/C, the expected accuracy of a uniform guess;
    - Matthews correlation, Pearson, Spearman: 0 (any constant or random guess is uncorrelated with the labels);
    - F1 (of the positive class): that of the best constant guess, always "positive", 2p / (1 + p) for a positive
      rate p in the dev labels (``dev_labels`` needed; 0.5 assumed without them).

    Args:
        spec: the task.
        dev_labels: (N,) dev label ids, for an F1 primary metric.
    """
    metric = spec.metrics[0]
    if metric in ("matthews_corrcoef", "pearson", "spearmanr") or spec.is_regression:
        return 0.0
    if metric == "f1":
        positive = 0.5 if dev_labels is None else float(np.mean(np.asarray(dev_labels) == 1))
        return 2 * positive / (1 + positive)
    return 1.0 / spec.num_labels


def dev_labels(data: datasets.DatasetDict, spec: TaskSpec):
    """The main dev split's labels (for a chance level that depends on them)."""
    split = next(iter(spec.dev_splits))
    return data[split]["label"]


def check_teacher_quality(metrics: dict, spec: TaskSpec, minimum: float | None, name: str, dev_labels=None) -> None:
    """Refuse a teacher whose primary dev metric is below ``minimum`` (default: chance + 0.05, see
    :func:`chance_level`).

    Raises:
        ModelError: naming the metric, its value, the threshold and chance.
    """
    metric = spec.metrics[0]
    chance = chance_level(spec, dev_labels)
    threshold = chance + 0.05 if minimum is None else minimum
    if metrics[metric] < threshold:
        raise ModelError(
            f"teacher {name!r} has dev {metric} {metrics[metric]:.4f}, below {threshold:.4f} (chance is "
            f"{chance:.2f}): it is not fine-tuned for {spec.name} or is broken. Distilling it would give "
            "a garbage student. Train it longer, or lower teacher.min_dev_metric if you mean it."
        )


def finetune_teacher(
    config: TeacherConfig, task: TaskConfig, spec: TaskSpec, data: datasets.DatasetDict, stage_dir: Path, run_id: str,
    *, device: torch.device,
) -> dict:
    """Fine-tune ``config.base_model`` with a new classification head on ``data["train"]``; save to ``stage_dir``.

    The run checkpoints into ``stage_dir/checkpoints`` and resumes from there; the final model and tokenizer are saved
    as a plain HF checkpoint in ``stage_dir`` and the stage is marked done with its dev metrics. Training and the
    dev evaluation run on ``device``. With ``config.select_best`` the main dev set's primary metric is scored after
    every epoch (or every ``eval_steps`` steps) and the best weights are kept, not the last: model selection on the
    dev set, as GLUE fine-tuning practice does (the dev metric reported is then the selected model's).

    Returns:
        The stage record: {"run_id", "dev": {metric: value}, "num_train_examples", "steps", "device"}, and with
        selection {"selection": {"metric", "best_step", "evaluations": [[step, value], ...], "last": value}}.
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
    selection = None
    if config.select_best:
        dev = tokenize(data[next(iter(spec.dev_splits))], tokenizer, spec, task.max_seq_length)
        primary = spec.metrics[0]
        selection = Selection(lambda: evaluate(model, dev, tokenizer, spec, device=device)[primary], config.eval_steps)
    state = train(objective, train_set, collator(tokenizer), config.train, stage_dir, run_id, "teacher fine-tuning",
                  device=device, selection=selection)
    model.save_pretrained(stage_dir)
    tokenizer.save_pretrained(stage_dir)
    metrics = evaluate_task(model, data, tokenizer, spec, task.max_seq_length, device=device)
    logger.info("teacher dev metrics: %s", metrics)
    check_teacher_quality(metrics, spec, config.min_dev_metric, str(stage_dir), dev_labels(data, spec))
    shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
    shutil.rmtree(stage_dir / BEST_FOLDER, ignore_errors=True)
    record = {"dev": metrics, "num_train_examples": len(train_set), "steps": state.step, "device": str(device)}
    if selection is not None:
        record["selection"] = {"metric": spec.metrics[0], "best_step": state.best_step,
                               "evaluations": state.evaluations, "last": state.evaluations[-1][1]}
    return mark_stage_done(stage_dir, run_id, record)
