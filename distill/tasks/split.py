"""The dev set in two halves: a **tuning** half, on which settings are chosen (the teacher's best checkpoint, a
multi-label decision threshold, a recipe's levers), and a **report** half, on which results are reported, so that a
reported figure was never used to choose anything that produced it.

The rule is fixed and needs no seed: an example's half is the lowest bit of the first byte of the SHA-256 of its key
(:meth:`distill.tasks.TaskType.example_key`: by default its text columns, so two copies of one text always fall in the
same half, and a dev set read from another file or in another order splits the same way). The halves are disjoint
and together hold the whole dev set; each holds about half of it (a binomial share: 50% +/- 1/(2 sqrt(N))).

Metrics on a half are stored beside the whole dev set's under ``"<half>/<metric>"`` (``report/accuracy``,
``tuning/micro_f1``, ``report/unseen/f1``): see :func:`half_metrics`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from distill.tasks.base import TaskSpec

TUNING, REPORT = "tuning", "report"
HALVES = (TUNING, REPORT)


def key_half(key: str) -> str:
    """The half of an example with this key: :data:`TUNING` when the first byte of SHA-256(UTF-8 key) is even,
    :data:`REPORT` when odd."""
    return HALVES[hashlib.sha256(key.encode("utf-8")).digest()[0] & 1]


def example_halves(spec: TaskSpec, dataset) -> list[str]:
    """Each example's half, in dataset order (an untokenized split: rows with the task's text columns)."""
    return [key_half(spec.type.example_key(spec, row)) for row in dataset]


def half_indices(spec: TaskSpec, dataset) -> dict[str, list[int]]:
    """{half: the indices of its examples in ``dataset``, ascending}: disjoint, and together every index."""
    found: dict[str, list[int]] = {half: [] for half in HALVES}
    for index, half in enumerate(example_halves(spec, dataset)):
        found[half].append(index)
    return found


def half_key(half: str, metric: str) -> str:
    """The key of ``metric`` scored on ``half``: ``"report/accuracy"``."""
    return f"{half}/{metric}"


class HalfScorer:
    """Scores the two halves of one tokenized dev split from the whole split's outputs (no second forward pass).

    Args:
        spec: the task.
        data: the task's untokenized splits (a ``DatasetDict``); ``split`` the dev split scored.
        labels: the tokenized split's ``labels`` (one per tokenized row; a QA question has a row per window).
        tokenizer, max_seq_length: as the split was tokenized (the type's metric context is rebuilt per half).
    """

    def __init__(self, spec: TaskSpec, data, split: str, labels, tokenizer, max_seq_length: int):
        import datasets

        self.spec = spec
        examples = spec.type.row_examples(labels)
        halves = example_halves(spec, data[split])
        by_half = half_indices(spec, data[split])
        self.rows = {half: np.array([row for row, example in enumerate(examples) if halves[example] == half],
                                    dtype=np.int64) for half in HALVES}
        self.contexts: dict[str, Any] = {}
        for half in HALVES:
            halved = datasets.DatasetDict({**data, split: data[split].select(by_half[half])})
            self.contexts[half] = spec.type.metric_context(spec, halved, split, tokenizer, max_seq_length)

    def score(self, outputs, labels, compute, fixed: dict | None = None) -> dict[str, float]:
        """Metrics on each half: the tuning half's as the type scores it, the report half's with the settings the
        type chose on the tuning half (:meth:`distill.tasks.TaskType.tuned_settings`: a multi-label threshold).

        Args:
            outputs, labels: the whole split's, as :func:`distill.tasks.evaluate.predict` and the tokenized split
                give them.
            compute: ``compute(outputs, labels, context, settings) -> metrics`` (the type's scoring).
            fixed: settings a saved model ships with (:func:`distill.tasks.saved_settings`), used on both halves
                instead of choosing on the tuning half; None or {}: choose.

        Returns:
            {``"<half>/<metric>"``: value} for the metrics :func:`half_metrics` keeps; a half with no example is left
            out.
        """
        scored: dict[str, dict] = {}
        settings: dict = dict(fixed or {})
        for half in HALVES:
            rows = self.rows[half]
            if not len(rows):
                continue
            metrics = compute(_take(outputs, rows), _take(labels, rows), self.contexts[half],
                              settings if half == REPORT or fixed else {})
            if half == TUNING and not fixed:
                settings = self.spec.type.tuned_settings(self.spec, metrics)
            scored[half] = metrics
        return {half_key(half, name): value for half, metrics in scored.items()
                for name, value in half_metrics(self.spec, metrics).items()}


def half_metrics(spec: TaskSpec, metrics: dict) -> dict:
    """The metrics of a half that are kept: the task's own (``spec.metrics``) and those its type adds to the seeds
    summary (:attr:`distill.tasks.TaskType.summary_metrics`), not every per-label figure."""
    keep = (*spec.metrics, *spec.type.summary_metrics)
    return {name: value for name, value in metrics.items() if name in keep}


def _take(values, rows: np.ndarray):
    """The rows ``rows`` of an array, or of a list (per-token outputs, a dataset column)."""
    if isinstance(values, np.ndarray):
        return values[rows]
    return [values[int(row)] for row in rows]
