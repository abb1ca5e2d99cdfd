"""Objectives: what the training loop optimises. A stage is an objective plus data, not a code path.

Every objective is an ``nn.Module`` with
- ``trainable``: an ``nn.ModuleDict`` holding everything the optimizer updates and checkpoints save
  (the model, and for distillation the learnable projections W);
- ``forward(batch) -> (loss, terms)``: a scalar loss and a dict of named scalar terms for logging;
- optionally ``inputs_differ``: after a forward, {term: scalar bool tensor} saying whether the values a term
  compared differ, so the loop can tell a term that is exactly 0 because student and teacher agree from one whose
  value was lost to rounding or overflow.
A frozen teacher lives outside ``trainable``: it is never optimised or checkpointed.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from torch import nn

from distill.method.capture import CaptureError, capture_support, check_capture, run_model
from distill.method.losses import prediction_loss
from distill.method.teacher_cache import cached_outputs
from distill.method.terms import LOSS_TERMS, TeacherOutputs, teacher_reads, terms_of


class ModelLossObjective(nn.Module):
    """Train a `transformers` model on the loss it computes itself from ``labels`` (fine-tuning, masked LM)."""

    def __init__(self, model: nn.Module, name: str = "task"):
        super().__init__()
        self.trainable = nn.ModuleDict({"model": model})
        self.name = name
        # The batch entries the model takes (a task's collator may add others, e.g. QA's context_mask); a forward
        # that takes **kwargs (a wrapper) gets the whole batch.
        parameters = inspect.signature(model.forward).parameters.values()
        self.accepts = None if any(p.kind is p.VAR_KEYWORD for p in parameters) else \
            frozenset(p.name for p in parameters)

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = batch if self.accepts is None else {k: v for k, v in batch.items() if k in self.accepts}
        loss = self.trainable["model"](**inputs).loss
        return loss, {self.name: loss.detach()}


# Attribute of a ...ForMaskedLM model that holds its masked-LM head (hidden states -> vocabulary logits).
MLM_HEADS = {"bert": "cls", "roberta": "lm_head", "xlm-roberta": "lm_head", "camembert": "lm_head", "albert": "predictions"}


def masked_lm_logits(model: nn.Module, batch: dict, positions: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits at selected positions only: (P, V) for P = positions.sum().

    The head's V-way projection dominates a masked-LM step when applied at every token; applying it only where it is
    needed (the 15% masked tokens, or the one masked word in augmentation) is exact and several times cheaper.

    Args:
        model: a ``...ForMaskedLM`` model.
        batch: model inputs (B, T).
        positions: (B, T) bool, the positions to predict.
    """
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    head_name = MLM_HEADS.get(model.config.model_type)
    if head_name is None:  # unknown layout: full forward, then select
        return model(**inputs).logits[positions]
    hidden = model.base_model(**inputs).last_hidden_state[positions]
    return getattr(model, head_name)(hidden)


class MaskedLMObjective(nn.Module):
    """Masked-LM cross-entropy (Devlin et al., 2019) with the head applied at the masked positions only.

    The mean is over the batch's masked tokens; a batch in which masking drew no token (short lines, small batches)
    gives 0 and no gradient, where the model's own loss is NaN (a mean over nothing) and would stop training."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.trainable = nn.ModuleDict({"model": model})

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = batch["labels"]
        positions = labels != -100
        logits = masked_lm_logits(self.trainable["model"], batch, positions)
        total = nn.functional.cross_entropy(logits.float(), labels[positions], reduction="sum")
        loss = total / positions.sum(dtype=torch.float32).clamp(min=1)
        return loss, {"mlm": loss.detach()}


class PredictionHead(Protocol):
    """What the prediction term asks of a head, given by the task's type (:meth:`distill.tasks.TaskType.
    prediction_head`), as TextBrewer's adaptor hands a distiller its logits and losses: the method knows no task.

    Shapes: B batch; logits (B, C) per example or (B, T, C) per token, as the head gives them."""

    def logits(self, outputs) -> torch.Tensor | None:
        """The head's output of a `transformers` model output as one tensor; None for a bare encoder."""

    def loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict, *, temperature: float,
             temperature_squared: bool, hard_label_weight: float) -> torch.Tensor:
        """The prediction loss, a float32 scalar (TinyBERT Eq. 10 in the head's output space)."""

    def inputs_differ(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """Scalar bool: whether the logits differ where the loss reads them."""

    def encoder_inputs(self, batch: dict) -> dict[str, torch.Tensor]:
        """The batch's model inputs as the encoder reads them, (N, T): the input layout of the task's type
        (:meth:`distill.tasks.TaskType.encoder_inputs`), read by the terms' masks and the capture check."""

    def example_inputs(self, config, batch_size: int, seq_length: int, generator: torch.Generator | None = None
                       ) -> dict[str, torch.Tensor]:
        """Model inputs of the type's layout, every position real (the capture check's probe)."""


class SoftTargets:
    """The default head: (B, C) logits, TinyBERT's soft cross-entropy against the teacher's (Eq. 10), with the
    temperature, T² scaling and gold-label term of :func:`distill.method.losses.prediction_loss`."""

    def logits(self, outputs) -> torch.Tensor | None:
        return getattr(outputs, "logits", None)

    def loss(self, student_logits, teacher_logits, batch, *, temperature, temperature_squared, hard_label_weight):
        return prediction_loss(student_logits, teacher_logits, temperature, temperature_squared, batch.get("labels"),
                               hard_label_weight)

    def inputs_differ(self, student_logits, teacher_logits, batch):
        return (student_logits.float() != teacher_logits.float()).any()

    def encoder_inputs(self, batch):
        return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}

    def example_inputs(self, config, batch_size, seq_length, generator=None):
        low = min(5, config.vocab_size - 1)
        ids = torch.randint(low, config.vocab_size, (batch_size, seq_length), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class DistillationObjective(nn.Module):
    """TinyBERT's distillation objective for one step (Jiao et al., 2020, Eq. 11).

    The loss is Σ_terms weight · term over the registered terms of :data:`distill.method.terms.LOSS_TERMS`: ``embedding``
    (layer 0 ↔ 0), ``hidden`` (m ↔ g(m), m = 1..M), ``attention`` (m ↔ g(m)), summed over mapped layers, and
    ``prediction``, the head's prediction loss (soft cross-entropy on logits, Eq. 10; what the task's type makes of it).

    Args:
        teacher: frozen teacher (put in eval mode, gradients off).
        student: the model being trained (any `transformers` encoder classifier dispatching through the attention
            interface).
        terms: loss terms with their weights, e.g. {"embedding": 1, "hidden": 1, "attention": 1}.
        layer_map: [g(1), ..., g(M)] (see :func:`distill.method.layer_map.build_layer_map`).
        share_projection: one W for the embedding and all hidden layers (reference code) instead of W_e and W_h
            (paper). Projections exist only where h_S ≠ h_T.
        temperature, temperature_squared, hard_label_weight: see :func:`distill.method.losses.prediction_loss`.
        head: what the prediction term asks of the models' head (:class:`PredictionHead`: their logits, the loss
            between them and whether its inputs differ), given by the task's type; None: :class:`SoftTargets`,
            TinyBERT's soft cross-entropy on (B, C) logits. The objective reads no task name.
        relation_heads: relation heads of the MiniLMv2 ``relation`` term (must divide both widths).
        hidden_loss: "mse" (TinyBERT Eq. 8, 9) or "normalized": the embedding and hidden terms divide each layer's
            squared error by the teacher's variation over the batch's real tokens (Σ‖h_T − μ‖²), so a teacher layer
            whose states barely vary is matched in its variation, not by a constant.

    Raises:
        ValueError: an unregistered term, or a layer map whose length is not the student's depth.
        CaptureError: a model whose hidden states or attention scores cannot be captured.
    """

    def __init__(
        self,
        teacher: nn.Module,
        student: nn.Module,
        terms: dict[str, float],
        layer_map: list[int],
        *,
        share_projection: bool = False,
        temperature: float = 1.0,
        temperature_squared: bool = False,
        hard_label_weight: float = 0.0,
        relation_heads: int = 12,
        hidden_loss: str = "mse",
        head: PredictionHead | None = None,
    ):
        super().__init__()
        unknown = set(terms) - set(LOSS_TERMS)
        if unknown:
            raise ValueError(f"unknown loss terms {sorted(unknown)}; use {', '.join(LOSS_TERMS)}")
        num_student_layers = student.config.num_hidden_layers
        if len(layer_map) != num_student_layers:
            raise ValueError(f"layer_map has {len(layer_map)} entries for a {num_student_layers}-layer student")
        self.teacher = teacher.eval().requires_grad_(False)
        self.terms = {name: terms[name] for name in LOSS_TERMS if name in terms}  # registry order
        self.layer_map = list(layer_map)
        self.temperature = temperature
        self.temperature_squared = temperature_squared
        self.hard_label_weight = hard_label_weight
        self.head = head if head is not None else SoftTargets()
        # the head's input layout: a head written before the hook reads (B, T) inputs as they are
        self.encoder_inputs = getattr(self.head, "encoder_inputs", SoftTargets().encoder_inputs)
        self.relation_heads = relation_heads
        if hidden_loss not in ("mse", "normalized"):
            raise ValueError(f"hidden_loss must be mse or normalized, got {hidden_loss!r}")
        self.hidden_loss = hidden_loss
        self.needs_intermediate = any(LOSS_TERMS[name].step == "intermediate" for name in self.terms)
        self.needs_attentions = any(LOSS_TERMS[name].reads_attentions for name in self.terms)
        needs_qkv = any(LOSS_TERMS[name].reads_qkv for name in self.terms)
        # Every teacher buffer the terms will read, counted: the last reader of a buffer may overwrite it.
        self.teacher_reads = teacher_reads(self.terms, self.layer_map)
        self.inputs_differ: dict[str, torch.Tensor] = {}
        if self.needs_attentions or needs_qkv:
            # The frozen teacher: SDPA everywhere, scores by one more matmul at the mapped layers only. The probe has
            # the task type's input layout (a multiple-choice batch (B, C, T)).
            check_capture(teacher, [g - 1 for g in self.layer_map] if self.needs_attentions else [], fused=True,
                          role="teacher", qkv_layers=[self.layer_map[-1] - 1] if needs_qkv else None, head=self.head)
            check_capture(student, None if self.needs_attentions else [], role="student",
                          qkv_layers=[num_student_layers - 1] if needs_qkv else None, head=self.head)
        elif self.needs_intermediate:  # hidden states only: still refuse models that cannot be matched layer by layer
            for role, model in (("teacher", teacher), ("student", student)):
                if (reason := capture_support(model.config)) is not None:
                    raise CaptureError(f"{role}: {reason}")
        self.trainable = nn.ModuleDict(
            {"student": student, "projections": self._projections(student, teacher, share_projection)}
        )

    def _projections(self, student: nn.Module, teacher: nn.Module, share: bool) -> nn.ModuleDict:
        h_s, h_t = student.config.hidden_size, teacher.config.hidden_size
        if h_s == h_t or not any(LOSS_TERMS[name].uses_projection for name in self.terms):
            return nn.ModuleDict()
        if share:
            return nn.ModuleDict({"shared": nn.Linear(h_s, h_t)})
        return nn.ModuleDict({"embedding": nn.Linear(h_s, h_t), "hidden": nn.Linear(h_s, h_t)})

    def projection(self, term: str) -> nn.Module | None:
        """The W used by ``term`` ("embedding" or "hidden"), or None when sizes are equal."""
        projections = self.trainable["projections"]
        if "shared" in projections:
            return projections["shared"]
        return projections[term] if term in projections else None

    def train(self, mode: bool = True) -> "DistillationObjective":
        super().train(mode)
        self.teacher.eval()  # the teacher never runs dropout
        return self

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cached_logits = batch.get("teacher_logits")
        # The teacher-output cache (distill.teacher_cache) carries the buffers the intermediate terms read.
        teacher = cached_outputs(batch, self.teacher.config.num_hidden_layers)
        if teacher is None and (self.needs_intermediate or cached_logits is None):  # cached logits: no teacher forward
            with torch.no_grad():
                teacher = run_model(self.teacher, batch, self.needs_intermediate, self.needs_attentions,
                                    logits=self.head.logits, flatten=self.encoder_inputs)
        student = run_model(self.trainable["student"], batch, self.needs_intermediate, self.needs_attentions,
                            logits=self.head.logits, flatten=self.encoder_inputs)
        # The teacher's outputs were made for this step alone; the terms get them through one object that lets the
        # last reader of a buffer overwrite it, and refuses reads once the terms are done.
        outputs = TeacherOutputs(teacher, cached_logits, self.teacher_reads)
        del teacher
        values = {name: LOSS_TERMS[name].compute(self, student, outputs, batch) for name in self.terms}
        outputs.close()
        self.inputs_differ = {name: value.inputs_differ for name, value in values.items()}
        loss = sum(self.terms[name] * value.loss for name, value in values.items())
        return loss, {name: value.loss.detach() for name, value in values.items()}


def intermediate_terms(weights: dict[str, float]) -> dict[str, float]:
    """The intermediate step's loss terms with their weights (default: the term's ``default_weight``, 1 for
    TinyBERT's terms, 0 for ``relation``); terms weighted 0 are left out."""
    terms = {name: weights.get(name, LOSS_TERMS[name].default_weight) for name in terms_of("intermediate")}
    return {name: weight for name, weight in terms.items() if weight > 0}


def prediction_terms(weights: dict[str, float], hard_label_weight: float) -> dict[str, float]:
    """The prediction step's loss terms with their effective weights: ``prediction`` (the head's prediction loss, at
    ``weights["prediction"]``, default 1) and, when ``hard_label_weight`` is above 0, the
    gold-label term ``hard_label``. The gold-label loss is added inside the prediction term, which the objective
    then weights, so its effective weight is the product; with the prediction term weighted 0 it does not run."""
    weight = weights.get("prediction", 1.0)
    terms = {"prediction": weight}
    if weight > 0 and hard_label_weight > 0:
        terms["hard_label"] = weight * hard_label_weight
    return terms
