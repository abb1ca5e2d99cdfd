"""Capture what distillation needs from a `transformers` encoder: logits, hidden states, pre-softmax attention scores.

Shapes: B batch, T tokens, H hidden size, A heads, L layers, d head size, C classes.

`transformers` returns post-softmax attention probabilities, but TinyBERT's attention loss (Jiao et al., 2020, Eq. 7
and the reference code) uses the pre-softmax scores QKᵀ/√d. Instead of forking model code we register an attention
function with the `transformers` attention interface that computes the usual eager attention and returns the scores
in place of the probabilities, so ``output_attentions=True`` yields scores. BERT, RoBERTa, ALBERT, ELECTRA and other
encoders that dispatch through the interface work unchanged.

A custom name registered only with ``AttentionInterface`` is given ``attention_mask=None`` (padding silently
attended), so the eager mask function is registered under the same name with ``AttentionMaskInterface``; with both,
logits equal those of ``attn_implementation="eager"`` to float rounding (tested).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

SCORES_ATTENTION = "tinydistill_scores"


class ScoresAttention(torch.autograd.Function):
    """Eager attention that also returns its pre-softmax scores, with a hand-written backward.

    Forward: S = (Q·scaling)Kᵀ, P = softmax(S + mask) (in float32, as `transformers`' eager attention), dropout on P,
    O = P_drop·V. Backward takes gradients for both O and S (the attention loss's) and adds them into one dS. Generic
    autograd over the same ops makes about twice as many (B, A, T, T) buffers (the scaled and masked scores, a gradient
    per op) and recomputes nothing less; on the 4-layer student that was 7% of a training step, and bernoulli_-based
    dropout another 2% (bench/distill_throughput.py). Saved for backward, as in eager attention: Q·scaling, K, V, P,
    P_drop and the dropout mask.

    Scaling the (B, A, T, d) query instead of the (B, A, T, T) scores rounds differently from `transformers`' eager
    attention: outputs agree to float rounding (about 1e-7 relative in float32), not bit for bit.
    """

    @staticmethod
    def forward(ctx, query, key, value, attention_mask, scaling: float, dropout: float):
        # Q, K and V arrive as (B, A, T, d) views of (B, T, A, d) projections, which every batched matmul would copy
        # again (forward and backward): make them contiguous once, the query in the same pass as its scaling.
        scaled_query = torch.mul(query, scaling, out=query.new_empty(query.shape))
        key, value = key.contiguous(), value.contiguous()
        scores = torch.matmul(scaled_query, key.transpose(2, 3))  # (B, A, T, T)
        masked = scores if attention_mask is None else scores + attention_mask
        probs = torch.softmax(masked, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
        del masked
        keep = dropped = probs
        if dropout > 0:  # keep: 1/(1 - p) with probability 1 - p, else 0 (uniform draws: cheaper than bernoulli_ on CPU)
            keep = torch.rand_like(probs, dtype=torch.float32).lt_(1 - dropout).to(probs.dtype).div_(1 - dropout)
            dropped = probs * keep
        output = torch.matmul(dropped, value)  # (B, A, T, d)
        ctx.save_for_backward(scaled_query, key, value, probs, dropped, keep if dropout > 0 else None)
        ctx.scaling = scaling
        return output, scores

    @staticmethod
    def backward(ctx, grad_output, grad_scores):
        scaled_query, key, value, probs, dropped, keep = ctx.saved_tensors
        grad_value = grad_query = grad_key = None
        if grad_output is not None:
            grad_output = grad_output.contiguous()  # a transposed view; used by two matmuls
            grad_probs = torch.matmul(grad_output, value.transpose(2, 3))
            if keep is not None:
                grad_probs.mul_(keep)
            grad_value = torch.matmul(dropped.transpose(2, 3), grad_output)
            grad = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
            del grad_probs
            if grad_scores is not None:
                grad.add_(grad_scores)
        else:
            grad = grad_scores
        if grad is not None:
            grad_query = torch.matmul(grad, key).mul_(ctx.scaling)
            grad_key = torch.matmul(grad.transpose(2, 3), scaled_query)
        return grad_query, grad_key, grad_value, None, None, None


class QKVSink:
    """Keeps the query, key and value projections of chosen layers during one forward pass (the MiniLMv2 relation
    loss reads them). Attention modules append to it in call order, which is layer order in an encoder (ALBERT's
    shared module is called once per layer too).

    Args:
        layers: 0-based indices of the layers to keep.
    """

    def __init__(self, layers: list[int]):
        self.layers = set(layers)
        self.calls, self.kept = 0, {}

    def add(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Record one layer's (B, A, T, d) query, key and value (scaling not applied)."""
        if self.calls in self.layers:
            self.kept[self.calls] = (query, key, value)
        self.calls += 1

    def take(self) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The kept layers' (query, key, value), each reshaped to (B, T, A·d); the sink is emptied."""
        kept, self.kept, self.calls = self.kept, {}, 0
        return {i: tuple(t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in qkv) for i, qkv in kept.items()}


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
        attention through :class:`ScoresAttention`; "fused" takes the output from the SDPA kernel and the scores
        from one more matmul (faster for a frozen teacher); "off" returns the SDPA output and no scores. All three
        equal `transformers`' eager attention up to float rounding.
    """
    mode = getattr(module, "capture_mode", "eager")
    sink = getattr(module, "qkv_sink", None)
    if sink is not None:
        sink.add(query, key, value)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if mode in ("off", "fused"):  # the fused SDPA kernel for the output
        kwargs.pop("output_attentions", None)
        output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                           scaling=scaling, **kwargs)
        if mode == "off":  # a layer whose scores are not needed
            return output, None
        return output, torch.matmul(query * scaling, key.transpose(2, 3))  # scaling the smaller (B, A, T, d) side
    output, scores = ScoresAttention.apply(query, key, value, attention_mask, scaling,
                                           dropout if module.training else 0.0)
    return output.transpose(1, 2).contiguous(), scores


AttentionInterface.register(SCORES_ATTENTION, attention_with_scores)
AttentionMaskInterface.register(SCORES_ATTENTION, eager_mask)


class CaptureError(RuntimeError):
    """The model cannot be captured for distillation (its attention does not dispatch through the interface)."""


# Families tested as teachers and students (tests/test_families.py); any other encoder whose attention dispatches
# through the attention interface passes the capture check too.
SUPPORTED = ("bert", "roberta", "xlm-roberta", "camembert", "albert", "electra", "distilbert", "ernie")
# Not BERT-style encoders: no per-layer attention maps over one token sequence to match (decoders, encoder-decoders,
# recurrence-memory models), or attention outside the interface (DeBERTa's disentangled attention, MPNet's relative
# bias). Refused for intermediate-layer distillation with this message; the prediction step alone works for them.
NOT_CAPTURABLE = {
    "xlnet": "a permutation-LM with two-stream attention",
    "transfo-xl": "a recurrence-memory decoder",
    "gpt2": "a decoder (causal attention)",
    "openai-gpt": "a decoder (causal attention)",
    "t5": "an encoder-decoder",
    "mt5": "an encoder-decoder",
    "bart": "an encoder-decoder",
    "deberta": "its disentangled attention does not dispatch through the attention interface",
    "deberta-v2": "its disentangled attention does not dispatch through the attention interface",
}
# Families whose attention does not dispatch through the interface but whose scores forward hooks can recompute
# (see :class:`HookedScores`), as a teacher and as a student: the hooks form the scores from the query and key the
# model computed, so a loss on them reaches the student's weights as through the model's own scores.
HOOKED = {"mpnet"}
LOGIT_ONLY_HINT = ("Logit-only distillation (the prediction step alone) still works for it: set distill.weights: "
                   "{embedding: 0, hidden: 0, attention: 0} and a student of a supported family (student.model_type: "
                   "bert) that shares the teacher's tokenizer.")


def capture_support(config) -> str | None:
    """Why a model type cannot be distilled layer by layer, as a teacher or as a student (None when it may be: the
    probe in :func:`check_capture` decides for types not listed). Reads the config only.

    Args:
        config: a `transformers` config.
    """
    model_type = getattr(config, "model_type", None)
    if model_type in NOT_CAPTURABLE:
        reason = NOT_CAPTURABLE[model_type]
    elif getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        reason = "an encoder-decoder or decoder"
    else:
        return None
    return (f"model type {model_type!r} is not a BERT-style encoder ({reason}): its hidden states and attention "
            f"scores cannot be matched layer by layer. Supported: {', '.join(SUPPORTED)} and other encoders whose "
            f"attention dispatches through the transformers attention interface, and {', '.join(sorted(HOOKED))}. "
            f"{LOGIT_ONLY_HINT}")


def enable_score_capture(model: nn.Module, layers: list[int] | None = None, fused: bool = False,
                         qkv_layers: list[int] | None = None) -> nn.Module:
    """Switch ``model`` to the score-returning attention; ``output_attentions=True`` then gives pre-softmax scores.

    Args:
        model: a `transformers` encoder whose attention dispatches through the attention interface.
        layers: 0-based indices of the layers whose scores are needed (None: all). The other layers run the fused
            SDPA kernel; :func:`run_model` returns None for them.
        fused: captured layers take their output from SDPA and their scores from a separate QKᵀ matmul instead of
            running eager attention. Faster for a frozen teacher; outputs equal eager attention up to float
            rounding. The student keeps eager attention (``fused=False``): :class:`ScoresAttention`, whose backward
            also takes the attention loss's gradient.
        qkv_layers: 0-based indices of the layers whose query, key and value projections :func:`run_model` returns
            (``ModelOutputs.qkv``, for the MiniLMv2 relation loss); None or empty: none.

    The setting is not saved by ``save_pretrained``: a saved model loads with its default attention.

    Families in :data:`HOOKED` (MPNet) keep their own attention; forward hooks recompute the scores of the captured
    layers instead (:class:`HookedScores`), which :func:`run_model` returns.

    Raises:
        CaptureError: the model does not support custom attention functions.
    """
    if getattr(model.config, "model_type", None) in HOOKED:
        num_layers = model.config.num_hidden_layers
        captured = list(range(num_layers)) if layers is None else sorted(set(layers))
        previous = getattr(model, "score_hooks", None)
        if previous is not None:
            previous.remove()
        model.score_hooks = HookedScores(model, captured, qkv_layers or [])
        model.captured_layers = captured
        return model
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
    sink = QKVSink(qkv_layers) if qkv_layers else None
    indexed = [module for module in model.modules() if isinstance(getattr(module, "layer_idx", None), int)]
    for module in indexed:
        module.capture_mode = ("fused" if fused else "eager") if module.layer_idx in captured else "off"
        module.qkv_sink = sink
    if not indexed:
        # Families whose attention modules carry no layer index (ALBERT's one shared module, DistilBERT's): every
        # layer keeps eager attention (scores of all layers computed, the captured ones read), and the sink, which
        # counts calls in layer order, is given to each module the model records attentions from.
        attention = (getattr(model, "_can_record_outputs", None) or {}).get("attentions")
        for module in model.modules():
            if isinstance(attention, type) and isinstance(module, attention):
                module.qkv_sink = sink
    model.captured_layers = captured
    model.qkv_sink = sink
    return model


class HookedScores:
    """Pre-softmax attention scores of an MPNet teacher or student, recomputed by forward hooks (no model code forked).

    MPNet's self-attention (``MPNetSelfAttention``) computes S = QKᵀ/√d + B, where B is the relative position bias
    the encoder computes once and passes to every layer, and returns softmax probabilities. Hooks on each captured
    layer's query and key projections keep their outputs; a hook on the self-attention module takes the bias from its
    inputs and forms S the way the module does (same operations, same order), so softmax(S + mask) equals the
    model's probabilities to float rounding (checked on a probe batch by :func:`check_capture`). The query/key
    outputs are the ones the model computed: capture costs one (B, A, T, T) matmul per captured layer. For a student
    in training the recomputed S is on the autograd graph of those same query, key and bias tensors, so the attention
    loss's gradient reaches the student's weights (query, key, relative position bias and everything below them) as
    it would through the module's own S (tested against a loss on the model's own probabilities).

    Args:
        model: an MPNet model (classifier or bare encoder).
        layers: 0-based indices of the layers whose scores are kept.
        qkv_layers: 0-based indices of the layers whose query, key and value projections are kept (B, T, H).
    """

    def __init__(self, model: nn.Module, layers: list[int], qkv_layers: list[int] = ()):
        self.layers, self.qkv_layers = list(layers), set(qkv_layers)
        self.num_layers = model.config.num_hidden_layers
        self.active = False
        self.scores: dict[int, torch.Tensor] = {}
        self.qkv: dict[int, tuple[torch.Tensor, ...]] = {}
        self._projections: dict[tuple[int, str], torch.Tensor] = {}
        self.handles = []
        encoder_layers = model.base_model.encoder.layer
        for index in sorted(set(self.layers) | self.qkv_layers):
            attention = encoder_layers[index].attention.attn
            for name in ("q", "k", "v"):
                self.handles.append(getattr(attention, name).register_forward_hook(self._keep(index, name)))
            self.handles.append(attention.register_forward_hook(self._scores(index, attention), with_kwargs=True))

    def _keep(self, index: int, name: str):
        def hook(module, args, output):
            if self.active:
                self._projections[(index, name)] = output
        return hook

    def _scores(self, index: int, attention: nn.Module):
        head_size = attention.attention_head_size

        def hook(module, args, kwargs, output):
            if not self.active:
                return
            query = self._projections.pop((index, "q"))
            key = self._projections.pop((index, "k"))
            value = self._projections.pop((index, "v"))
            if index in self.qkv_layers:
                self.qkv[index] = (query, key, value)
            if index not in self.layers:
                return
            shape = (*query.shape[:-1], -1, head_size)
            query, key = query.view(shape).transpose(1, 2), key.view(shape).transpose(1, 2)
            scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(head_size)
            bias = kwargs.get("position_bias", args[2] if len(args) > 2 else None)
            if bias is not None:
                scores += bias
            self.scores[index] = scores
        return hook

    @contextmanager
    def recording(self, enabled: bool = True):
        """Keep the scores of the forward passes run inside (when ``enabled``)."""
        self.active, self.scores, self.qkv = enabled, {}, {}
        try:
            yield self
        finally:
            self.active = False
            self._projections.clear()

    def collect(self) -> tuple[torch.Tensor | None, ...]:
        """L entries: the captured layers' scores (B, A, T, T), None for the others."""
        scores, self.scores = self.scores, {}
        return tuple(scores.get(i) for i in range(self.num_layers))

    def take_qkv(self) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The kept layers' (query, key, value) projections, (B, T, H) each."""
        qkv, self.qkv = self.qkv, {}
        return qkv

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@dataclass
class ModelOutputs:
    """One standard record of a model's outputs, the only thing losses see.

    Attributes:
        logits: the head's output as the task type reads it: (B, C) per example, (B, T, C) per token (a head of
            several outputs stacked in the last dimension); None for a bare encoder.
        hidden_states: L+1 tensors (B, T, H); index 0 is the embedding output.
        attentions: L entries, (B, A, T, T) pre-softmax scores QKᵀ/√d of each captured layer, None for the others.
        attention_mask: (B, T), 1 for real tokens, 0 for padding: one row a sequence through the encoder (a
            multiple-choice batch's (B, C, T) mask flattened to (B × C, T), as the hidden states are).
        qkv: {0-based layer: (query, key, value)}, each (B, T, H), for the layers asked for with ``qkv_layers``.
    """

    logits: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...]
    attentions: tuple[torch.Tensor, ...]
    attention_mask: torch.Tensor
    qkv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def default_logits(outputs) -> torch.Tensor | None:
    """``outputs.logits`` ((B, C) or (B, T, C)); None for a bare encoder or a head of other outputs."""
    return getattr(outputs, "logits", None)


def run_model(model: nn.Module, batch: dict, hidden_states: bool = True, attentions: bool = True,
              logits: Callable[[Any], torch.Tensor | None] = default_logits,
              flatten: Callable[[dict], dict] | None = None) -> ModelOutputs:
    """Forward ``model`` on ``batch`` and fill a :class:`ModelOutputs`; ``logits`` reads the head's output from the
    model's (the task type's :meth:`~distill.tasks.TaskType.logits`, given by the objective's head); ``flatten``
    gives the batch's inputs as the encoder reads them, one row a sequence (the task type's
    :meth:`~distill.tasks.TaskType.encoder_inputs`; None: (B, T) inputs as they are), whose mask is recorded.

    Only the model inputs are passed (``input_ids``, ``attention_mask``, ``token_type_ids`` when the model has
    token types), in the batch's own layout; labels are ignored so no loss is computed inside the model.
    """
    mask = (flatten(batch) if flatten is not None else batch)["attention_mask"]
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if "token_type_ids" in inputs and getattr(model.config, "type_vocab_size", 0) <= 1:
        inputs.pop("token_type_ids")  # RoBERTa-style models have a single token type
    hooks = getattr(model, "score_hooks", None)
    if hooks is not None:  # scores from forward hooks; the model's own attention probabilities are not needed
        with hooks.recording(attentions or bool(hooks.qkv_layers)):
            outputs = model(**inputs, output_hidden_states=hidden_states, output_attentions=False)
            qkv = hooks.take_qkv()
        return ModelOutputs(
            logits=logits(outputs),
            hidden_states=tuple(outputs.hidden_states or ()),
            attentions=hooks.collect() if attentions else (),
            attention_mask=mask,
            qkv=qkv,
        )
    outputs = model(**inputs, output_hidden_states=hidden_states, output_attentions=attentions)
    returned = tuple(outputs.attentions or ())
    captured = getattr(model, "captured_layers", None)
    if returned and captured is not None and len(returned) == len(captured) < model.config.num_hidden_layers:
        # transformers leaves out the layers that returned no scores. (Models whose layers share one attention module,
        # as ALBERT's, cannot switch capture per layer: every layer returns scores and nothing is left out.)
        by_layer = dict(zip(captured, returned))
        returned = tuple(by_layer.get(i) for i in range(model.config.num_hidden_layers))
    sink = getattr(model, "qkv_sink", None)
    return ModelOutputs(
        logits=logits(outputs),
        hidden_states=tuple(outputs.hidden_states or ()),
        attentions=returned,
        attention_mask=mask,
        qkv=sink.take() if sink is not None else {},
    )


@torch.no_grad()
def check_capture(model: nn.Module, layers: list[int] | None = None, fused: bool = False, role: str = "model",
                  qkv_layers: list[int] | None = None, head=None) -> None:
    """Enable score capture on ``model`` and check it on a probe batch, once, before any training.

    The model runs the probe with ``attn_implementation="eager"`` (its standard output: hidden states, attention
    probabilities, logits), then with capture on. The captured run must return L + 1 hidden states of shape
    (B, T, H), an attention map (B, A, T, T) for every captured layer whose softmax (padding masked) equals the eager
    probabilities, and the eager logits (to float rounding).

    With ``qkv_layers``, each of those layers must also return its query, key and value projections (B, T, H), and
    (for families whose attention goes through the interface) softmax of the per-head query-key products must equal
    the eager probabilities too.

    Args:
        model: a `transformers` encoder (classifier or bare).
        layers, fused, qkv_layers: as :func:`enable_score_capture`.
        role: "teacher" or "student", for the message.
        head: the objective's head (:class:`distill.method.objective.PredictionHead`), whose ``example_inputs`` give
            the probe in the task type's input layout and ``encoder_inputs`` flatten it to the encoder's rows; None:
            a (B, T) probe.

    Raises:
        CaptureError: the family is not a BERT-style encoder (see :func:`capture_support`), or the probe found
            something missing or different; the message names the model type and what.
    """
    config = model.config
    model_type = getattr(config, "model_type", type(model).__name__)
    reason = capture_support(config)
    if reason is not None:
        raise CaptureError(f"{role}: {reason}")
    was_training = model.training
    model.eval()
    probe = _probe_batch(config, next(model.parameters()).device, head)
    flat = head.encoder_inputs(probe) if head is not None and hasattr(head, "encoder_inputs") else probe
    try:
        model.set_attn_implementation("eager")
    except (ValueError, KeyError, AttributeError):
        pass  # enable_score_capture below gives the message
    reference = model(**probe, output_hidden_states=True, output_attentions=True)
    enable_score_capture(model, layers, fused, qkv_layers)
    captured = run_model(model, probe, flatten=(lambda batch: flat) if flat is not probe else None)
    outputs = model(**probe)  # every head output with capture on (logits; a QA head's start and end logits)
    if getattr(model, "qkv_sink", None) is not None:
        model.qkv_sink.take()  # that forward's projections: the sink must start the next one empty
    model.train(was_training)

    def fail(what: str):
        raise CaptureError(f"{role}: model type {model_type!r} cannot be distilled layer by layer: {what}. Supported: "
                           f"{', '.join(SUPPORTED)} and other encoders whose attention dispatches through the "
                           f"transformers attention interface. {LOGIT_ONLY_HINT}")

    num_layers, hidden = config.num_hidden_layers, config.hidden_size
    shape = tuple(flat["input_ids"].shape)  # (N, T): the sequences through the encoder
    if len(captured.hidden_states) != num_layers + 1:
        fail(f"it returns {len(captured.hidden_states)} hidden states, expected {num_layers + 1} (embeddings + "
             f"{num_layers} layers)")
    if any(tuple(h.shape) != (*shape, hidden) for h in captured.hidden_states):
        fail(f"hidden states of shape {[tuple(h.shape) for h in captured.hidden_states]}, expected {(*shape, hidden)}")
    wanted = range(num_layers) if layers is None else sorted(set(layers))
    mask = flat["attention_mask"].bool()[:, None, None, :]
    for i in wanted:
        scores = captured.attentions[i] if i < len(captured.attentions) else None
        if scores is None:
            fail(f"no attention scores for layer {i + 1}")
        if scores.shape[0] != shape[0] or scores.shape[-2:] != (shape[1], shape[1]):
            fail(f"attention scores of layer {i + 1} have shape {tuple(scores.shape)}, expected (B, A, T, T)")
        probs = torch.softmax(scores.float().masked_fill(~mask, torch.finfo(torch.float32).min), dim=-1)
        expected = reference.attentions[i].float()
        if probs.shape != expected.shape or not torch.allclose(probs, expected, atol=1e-4):
            fail(f"layer {i + 1} returns attention that is not the pre-softmax scores QK^T/sqrt(d) of its eager "
                 "attention (its attention does not go through the attention interface)")
    heads = config.num_attention_heads
    for i in qkv_layers or []:
        if i not in captured.qkv or any(tuple(t.shape) != (*shape, hidden) for t in captured.qkv[i]):
            fail(f"no query, key and value projections of shape {(*shape, hidden)} for layer {i + 1}")
        if model_type in HOOKED:
            continue  # its scores add a position bias to QK^T: checked through the scores above
        query, key, _ = (t.view(*shape, heads, -1).transpose(1, 2) for t in captured.qkv[i])
        products = torch.matmul(query, key.transpose(-1, -2)) * query.shape[-1] ** -0.5
        probs = torch.softmax(products.float().masked_fill(~mask, torch.finfo(torch.float32).min), dim=-1)
        if not torch.allclose(probs, reference.attentions[i].float(), atol=1e-4):
            fail(f"the query and key projections captured at layer {i + 1} do not give its attention")
    tolerance = 1e-4 if fused else 1e-5
    for name, expected in reference.items():
        if name in ("hidden_states", "attentions") or not isinstance(expected, torch.Tensor):
            continue
        found = outputs[name]
        if not torch.allclose(found, expected, atol=tolerance):
            fail(f"its {name} with capture differ from eager ones by {float((found - expected).abs().max()):.2e}")


def _probe_batch(config, device, head=None) -> dict:
    """Two examples of 8 tokens, the second with 3 padding positions; ids drawn from a fixed generator. With ``head``
    (its ``example_inputs``), in the task type's input layout (a multiple-choice example: each choice so)."""
    generator = torch.Generator().manual_seed(0)
    if head is not None and hasattr(head, "example_inputs"):
        probe = {k: v.clone() for k, v in head.example_inputs(config, 2, 8, generator).items()}
    else:
        low = min(5, config.vocab_size - 1)
        ids = torch.randint(low, config.vocab_size, (2, 8), generator=generator)
        probe = {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    probe["attention_mask"][1, ..., 5:] = 0
    return {k: v.to(device) for k, v in probe.items()}
