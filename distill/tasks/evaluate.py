"""Task metrics and evaluation of a classifier on a tokenized dev set.

Shapes: N examples, C classes.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from sklearn import metrics
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from distill.method.capture import head_logits
from distill.tasks.data import TaskSpec, collator, tokenize
from distill.device import model_device, same_device


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to the labels, in [0, 1] (scikit-learn's ``accuracy_score``)."""
    return float(metrics.accuracy_score(labels, predictions))


def f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC/QQP convention), in [0, 1]; 0 when there are no true positives
    (scikit-learn's ``f1_score``, binary average)."""
    return float(metrics.f1_score(labels, predictions, pos_label=positive, average="binary", zero_division=0.0))


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient (CoLA), in [-1, 1]; 0 when undefined (scikit-learn's ``matthews_corrcoef``)."""
    return float(metrics.matthews_corrcoef(labels, predictions))


def correlation(function, predictions: np.ndarray, labels: np.ndarray) -> float:
    """Pearson or Spearman correlation (STS-B), in [-1, 1]; 0 when undefined (constant predictions or labels)."""
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(function(predictions, labels)[0])


def compute_metrics(spec: TaskSpec, outputs, labels) -> dict[str, float]:
    """The task's metrics (``spec.metrics``) from model outputs, as its task type computes them
    (:mod:`distill.tasks`).

    Args:
        outputs: what :func:`predict` returns: (N, C) logits, (N, 1) predictions for regression, or per example
            (T_i, C) logits for token classification.
        labels: (N,) gold class ids or scores; per example (T_i,) label ids for token classification.
    """
    return spec.type.compute_metrics(spec, outputs, labels)


def sequence_metrics(spec: TaskSpec, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Sequence classification and regression metrics (accuracy, F1, Matthews correlation; Pearson, Spearman).

    Args:
        outputs: (N, C) logits, or (N, 1) / (N,) predictions for regression.
        labels: (N,) gold class ids or scores.
    """
    if spec.is_regression:
        predictions = outputs.reshape(-1)
        table = {
            "pearson": lambda: correlation(stats.pearsonr, predictions, labels),
            "spearmanr": lambda: correlation(stats.spearmanr, predictions, labels),
        }
    else:
        predictions = outputs.argmax(axis=-1)
        table = {
            "accuracy": lambda: accuracy(predictions, labels),
            "f1": lambda: f1(predictions, labels),
            "matthews_corrcoef": lambda: matthews_corrcoef(predictions, labels),
        }
    return {name: table[name]() for name in spec.metrics}


@torch.no_grad()
def predict(model, dataset, tokenizer, *, device: torch.device | str, batch_size: int = 64, progress: bool = True
            ) -> np.ndarray | list[np.ndarray]:
    """Logits of ``model`` on a tokenized dataset, in dataset order: (N, C) float32, or for a model with outputs per
    token (token classification; QA, whose start and end logits are (T_i, 2), :func:`distill.method.capture.head_logits`) a
    list of N (T_i, C) float32 arrays, padding removed.

    Args:
        model: a classifier already on ``device`` (evaluation never moves a model), or an ONNX Runtime session
            wrapper (no parameters; it takes CPU inputs) with ``device`` the CPU.
        dataset: tokenized (``input_ids``, ``attention_mask``, optionally ``token_type_ids``).
        device: where the batches go: the run's device (:func:`distill.device.run_device`).
        progress: show an "evaluate" progress bar.

    Raises:
        ValueError: the model's weights are on another device than ``device``.
    """
    device = torch.device(device)
    where = model_device(model)
    if where is not None and not same_device(where, device):
        raise ValueError(f"predict: the model is on {where}, the batches were asked on {device}; move the model to "
                         "the run's device first (evaluation does not move models)")
    model.eval()
    columns = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in dataset.column_names]
    inputs = dataset.select_columns(columns)
    # Sort by length so batches carry little padding; restore the order afterwards.
    order = np.argsort([len(ids) for ids in inputs["input_ids"]], kind="stable")
    loader = DataLoader(inputs.select(order), batch_size=batch_size, collate_fn=collator(tokenizer))
    chunks: list = []
    for batch in tqdm(loader, desc="evaluate", leave=False, disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = head_logits(model(**batch)).float().cpu()
        if logits.dim() == 3:  # (B, T, C): one row per real token of each example
            lengths = batch["attention_mask"].sum(dim=1).tolist()
            left = tokenizer.padding_side == "left"
            chunks.extend(row[-n:].numpy() if left else row[:n].numpy() for row, n in zip(logits, lengths))
        else:
            chunks.append(logits)
    if chunks and isinstance(chunks[0], np.ndarray):
        restored_rows: list = [None] * len(chunks)
        for position, row in zip(order, chunks):
            restored_rows[position] = row
        return restored_rows
    logits = torch.cat(chunks).numpy()
    restored = np.empty_like(logits)
    restored[order] = logits
    return restored


def evaluate(model, dataset, tokenizer, spec: TaskSpec, *, device: torch.device | str, batch_size: int = 64) -> dict:
    """Dev metrics of ``model`` on a tokenized dataset with ``labels`` (see :func:`compute_metrics`, :func:`predict`)."""
    logits = predict(model, dataset, tokenizer, device=device, batch_size=batch_size)
    return compute_metrics(spec, logits, dataset["labels"])


def evaluate_task(model, data, tokenizer, spec: TaskSpec, max_seq_length: int, *, device: torch.device | str,
                  batch_size: int = 64) -> dict[str, float]:
    """Metrics on every dev set of the task (untokenized ``data`` splits, see :attr:`TaskSpec.dev_splits`): the main
    dev set's under the metric names, the others with their suffix (MNLI: ``accuracy``, ``accuracy_mismatched``).
    ``model`` must be on ``device`` (see :func:`predict`)."""
    metrics = {}
    for split, suffix in spec.dev_splits.items():
        encoded = tokenize(data[split], tokenizer, spec, max_seq_length)
        metrics.update({name + suffix: value for name, value in
                        evaluate(model, encoded, tokenizer, spec, device=device, batch_size=batch_size).items()})
    return metrics
