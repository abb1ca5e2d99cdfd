"""Evaluation of a model on a tokenized dev set, for any task type: its outputs in dataset order, then the type's
metrics.

Shapes: N examples, C classes, T_i real tokens of example i.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from distill.device import model_device, same_device
from distill.tasks.base import PAIRED, TaskSpec, TaskType
from distill.tasks.data import collator, tokenize
from distill.tasks.split import HalfScorer


def compute_metrics(spec: TaskSpec, outputs, labels, context=None, settings: dict | None = None
                    ) -> dict[str, float]:
    """The task's metrics (``spec.metrics``) from model outputs, as its task type computes them
    (:meth:`TaskType.compute_metrics`).

    Args:
        outputs: what :func:`predict` returns: (N, C) logits (N, 1 for regression), or per example (T_i, C) for a
            type with outputs per token.
        labels: the tokenized dataset's ``labels``.
        context: what the type needs beyond them (:meth:`TaskType.metric_context`), or None.
        settings: scoring settings chosen on other data (:meth:`TaskType.tuned_settings`), or None: the type chooses
            its own (a multi-label threshold, the best on these outputs).
    """
    if settings:
        return spec.type.compute_metrics_with(spec, outputs, labels, context, settings)
    if context is None:  # a type written before the hook takes three arguments
        return spec.type.compute_metrics(spec, outputs, labels)
    return spec.type.compute_metrics(spec, outputs, labels, context)


def dev_scorer(spec: TaskSpec, data, split: str, encoded, tokenizer, max_seq_length: int) -> HalfScorer:
    """The :class:`distill.tasks.split.HalfScorer` of a tokenized dev split (``encoded``, of ``data[split]``)."""
    return HalfScorer(spec, data, split, encoded["labels"], tokenizer, max_seq_length)


@torch.no_grad()
def predict(model, dataset, tokenizer, *, task_type: TaskType, device: torch.device | str, batch_size: int = 64,
            progress: bool = True) -> np.ndarray | list[np.ndarray]:
    """Logits of ``model`` on a tokenized dataset, in dataset order: (N, C) float32, or for a type with outputs per
    token (:attr:`TaskType.per_token`: token classification; QA, whose start and end logits are (T_i, 2)) a list of N
    (T_i, C) float32 arrays, padding removed.

    Args:
        model: a classifier already on ``device`` (evaluation never moves a model), or an ONNX Runtime session
            wrapper (no parameters; it takes CPU inputs) with ``device`` the CPU.
        dataset: tokenized (``input_ids``, ``attention_mask``, optionally ``token_type_ids``).
        task_type: the task's type, which reads the head's logits from the model's outputs
            (:meth:`TaskType.logits`) and says whether they are per token.
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
        logits = task_type.logits(model(**batch)).float().cpu()
        if task_type.per_token:  # (B, T, C): one row per real token of each example
            lengths = batch["attention_mask"].sum(dim=1).tolist()
            left = tokenizer.padding_side == "left"
            chunks.extend(row[-n:].numpy() if left else row[:n].numpy() for row, n in zip(logits, lengths))
        else:
            chunks.append(logits)
    if task_type.per_token:
        restored_rows: list = [None] * len(chunks)
        for position, row in zip(order, chunks):
            restored_rows[position] = row
        return restored_rows
    logits = torch.cat(chunks).numpy()
    restored = np.empty_like(logits)
    restored[order] = logits
    return restored


def evaluate(model, dataset, tokenizer, spec: TaskSpec, *, device: torch.device | str, batch_size: int = 64,
             context=None, halves: HalfScorer | None = None) -> dict:
    """Dev metrics of ``model`` on a tokenized dataset with ``labels`` (see :func:`compute_metrics`, :func:`predict`);
    ``context``: what the type needs beyond them (:meth:`TaskType.metric_context`); ``halves``: the split's
    :class:`~distill.tasks.split.HalfScorer` (:func:`dev_scorer`), which adds each half's metrics
    (``tuning/<metric>``, ``report/<metric>``) from the same outputs."""
    logits = predict(model, dataset, tokenizer, task_type=spec.type, device=device, batch_size=batch_size)
    labels = dataset["labels"]
    metrics = compute_metrics(spec, logits, labels, context)
    if halves is not None:
        metrics.update(halves.score(logits, labels, lambda outputs, rows, found, settings: compute_metrics(
            spec, outputs, rows, found, settings)))
    return metrics


def evaluate_task(model, data, tokenizer, spec: TaskSpec, max_seq_length: int, *, device: torch.device | str,
                  batch_size: int = 64) -> dict[str, float]:
    """Metrics on every dev set of the task (untokenized ``data`` splits, see :attr:`TaskSpec.dev_splits`): the main
    dev set's under the metric names, and on its tuning and report halves (:mod:`distill.tasks.split`) under
    ``tuning/<metric>`` and ``report/<metric>``; the others with their suffix (MNLI: ``accuracy``,
    ``accuracy_mismatched``), each with the context its type reads from ``data`` (:meth:`TaskType.metric_context`:
    e.g. the training set's entity names). ``model`` must be on ``device`` (see :func:`predict`)."""
    metrics = {}
    for split, suffix in spec.dev_splits.items():
        encoded = tokenize(data[split], tokenizer, spec, max_seq_length)
        context = spec.type.metric_context(spec, data, split, tokenizer, max_seq_length)
        halves = dev_scorer(spec, data, split, encoded, tokenizer, max_seq_length) if not suffix else None
        metrics.update({name + suffix: value for name, value in evaluate(
            model, encoded, tokenizer, spec, device=device, batch_size=batch_size, context=context,
            halves=halves).items()})
    return metrics



def evaluate_against_teacher(student, teacher, data, tokenizer, spec: TaskSpec, max_seq_length: int, *,
                             device: torch.device | str, batch_size: int = 64) -> dict[str, float]:
    """The student's outputs on the main dev set read against the teacher's (:meth:`TaskType.paired_metrics`), on
    the whole set and on its halves: ``teacher_index/<metric>``, ``report/teacher_index/<metric>``,
    ``tuning/teacher_index/<metric>``; {} where the type does not score the pair (:meth:`TaskType.against_teacher`).
    Both models must be on ``device``."""
    if not spec.type.against_teacher(spec, student, teacher):
        return {}
    split = next(split for split, suffix in spec.dev_splits.items() if not suffix)
    encoded = tokenize(data[split], tokenizer, spec, max_seq_length)
    pairs = list(zip(*(predict(model, encoded, tokenizer, task_type=spec.type, device=device, batch_size=batch_size)
                       for model in (student, teacher))))
    labels = encoded["labels"]

    def compute(rows, row_labels, context=None, settings=None) -> dict[str, float]:
        ours, theirs = zip(*rows) if rows else ((), ())
        return {f"{PAIRED}/{name}": value
                for name, value in spec.type.paired_metrics(spec, list(ours), list(theirs), row_labels).items()}

    halves = dev_scorer(spec, data, split, encoded, tokenizer, max_seq_length)
    return {**compute(pairs, labels), **halves.score(pairs, labels, compute)}
