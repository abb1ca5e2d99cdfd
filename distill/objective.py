"""Objectives: what the training loop optimises. A stage is an objective plus data, not a code path.

Every objective is an ``nn.Module`` with
- ``trainable``: an ``nn.ModuleDict`` holding everything the optimizer updates and checkpoints save
  (the model, and for distillation the learnable projections W);
- ``forward(batch) -> (loss, terms)``: a scalar loss and a dict of named scalar terms for logging.
A frozen teacher lives outside ``trainable``: it is never optimised or checkpointed.
"""

from __future__ import annotations

import torch
from torch import nn

from distill.capture import CaptureError, capture_support, check_capture, run_model
from distill.losses import attention_loss, hidden_loss, prediction_loss

INTERMEDIATE_TERMS = ("embedding", "hidden", "attention")
PREDICTION_TERMS = ("prediction",)


class ModelLossObjective(nn.Module):
    """Train a `transformers` model on the loss it computes itself from ``labels`` (fine-tuning, masked LM)."""

    def __init__(self, model: nn.Module, name: str = "task"):
        super().__init__()
        self.trainable = nn.ModuleDict({"model": model})
        self.name = name

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = self.trainable["model"](**batch).loss
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
    """Masked-LM cross-entropy (Devlin et al., 2019) with the head applied at the masked positions only."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.trainable = nn.ModuleDict({"model": model})

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels = batch["labels"]
        positions = labels != -100
        logits = masked_lm_logits(self.trainable["model"], batch, positions)
        loss = nn.functional.cross_entropy(logits.float(), labels[positions])
        return loss, {"mlm": loss.detach()}


class DistillationObjective(nn.Module):
    """TinyBERT's distillation objective for one step (Jiao et al., 2020, Eq. 11).

    The loss is Σ_terms weight · term, where the intermediate terms are summed over mapped layers:
    ``embedding`` (layer 0 ↔ 0), ``hidden`` (m ↔ g(m), m = 1..M), ``attention`` (m ↔ g(m)); and ``prediction``
    is the soft cross-entropy on logits (MSE for regression).

    Args:
        teacher: frozen teacher (put in eval mode, gradients off).
        student: the model being trained (any `transformers` encoder classifier dispatching through the attention
            interface).
        terms: loss terms with their weights, e.g. {"embedding": 1, "hidden": 1, "attention": 1}.
        layer_map: [g(1), ..., g(M)] (see :func:`distill.layer_map.build_layer_map`).
        share_projection: one W for the embedding and all hidden layers (reference code) instead of W_e and W_h
            (paper). Projections exist only where h_S ≠ h_T.
        temperature, temperature_squared, hard_label_weight: see :func:`distill.losses.prediction_loss`.
        regression: the task is regression (single output); prediction uses MSE.
    """

    def __init__(
        self,
        teacher: nn.Module,
        student: nn.Module,
        terms: dict[str, float],
        layer_map: list[int],
        share_projection: bool = False,
        temperature: float = 1.0,
        temperature_squared: bool = False,
        hard_label_weight: float = 0.0,
        regression: bool = False,
    ):
        super().__init__()
        unknown = set(terms) - set(INTERMEDIATE_TERMS + PREDICTION_TERMS)
        if unknown:
            raise ValueError(f"unknown loss terms {sorted(unknown)}; use {INTERMEDIATE_TERMS + PREDICTION_TERMS}")
        num_student_layers = student.config.num_hidden_layers
        if len(layer_map) != num_student_layers:
            raise ValueError(f"layer_map has {len(layer_map)} entries for a {num_student_layers}-layer student")
        self.teacher = teacher.eval().requires_grad_(False)
        self.terms = dict(terms)
        self.layer_map = list(layer_map)
        self.temperature = temperature
        self.temperature_squared = temperature_squared
        self.hard_label_weight = hard_label_weight
        self.regression = regression
        self.needs_intermediate = any(t in self.terms for t in INTERMEDIATE_TERMS)
        if "attention" in self.terms:
            # The frozen teacher: SDPA everywhere, scores by one more matmul at the mapped layers only.
            check_capture(teacher, [g - 1 for g in self.layer_map], fused=True, role="teacher")
            check_capture(student, role="student")
        elif self.needs_intermediate:  # hidden states only: still refuse models that cannot be matched layer by layer
            for role, model in (("teacher", teacher), ("student", student)):
                if (reason := capture_support(model.config)) is not None:
                    raise CaptureError(f"{role}: {reason}")
        self.trainable = nn.ModuleDict(
            {"student": student, "projections": self._projections(student, teacher, share_projection)}
        )

    def _projections(self, student: nn.Module, teacher: nn.Module, share: bool) -> nn.ModuleDict:
        h_s, h_t = student.config.hidden_size, teacher.config.hidden_size
        if h_s == h_t or not self.needs_intermediate:
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
        capture_attention = "attention" in self.terms
        teacher = None
        if self.needs_intermediate or "teacher_logits" not in batch:  # cached logits skip the teacher forward
            with torch.no_grad():
                teacher = run_model(self.teacher, batch, self.needs_intermediate, capture_attention)
        student = run_model(self.trainable["student"], batch, self.needs_intermediate, capture_attention)
        mask = batch["attention_mask"]
        # The teacher's outputs were made for this step alone: a loss may write into them when nothing else reads
        # them (each teacher layer mapped once), which saves a (B, A, T, T) buffer per layer.
        once = len(set(self.layer_map)) == len(self.layer_map)
        values: dict[str, torch.Tensor] = {}
        if "embedding" in self.terms:
            values["embedding"] = hidden_loss(
                student.hidden_states[0], teacher.hidden_states[0], mask, self.projection("embedding"), True
            )
        if "hidden" in self.terms:
            values["hidden"] = sum(
                hidden_loss(student.hidden_states[m], teacher.hidden_states[g], mask, self.projection("hidden"), once)
                for m, g in enumerate(self.layer_map, start=1)
            )
        if capture_attention:
            values["attention"] = sum(
                attention_loss(student.attentions[m - 1], teacher.attentions[g - 1], mask, once)
                for m, g in enumerate(self.layer_map, start=1)
            )
        if "prediction" in self.terms:
            teacher_logits = batch["teacher_logits"] if teacher is None else teacher.logits
            values["prediction"] = prediction_loss(
                student.logits,
                teacher_logits,
                self.temperature,
                self.temperature_squared,
                self.regression,
                batch.get("labels"),
                self.hard_label_weight,
            )
        loss = sum(self.terms[name] * value for name, value in values.items())
        return loss, {name: value.detach() for name, value in values.items()}
