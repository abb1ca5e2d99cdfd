"""Capture what distillation needs from a `transformers` encoder: logits, hidden states, pre-softmax attention scores.

Shapes: B batch, T tokens, H hidden size, A heads, L layers, d head size, C classes.

`transformers` returns post-softmax attention probabilities, but TinyBERT's attention loss (Jiao et al., 2020, Eq. 7
and the reference code) uses the pre-softmax scores QKᵀ/√d. Instead of forking model code we register an attention
function with the `transformers` attention interface that computes the usual eager attention and returns the scores
in place of the probabilities, so ``output_attentions=True`` yields scores. BERT, RoBERTa, ALBERT, ELECTRA and other
encoders that dispatch through the interface work unchanged.

A custom name registered only with ``AttentionInterface`` is given ``attention_mask=None`` (padding silently
attended), so the eager mask function is registered under the same name with ``AttentionMaskInterface``; with both,
logits equal those of ``attn_implementation="eager"`` exactly (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

SCORES_ATTENTION = "tinydistill_scores"


def attention_with_scores(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention that returns the pre-softmax scores instead of the probabilities.

    Args:
        query, key, value: (B, A, T, d).
        attention_mask: additive mask broadcastable to (B, A, T, T) (0 keep, large negative drop), or None.
        scaling: score scale, 1/√d when None.
        dropout: dropout probability on the attention probabilities (training only).

    Returns:
        (output (B, T, A, d), scores (B, A, T, T)): scores are QKᵀ·scaling without the mask added. The module's
        ``capture_mode`` (set by :func:`enable_score_capture`) chooses how: "eager" (default) computes eager
        attention exactly as `transformers` does and returns its scores; "fused" takes the output from the SDPA
        kernel and the scores from one more matmul (faster for a frozen teacher; equal to eager up to float
        rounding); "off" returns the SDPA output and no scores.
    """
    mode = getattr(module, "capture_mode", "eager")
    if mode in ("off", "fused"):  # the fused SDPA kernel for the output
        kwargs.pop("output_attentions", None)
        output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                           scaling=scaling, **kwargs)
        if mode == "off":  # a layer whose scores are not needed
            return output, None
        scale = query.size(-1) ** -0.5 if scaling is None else scaling
        return output, torch.matmul(query * scale, key.transpose(2, 3))  # scaling the smaller (B, A, T, d) side
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    masked = scores if attention_mask is None else scores + attention_mask
    probs = nn.functional.softmax(masked, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return output, scores


AttentionInterface.register(SCORES_ATTENTION, attention_with_scores)
AttentionMaskInterface.register(SCORES_ATTENTION, eager_mask)


class CaptureError(RuntimeError):
    """The model cannot be captured for distillation (its attention does not dispatch through the interface)."""


def enable_score_capture(model: nn.Module, layers: list[int] | None = None, fused: bool = False) -> nn.Module:
    """Switch ``model`` to the score-returning attention; ``output_attentions=True`` then gives pre-softmax scores.

    Args:
        model: a `transformers` encoder whose attention dispatches through the attention interface.
        layers: 0-based indices of the layers whose scores are needed (None: all). The other layers run the fused
            SDPA kernel; :func:`run_model` returns None for them.
        fused: captured layers take their output from SDPA and their scores from a separate QKᵀ matmul instead of
            running eager attention. Faster for a frozen teacher; outputs equal eager attention up to float
            rounding, not bit for bit. The student keeps eager attention (``fused=False``), whose logits equal
            ``attn_implementation="eager"`` exactly.

    The setting is not saved by ``save_pretrained``: a saved model loads with its default attention.

    Raises:
        CaptureError: the model does not support custom attention functions.
    """
    try:
        model.set_attn_implementation(SCORES_ATTENTION)
    except (ValueError, KeyError, AttributeError) as error:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise CaptureError(
            f"cannot capture attention scores of model type {model_type!r}: its attention does not dispatch through "
            f"the transformers attention interface ({error}). Supported: BERT-style encoders such as bert, roberta, "
            "albert, electra."
        ) from error
    num_layers = model.config.num_hidden_layers
    captured = list(range(num_layers)) if layers is None else sorted(set(layers))
    for module in model.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            module.capture_mode = ("fused" if fused else "eager") if module.layer_idx in captured else "off"
    model.captured_layers = captured
    return model


@dataclass
class ModelOutputs:
    """One standard record of a model's outputs, the only thing losses see.

    Attributes:
        logits: (B, C) classification logits, or (B, 1) for regression; None for a bare encoder.
        hidden_states: L+1 tensors (B, T, H); index 0 is the embedding output.
        attentions: L entries, (B, A, T, T) pre-softmax scores QKᵀ/√d of each captured layer, None for the others.
        attention_mask: (B, T), 1 for real tokens, 0 for padding.
    """

    logits: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...]
    attentions: tuple[torch.Tensor, ...]
    attention_mask: torch.Tensor


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def run_model(model: nn.Module, batch: dict, hidden_states: bool = True, attentions: bool = True) -> ModelOutputs:
    """Forward ``model`` on ``batch`` and fill a :class:`ModelOutputs`.

    Only the model inputs are passed (``input_ids``, ``attention_mask``, ``token_type_ids`` when the model has
    token types); labels are ignored so no loss is computed inside the model.
    """
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if "token_type_ids" in inputs and getattr(model.config, "type_vocab_size", 0) <= 1:
        inputs.pop("token_type_ids")  # RoBERTa-style models have a single token type
    outputs = model(**inputs, output_hidden_states=hidden_states, output_attentions=attentions)
    returned = tuple(outputs.attentions or ())
    captured = getattr(model, "captured_layers", None)
    if returned and captured is not None and len(captured) < model.config.num_hidden_layers:
        by_layer = dict(zip(captured, returned))  # transformers leaves out the layers that returned no scores
        returned = tuple(by_layer.get(i) for i in range(model.config.num_hidden_layers))
    return ModelOutputs(
        logits=getattr(outputs, "logits", None),
        hidden_states=tuple(outputs.hidden_states or ()),
        attentions=returned,
        attention_mask=batch["attention_mask"],
    )
