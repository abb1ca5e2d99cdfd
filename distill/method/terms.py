"""The registry of distillation loss terms: each term is defined once, here, and everything else reads it.

A :class:`LossTerm` names a term, the step it belongs to, what it reads from the teacher's outputs (per layer map)
and the function that computes it from the student's and teacher's :class:`~distill.method.capture.ModelOutputs`. Config
validation (``distill.weights`` keys), the objective, the pipeline (which terms make an intermediate step) and the
docs take the list of terms from :data:`LOSS_TERMS`.

The teacher's outputs are made for one step and then dropped, so the squared-error losses may write into them instead
of allocating a (B, A, T, T) buffer per layer (see :func:`distill.method.losses.squared_error_sum`). That is safe only for
the last reader of a buffer. :class:`TeacherOutputs` hands buffers to the terms and decides: it counts every term's
declared reads before the step and lets a buffer be consumed only by its last declared reader; after the terms it is
closed, so nothing can read a consumed buffer by mistake.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from distill.method.capture import ModelOutputs
from distill.method.losses import attention_error, hidden_error, relation_error, teacher_variation

# A teacher buffer: ("hidden_states", l) for layer l (0: embeddings), ("attentions", l) for layer l's scores and
# ("qkv", l) for its query/key/value projections (1-based, as the layer map), ("logits", 0).
Read = tuple[str, int]


@dataclass(frozen=True)
class TermValue:
    """One term's value for a step.

    Attributes:
        loss: scalar, float32.
        inputs_differ: scalar bool tensor, whether any compared student and teacher values differ. A loss that is
            exactly 0 while they differ has lost its value to rounding or overflow (see the trainer's check).
    """

    loss: torch.Tensor
    inputs_differ: torch.Tensor


class TeacherOutputs:
    """The teacher's outputs for one step, handed to loss terms buffer by buffer.

    Args:
        outputs: the teacher's record, or None when the step runs no teacher forward (cached logits).
        cached_logits: (B, C) teacher logits from the batch (the prediction step's cache), or None.
        reads: every read the step's terms will make, counted (see :meth:`LossTerm.teacher_reads`).
    """

    def __init__(self, outputs: ModelOutputs | None, cached_logits: torch.Tensor | None, reads: Counter):
        self._outputs, self._cached_logits = outputs, cached_logits
        self._remaining = Counter(reads)
        self._closed = False

    def take(self, kind: str, layer: int = 0) -> tuple[torch.Tensor, bool]:
        """A teacher buffer and whether the caller may overwrite it (it is the buffer's last declared reader).

        Raises:
            RuntimeError: the step's terms are done (the buffers may hold differences now), or the read was not
                declared by the term's ``teacher_reads``.
        """
        if self._closed:
            raise RuntimeError(f"teacher {kind}[{layer}] read after the loss terms: its buffer may have been "
                               "overwritten; read it inside a LossTerm that declares it in teacher_reads")
        if self._remaining[(kind, layer)] <= 0:
            raise RuntimeError(f"teacher {kind}[{layer}] was not declared by the reading term's teacher_reads (or is "
                               "read more often than declared)")
        self._remaining[(kind, layer)] -= 1
        if kind == "logits":
            logits = self._cached_logits if self._outputs is None else self._outputs.logits
            return logits, False  # small, and the caller may keep them: never consumed
        if kind == "hidden_states":
            tensor = self._outputs.hidden_states[layer]
        elif kind == "qkv":
            tensor = self._outputs.qkv.get(layer - 1)
            if tensor is not None:
                return tensor, False  # small, and read as three tensors: never consumed
        else:
            tensor = self._outputs.attentions[layer - 1]
        if tensor is None:
            raise RuntimeError(f"teacher {kind}[{layer}] is not in the teacher's outputs (a teacher-output cache made "
                               "for other layers or terms)")
        return tensor, self._remaining[(kind, layer)] == 0

    def close(self) -> None:
        """Refuse every later read; drop the references so the buffers are freed with the step."""
        self._closed, self._outputs, self._cached_logits = True, None, None


@dataclass(frozen=True)
class LossTerm:
    """A distillation loss term.

    Attributes:
        name: config and log name (``distill.weights.<name>``, ``loss/<name>``).
        step: "intermediate" (layer-wise: task distillation's first step and general distillation) or "prediction".
        teacher_reads: the teacher buffers the term reads, given the layer map [g(1), ..., g(M)].
        reads_attentions: the models must return attention scores for this term.
        compute: (objective, student outputs, teacher outputs, batch) -> :class:`TermValue`.
        source: where the term comes from (paper, equation).
        default_weight: its weight when the config does not give one (0 for terms that are off by default).
        reads_qkv: it reads the query, key and value projections of the student's last layer and of the teacher
            layer mapped to it.
        uses_projection: it needs the learnt projections W (h_S -> h_T) when the widths differ.
    """

    name: str
    step: str
    teacher_reads: Callable[[list[int]], list[Read]]
    reads_attentions: bool
    compute: Callable[[Any, ModelOutputs, TeacherOutputs, dict], TermValue]  # (the objective, ...)
    source: str
    default_weight: float = 1.0  # the weight when distill.weights does not name the term (0: off unless asked for)
    reads_qkv: bool = False  # the models must return the query/key/value projections of the last mapped layer
    uses_projection: bool = False  # it maps student states to the teacher's width with a learnt W


def _state_loss(objective, student_states: torch.Tensor, target: torch.Tensor, consume: bool, mask: torch.Tensor,
                projection) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer pair's hidden-state loss: the MSE (TinyBERT), or with ``hidden_loss == "normalized"`` the squared
    error over the teacher's variation (computed before the teacher's buffer may be overwritten). Returns (loss,
    whether any real token's states differ)."""
    variation = teacher_variation(target, mask) if objective.hidden_loss == "normalized" else None
    total, count, differ = hidden_error(student_states, target, mask, projection, consume_teacher=consume)
    return total / (count if variation is None else variation).clamp(min=1e-12), differ


def _embedding(objective, student: ModelOutputs, teacher: TeacherOutputs, batch: dict) -> TermValue:
    target, consume = teacher.take("hidden_states", 0)
    loss, differ = _state_loss(objective, student.hidden_states[0], target, consume, student.attention_mask,
                               objective.projection("embedding"))
    return TermValue(loss, differ)


def _hidden(objective, student: ModelOutputs, teacher: TeacherOutputs, batch: dict) -> TermValue:
    loss, differ = 0.0, torch.zeros((), dtype=torch.bool, device=student.attention_mask.device)
    for m, g in enumerate(objective.layer_map, start=1):
        target, consume = teacher.take("hidden_states", g)
        value, layer_differs = _state_loss(objective, student.hidden_states[m], target, consume,
                                           student.attention_mask, objective.projection("hidden"))
        loss, differ = loss + value, differ | layer_differs
    return TermValue(loss, differ)


def _attention(objective, student: ModelOutputs, teacher: TeacherOutputs, batch: dict) -> TermValue:
    loss, differ = 0.0, torch.zeros((), dtype=torch.bool, device=student.attention_mask.device)
    for m, g in enumerate(objective.layer_map, start=1):
        target, consume = teacher.take("attentions", g)
        total, count, layer_differs = attention_error(student.attentions[m - 1], target, student.attention_mask,
                                                      consume_teacher=consume)
        loss, differ = loss + total / count.clamp(min=1), differ | layer_differs
    return TermValue(loss, differ)


def _relation(objective, student: ModelOutputs, teacher: TeacherOutputs, batch: dict) -> TermValue:
    last = len(objective.layer_map)
    targets, _ = teacher.take("qkv", objective.layer_map[-1])
    mask = student.attention_mask
    loss, differ = 0.0, torch.zeros((), dtype=torch.bool, device=mask.device)
    for own, target in zip(student.qkv[last - 1], targets):  # query-query, key-key, value-value relations
        total, count, relations_differ = relation_error(own, target, mask, objective.relation_heads)
        loss, differ = loss + total / count.clamp(min=1), differ | relations_differ
    return TermValue(loss, differ)


def _prediction(objective, student: ModelOutputs, teacher: TeacherOutputs, batch: dict) -> TermValue:
    target, _ = teacher.take("logits")
    head = objective.head  # the task type's answers (distill.method.objective.PredictionHead): no task name here
    loss = head.loss(student.logits, target, batch, temperature=objective.temperature,
                     temperature_squared=objective.temperature_squared, hard_label_weight=objective.hard_label_weight)
    return TermValue(loss, head.inputs_differ(student.logits, target, batch))


LOSS_TERMS: dict[str, LossTerm] = {term.name: term for term in (
    LossTerm("embedding", "intermediate", lambda layer_map: [("hidden_states", 0)], False, _embedding,
             "TinyBERT (Jiao et al., 2020), Eq. 9: MSE(E_S W_e, E_T)", uses_projection=True),
    LossTerm("hidden", "intermediate", lambda layer_map: [("hidden_states", g) for g in layer_map], False, _hidden,
             "TinyBERT Eq. 8: MSE(H_S W_h, H_T) per mapped layer", uses_projection=True),
    LossTerm("attention", "intermediate", lambda layer_map: [("attentions", g) for g in layer_map], True, _attention,
             "TinyBERT Eq. 7: MSE of pre-softmax scores, mean over heads, per mapped layer"),
    LossTerm("relation", "intermediate", lambda layer_map: [("qkv", layer_map[-1])], False, _relation,
             "MiniLMv2 (Wang et al., 2021), Eq. 3-5: KL of query-query, key-key and value-value self-attention "
             "relations at the student's last layer and its mapped teacher layer; no projections, any head counts",
             default_weight=0.0, reads_qkv=True),
    LossTerm("prediction", "prediction", lambda layer_map: [("logits", 0)], False, _prediction,
             "TinyBERT Eq. 10: soft cross-entropy on logits, in the head's output space as the task type defines it "
             "(per scored token for token classification)"),
)}


def teacher_reads(terms, layer_map: list[int]) -> Counter:
    """Every teacher buffer the named ``terms`` read with ``layer_map``, counted (a buffer read by two terms: 2)."""
    return Counter(read for name in terms for read in LOSS_TERMS[name].teacher_reads(layer_map))


def terms_of(step: str) -> tuple[str, ...]:
    """Names of the registered terms of a step ("intermediate" or "prediction"), in registry order."""
    return tuple(name for name, term in LOSS_TERMS.items() if term.step == step)
