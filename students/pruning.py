"""Students pruned from their fine-tuned teacher: importance on a calibration sample, then structural pruning.

The student keeps the teacher's knowledge at the student's size: its layers are teacher layers (the layer map, or
the layers whose removal changes the hidden states most), and in every kept layer it keeps the teacher's most
important residual-stream channels, per-head query/key and value dimensions (or whole heads) and FFN neurons.
Distillation then recovers what pruning lost. Method: Minitron (Muralidharan et al., 2024, "Compact Language Models
via Pruning and Knowledge Distillation", §2.2: activation-based importance of heads, neurons and embedding channels
on a small calibration set, then distillation); layer removal by how much a layer changes its input (ShortGPT, Men et
al., 2024, "block influence"); heads by the norm of their output (Michel et al., 2019).

Our choices:
- Residual channels are one index set for the whole model (embeddings, every LayerNorm, every layer's inputs and
  outputs, the head's input), scored by the mean |value| of the embedding output and of the kept layers' outputs
  (LayerNorm outputs in post-LN encoders), summed.
- Per head, query and key keep the same dimensions (their dot product), scored by mean|q_d| · mean|k_d| per
  example; value and the output projection's columns keep the same ones, scored by mean|context_d| · ‖W_O[:, d]‖
  (the dimension's share of the attention output). A head's score is the mean L2 norm of its context.
- FFN neurons by the mean |activation| after the non-linearity; a head-side hidden-width output (a pooler, RoBERTa's
  classifier.dense) by the mean |output|.

The surgery (removing the channels everywhere they enter or leave) uses torch-pruning's dependency graph (Fang et al.,
2023, "DepGraph") for the residual stream, the FFN and head-side groups; query/key and value/output dimensions are
removed with its per-layer functions, since its graph couples all four to one index set. The pruned weights are then
loaded into a plain ``transformers`` model of the student's config (``load_state_dict(strict=True)``), so the result
is a standard checkpoint of the teacher's family.

Shapes: a plain config ties the attention width to the hidden size (heads × head size = hidden size), so the
reachable shapes are those with heads ≤ the teacher's, head size ≤ the teacher's, hidden ≤ the teacher's, FFN ≤ the
teacher's, layers ≤ the teacher's (:func:`check_reachable`).
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

logger = logging.getLogger(__name__)

# Attention projections (query, key, value, output) and FFN layers (in, out), relative to an encoder layer.
ATTENTION_PROJECTIONS = {
    "mpnet": ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o"),
    "distilbert": ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
}
BERT_ATTENTION = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
FFN_LAYERS = {"distilbert": ("ffn.lin1", "ffn.lin2")}
BERT_FFN = ("intermediate.dense", "output.dense")
# Families whose layers share weights (ALBERT) cannot keep different channels per layer.
UNPRUNABLE = {"albert": "its layers share one set of weights"}
# Families with a per-head parameter shared by all layers (MPNet's relative position bias): heads cannot differ
# between layers, so only head dimensions are pruned.
SHARED_HEAD_PARAMETERS = {"mpnet"}


class PruningError(ValueError):
    """A student shape that pruning cannot reach, or a model it cannot prune (the message says what to change)."""


def encoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The model's list of transformer layers (``encoder.layer``, DistilBERT's ``transformer.layer``)."""
    base = model.base_model
    for path in ("encoder.layer", "transformer.layer"):
        try:
            return base.get_submodule(path)
        except AttributeError:
            continue
    raise PruningError(f"model type {model.config.model_type!r}: no encoder.layer or transformer.layer to prune")


def layer_modules(model: PreTrainedModel, index: int) -> dict[str, nn.Linear]:
    """Layer ``index``'s (0-based) query, key, value, output, ffn_in and ffn_out linear layers."""
    model_type = model.config.model_type
    names = (*ATTENTION_PROJECTIONS.get(model_type, BERT_ATTENTION), *FFN_LAYERS.get(model_type, BERT_FFN))
    layer = encoder_layers(model)[index]
    modules = {}
    for role, name in zip(("query", "key", "value", "output", "ffn_in", "ffn_out"), names):
        try:
            module = layer.get_submodule(name)
        except AttributeError:
            module = None
        if not isinstance(module, nn.Linear):
            raise PruningError(f"model type {model_type!r}: pruning does not know its layer layout (no linear "
                               f"{name!r} in layer {index}); supported: BERT-style encoders, MPNet, DistilBERT")
        modules[role] = module
    return modules


def head_outputs(model: PreTrainedModel) -> dict[str, nn.Linear]:
    """Hidden-to-hidden linear layers outside the encoder layers (a pooler, RoBERTa's
    ``classifier.dense``, DistilBERT's ``pre_classifier``): free dimensions a student config sizes as hidden_size."""
    hidden = model.config.hidden_size
    inside = {id(m) for m in encoder_layers(model).modules()}
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and id(module) not in inside and module.in_features == hidden
            and module.out_features == hidden}


@dataclass
class Importance:
    """Activation importance of a teacher's prunable units on a calibration sample (float32, on the CPU).

    Attributes:
        residual: (L + 1, H) mean |value| of each residual channel in the embedding output (row 0) and each layer's
            output.
        query_key: (L, A·d) per query/key dimension: mean over examples of mean|q_d| · mean|k_d| over real tokens.
        value: (L, A·d) per value dimension: mean |context_d| over real tokens times ‖W_O[:, d]‖.
        heads: (L, A) mean L2 norm of each head's context (its attention output before the output projection).
        ffn: (L, I) mean |activation| of each FFN neuron after the non-linearity.
        layer_change: (L,) mean over real tokens of 1 - cos(input, output) of each layer.
        outputs: {module name: (H,)} mean |output| of each head-side linear of hidden width.
        num_examples: examples of the calibration sample; num_tokens: its real tokens.
    """

    residual: torch.Tensor
    query_key: torch.Tensor
    value: torch.Tensor
    heads: torch.Tensor
    ffn: torch.Tensor
    layer_change: torch.Tensor
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    num_examples: int = 0
    num_tokens: int = 0

    TENSORS = ("residual", "query_key", "value", "heads", "ffn", "layer_change")

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Flat tensors for ``safetensors`` (the counts as 0-d int64 tensors)."""
        tensors = {name: getattr(self, name).contiguous() for name in self.TENSORS}
        tensors.update({f"outputs.{name}": value.contiguous() for name, value in self.outputs.items()})
        tensors["num_examples"] = torch.tensor(self.num_examples)
        tensors["num_tokens"] = torch.tensor(self.num_tokens)
        return tensors

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "Importance":
        outputs = {name[len("outputs."):]: value for name, value in tensors.items() if name.startswith("outputs.")}
        return cls(**{name: tensors[name] for name in cls.TENSORS}, outputs=outputs,
                   num_examples=int(tensors["num_examples"]), num_tokens=int(tensors["num_tokens"]))


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
CRITERIA = ("activation", "taylor")


def compute_importance(model: PreTrainedModel, batches: Iterable[dict], device: torch.device | str = "cpu",
                       criterion: str = "activation") -> Importance:
    """Importance of ``model``'s units on ``batches``.

    ``criterion`` "activation": the magnitude of each unit's activations (Minitron, Muralidharan et al., 2024, §2.2).
    "taylor": the first-order Taylor estimate of the change in the model's own loss on the gold labels when the unit
    is removed, |a · ∂L/∂a| per activation (Molchanov et al., 2019, "Importance Estimation for Neural Network
    Pruning", Eq. 4 on activations), summed over real tokens like the magnitudes; a query/key dimension scores the
    sum of its query's and its key's. Layer change (for depth) is the same under both.

    Args:
        model: a fine-tuned encoder with a head (or a bare encoder), any family :func:`layer_modules` knows; its
            ``requires_grad`` flags are restored after a Taylor pass.
        batches: padded model inputs, ``input_ids`` and ``attention_mask`` (B, T) or in the task type's layout (a
            multiple-choice batch (B, C, T), whose choices are the encoder's rows), ``token_type_ids`` optional; for
            "taylor" also the labels the model's own loss reads (``labels``, or QA's ``start_positions`` and
            ``end_positions``).
        device: where the forward (and backward) passes run.
        criterion: "activation" or "taylor".

    Returns:
        The :class:`Importance` of every layer's units (all layers: the plan picks the kept ones).

    Raises:
        PruningError: a family pruning does not support; ValueError: an unknown criterion, a Taylor batch without
            labels, or no real token.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"importance criterion must be {' or '.join(CRITERIA)}, got {criterion!r}")
    taylor = criterion == "taylor"
    model = model.to(device).eval()
    num_layers = model.config.num_hidden_layers
    heads = model.config.num_attention_heads
    layers = [layer_modules(model, i) for i in range(num_layers)]
    outputs_modules = head_outputs(model)
    accepts = set(inspect.signature(model.forward).parameters)
    sums: dict[str, torch.Tensor] = {}
    state = {"mask": None, "lengths": None}

    def add(name: str, value: torch.Tensor) -> None:
        value = value.detach().float().cpu()
        sums[name] = sums[name] + value if name in sums else value

    def token_sum(tensor: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (D,) summed over real tokens
        return (tensor * state["mask"]).sum(dim=(0, 1))

    def per_example_mean(tensor: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, D) mean over real tokens
        return (tensor * state["mask"]).sum(dim=1) / state["lengths"]

    kept: dict[tuple, torch.Tensor] = {}
    handles = []
    for index, modules in enumerate(layers):
        for role in ("query", "key"):
            handles.append(modules[role].register_forward_hook(
                lambda module, args, output, index=index, role=role: kept.__setitem__((index, role), output)))
        handles.append(modules["output"].register_forward_pre_hook(
            lambda module, args, index=index: kept.__setitem__((index, "context"), args[0])))
        handles.append(modules["ffn_out"].register_forward_pre_hook(
            lambda module, args, index=index: kept.__setitem__((index, "ffn"), args[0])))
    for name, module in outputs_modules.items():
        handles.append(module.register_forward_hook(
            lambda module, args, output, name=name: kept.__setitem__(("outputs", name), output)))
    output_counts: dict[str, str] = {}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    num_examples = num_tokens = 0
    try:
        if taylor:
            model.requires_grad_(True)  # so that the activations are on a graph; only their gradients are taken
        for batch in batches:
            inputs = {k: batch[k].to(device) for k in MODEL_INPUTS if k in batch}
            if "token_type_ids" in inputs and getattr(model.config, "type_vocab_size", 0) <= 1:
                inputs.pop("token_type_ids")
            # one row a sequence through the encoder, as its hidden states are: a multiple-choice batch's (B, C, T)
            # mask is (B x C, T) there (the task type's encoder_inputs flatten it so)
            mask = inputs["attention_mask"].reshape(-1, inputs["attention_mask"].shape[-1])
            state["mask"] = mask[..., None].float()
            state["lengths"] = mask.sum(dim=1, keepdim=True).float().clamp(min=1)
            kept.clear()
            with torch.set_grad_enabled(taylor):
                labels = {k: v.to(device) for k, v in batch.items() if k in accepts and k not in MODEL_INPUTS}
                if taylor and not labels:
                    raise ValueError("importance criterion 'taylor' needs the batches' labels (the model's own loss)")
                result = model(**inputs, **(labels if taylor else {}), output_hidden_states=True)
                hidden = result.hidden_states
                tensors = {("residual", l): h for l, h in enumerate(hidden)} | kept
                if taylor:
                    grads = dict(zip(tensors, torch.autograd.grad(result.loss, list(tensors.values()),
                                                                  allow_unused=True)))
            with torch.no_grad():
                score = {key: (value.float() * grads[key].float()).abs() if taylor and grads[key] is not None
                         else value.float().abs() for key, value in tensors.items()}
                for layer in range(num_layers + 1):
                    add(f"residual.{layer}", token_sum(score[("residual", layer)]))
                for index in range(num_layers):
                    cosine = nn.functional.cosine_similarity(hidden[index].float(), hidden[index + 1].float(), dim=-1)
                    add(f"layer_change.{index}", ((1 - cosine) * mask).sum())
                    query, key = score[(index, "query")], score[(index, "key")]
                    add(f"query_key.{index}", token_sum(query + key) if taylor else
                        (per_example_mean(query) * per_example_mean(key)).sum(dim=0))
                    context = score[(index, "context")]
                    add(f"context.{index}", token_sum(context))
                    per_head = (context.reshape(*context.shape[:2], heads, -1).sum(dim=-1) if taylor else
                                kept[(index, "context")].float().reshape(*context.shape[:2], heads, -1).norm(dim=-1))
                    add(f"heads.{index}", token_sum(per_head))  # (B, T, A) -> (A,)
                    add(f"ffn.{index}", token_sum(score[(index, "ffn")]))
                for name in outputs_modules:
                    if ("outputs", name) not in score:
                        continue
                    output = score[("outputs", name)]  # (B, H) per example, or (B, T, H) per token
                    output_counts[name] = "tokens" if output.dim() == 3 else "rows"
                    add(f"outputs.{name}", token_sum(output) if output.dim() == 3 else output.sum(dim=0))
            num_examples += mask.shape[0]
            num_tokens += int(mask.sum())
    finally:
        for handle in handles:
            handle.remove()
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(flags[name])
    if num_tokens == 0:
        raise ValueError("importance: the calibration sample has no real token (no batch, or empty examples)")
    tokens = float(num_tokens)
    # Activation: a value dimension's magnitude times its output-projection column's norm; Taylor scores already
    # hold what the loss makes of it.
    output_norms = [torch.ones(1) if taylor else layers[i]["output"].weight.detach().float().norm(dim=0).cpu()
                    for i in range(num_layers)]
    return Importance(
        residual=torch.stack([sums[f"residual.{l}"] for l in range(num_layers + 1)]) / tokens,
        query_key=torch.stack([sums[f"query_key.{i}"] for i in range(num_layers)]) / (tokens if taylor else num_examples),
        value=torch.stack([sums[f"context.{i}"] / tokens * output_norms[i] for i in range(num_layers)]),
        heads=torch.stack([sums[f"heads.{i}"] for i in range(num_layers)]) / tokens,
        ffn=torch.stack([sums[f"ffn.{i}"] for i in range(num_layers)]) / tokens,
        layer_change=torch.stack([sums[f"layer_change.{i}"] for i in range(num_layers)]) / tokens,
        outputs={name: sums[f"outputs.{name}"] / (tokens if output_counts[name] == "tokens" else num_examples)
                 for name in outputs_modules if name in output_counts},
        num_examples=num_examples, num_tokens=num_tokens)


@dataclass
class PruningPlan:
    """What a pruned student keeps of its teacher (indices into the teacher's units, ascending).

    Attributes:
        layers: teacher layers kept, 1-based: the student's layer m is teacher layer ``layers[m - 1]`` (the layer map).
        residual: the h_S residual-stream channels kept.
        query_key: per kept layer, the A'·d' query/key output dimensions kept (whole heads and dimensions in them).
        value: per kept layer, the A'·d' value dimensions (the output projection's input columns) kept.
        ffn: per kept layer, the FFN neurons kept.
        outputs: {module name: hidden-width outputs kept} of the head-side linears (:func:`head_outputs`).
        heads: per kept layer, the teacher heads kept (0-based).
    """

    layers: list[int]
    residual: list[int]
    query_key: list[list[int]]
    value: list[list[int]]
    ffn: list[list[int]]
    outputs: dict[str, list[int]]
    heads: list[list[int]]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_reachable(shape: dict, teacher_config: PretrainedConfig) -> None:
    """Refuse a student shape that pruning the teacher cannot reach, naming the nearest one that it can.

    A plain `transformers` config ties the attention width to the hidden size (heads × head size = hidden size), and
    pruning can only remove: heads ≤ the teacher's A, head size d' = h_S / A' ≤ the teacher's d, h_S ≤ h_T, FFN ≤ the
    teacher's, layers ≤ the teacher's.

    Raises:
        PruningError: the first limit the shape breaks, with the nearest reachable setting.
    """
    model_type = teacher_config.model_type
    if model_type in UNPRUNABLE:
        raise PruningError(f"student.init 'pruned': cannot prune a {model_type} teacher ({UNPRUNABLE[model_type]}); "
                           "use init teacher_embeddings or random")
    from students.build import config_value

    teacher = {key: config_value(teacher_config, key) for key in
               ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")}
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads"):
        if shape[key] > teacher[key]:
            raise PruningError(f"student.{key} {shape[key]} is larger than the teacher's ({teacher[key]}): pruning "
                               f"only removes; nearest reachable: student.{key} {teacher[key]}")
    heads, hidden = shape["num_attention_heads"], shape["hidden_size"]
    teacher_heads, head_size = teacher["num_attention_heads"], teacher["hidden_size"] // teacher["num_attention_heads"]
    if hidden % heads == 0 and hidden // heads <= head_size:
        if heads < teacher_heads and model_type in SHARED_HEAD_PARAMETERS:
            raise PruningError(f"student.num_attention_heads {heads}: a {model_type} teacher shares a per-head "
                               f"relative position bias across its layers, so pruning keeps its {teacher_heads} "
                               f"heads and narrows them; set student.num_attention_heads {teacher_heads} (head size "
                               f"{hidden / teacher_heads:g})" + (
                                   "" if hidden % teacher_heads == 0 else
                                   f" with a hidden size divisible by {teacher_heads}, e.g. "
                                   f"{min(round(hidden / teacher_heads), head_size) * teacher_heads}"))
        return
    options = sorted(((abs(h * d - hidden), -h, h, d) for h in range(1, teacher_heads + 1)
                      for d in range(1, head_size + 1) if h * d <= teacher["hidden_size"]))
    _, _, near_heads, near_size = options[0]
    same_heads = min(hidden // heads, head_size) * heads
    raise PruningError(
        f"student shape hidden_size {hidden} with {heads} heads needs a head size of {hidden / heads:g}; pruning the "
        f"teacher ({teacher_heads} heads of {head_size}) reaches heads x head size with at most {teacher_heads} heads "
        f"of at most {head_size}: nearest reachable hidden_size {near_heads * near_size} with num_attention_heads "
        f"{near_heads} (head size {near_size}), or hidden_size {same_heads} with {heads} heads")


def _top(scores: torch.Tensor, count: int) -> list[int]:
    """Indices of the ``count`` highest scores, ascending (ties broken by the lower index: deterministic)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:count])


def select_layers(importance: Importance, num_layers: int) -> list[int]:
    """The ``num_layers`` teacher layers (1-based, in order) that change their input most (1 - cosine, ShortGPT's
    block influence): the layers whose removal would change the hidden states most are kept."""
    return [i + 1 for i in _top(importance.layer_change, num_layers)]


def plan_pruning(importance: Importance, teacher_config: PretrainedConfig, shape: dict, layers: list[int]
                 ) -> PruningPlan:
    """The units a student of ``shape`` keeps: per kept layer the top heads, the top query/key and value dimensions
    within each kept head and the top FFN neurons; the top residual channels over the embedding output and the kept
    layers' outputs (their importances summed, Minitron §2.2).

    Args:
        importance: the teacher's :class:`Importance`.
        teacher_config: the teacher's config.
        shape: the student's shape (:func:`students.build.student_shape`).
        layers: the teacher layers kept, 1-based (the layer map, or :func:`select_layers`).

    Raises:
        PruningError: a shape :func:`check_reachable` refuses, or ``layers`` not one per student layer.
    """
    check_reachable(shape, teacher_config)
    if len(layers) != shape["num_hidden_layers"]:
        raise PruningError(f"pruning keeps {len(layers)} teacher layers {layers} for a "
                           f"{shape['num_hidden_layers']}-layer student")
    teacher_heads = teacher_config.num_attention_heads
    head_size = teacher_config.hidden_size // teacher_heads
    heads, hidden = shape["num_attention_heads"], shape["hidden_size"]
    kept_size = hidden // heads
    residual = _top(importance.residual[[0, *layers]].sum(dim=0), hidden)
    plan = PruningPlan(layers=list(layers), residual=residual, query_key=[], value=[], ffn=[], heads=[],
                       outputs={name: _top(scores, hidden) for name, scores in importance.outputs.items()})
    for layer in layers:
        index = layer - 1
        kept_heads = (list(range(teacher_heads)) if heads == teacher_heads or teacher_config.model_type
                      in SHARED_HEAD_PARAMETERS else _top(importance.heads[index], heads))
        plan.heads.append(kept_heads)
        for name, scores in (("query_key", importance.query_key[index]), ("value", importance.value[index])):
            getattr(plan, name).append([head * head_size + d for head in kept_heads
                                        for d in _top(scores[head * head_size:(head + 1) * head_size], kept_size)])
        plan.ffn.append(_top(importance.ffn[index], shape["intermediate_size"]))
    return plan


def _removed(kept: list[int], size: int) -> list[int]:
    keep = set(kept)
    return [i for i in range(size) if i not in keep]


def probe_inputs(config: PretrainedConfig, device: torch.device | str = "cpu") -> dict:
    """Two sequences of 8 tokens for tracing (the second with padding); ids drawn from a fixed generator."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (2, 8), generator=generator)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _output_sum(outputs) -> torch.Tensor:
    """A scalar of every tensor the model returns (its head's outputs, or an encoder's states), for tracing."""
    tensors = [value for value in outputs.values() if isinstance(value, torch.Tensor)]
    if not tensors:
        raise PruningError("pruning: the model returns no tensor to trace")
    return sum(tensor.float().sum() for tensor in tensors)


def prune_model(teacher: PreTrainedModel, plan: PruningPlan, student_config: PretrainedConfig,
                example_inputs: Callable[[PretrainedConfig], dict] | None = None) -> PreTrainedModel:
    """A plain `transformers` model of ``student_config`` holding the teacher's weights that ``plan`` keeps.

    The teacher is copied (it is not changed), cut to the plan's layers, then pruned in width: the residual stream
    by torch-pruning's dependency graph from one LayerNorm (every embedding table, LayerNorm, linear layer reading or
    writing the stream and the head's input follow), each layer's FFN and each head-side hidden-width output by their
    groups, and each layer's query/key and value/output dimensions by torch-pruning's linear-layer functions.

    Args:
        teacher: the fine-tuned teacher (any head), on any device; float weights.
        plan: what to keep (:func:`plan_pruning`).
        student_config: the student's config, of the teacher's family, sized as the plan.
        example_inputs: inputs of the task type's layout for the model of a config, traced to build the dependency
            graph (:meth:`distill.tasks.TaskType.example_inputs`); None: two (B, T) sequences (:func:`probe_inputs`).

    Returns:
        The student, of the teacher's class, on the CPU in eval mode.

    Raises:
        PruningError: the pruned weights do not fit ``student_config`` (a part of the model the graph did not reach).
    """
    import torch_pruning as tp

    model = copy.deepcopy(teacher).cpu().float().eval().requires_grad_(True)  # traced through autograd
    layers = encoder_layers(model)
    kept_layers = nn.ModuleList([layers[g - 1] for g in plan.layers])
    parent_name = next(name for name, module in model.named_modules() if module is layers)
    parent, attribute = (model.get_submodule(parent_name.rsplit(".", 1)[0]), parent_name.rsplit(".", 1)[1])
    setattr(parent, attribute, kept_layers)
    model.config.num_hidden_layers = len(plan.layers)
    hidden = teacher.config.hidden_size
    with torch.enable_grad():  # the graph is traced through autograd
        probe = (example_inputs or probe_inputs)(model.config)
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=probe, output_transform=_output_sum)
    norm = next(m for m in kept_layers[0].modules() if isinstance(m, nn.LayerNorm) and m.normalized_shape == (hidden,))
    if removed := _removed(plan.residual, hidden):
        graph.get_pruning_group(norm, tp.prune_layernorm_out_channels, idxs=removed).prune()
    for name, kept in plan.outputs.items():
        module = model.get_submodule(name)
        if removed := _removed(kept, module.out_features):
            graph.get_pruning_group(module, tp.prune_linear_out_channels, idxs=removed).prune()
    for index in range(len(plan.layers)):
        modules = layer_modules(model, index)
        if removed := _removed(plan.ffn[index], modules["ffn_in"].out_features):
            graph.get_pruning_group(modules["ffn_in"], tp.prune_linear_out_channels, idxs=removed).prune()
        width = modules["query"].out_features
        for role in ("query", "key"):
            tp.prune_linear_out_channels(modules[role], _removed(plan.query_key[index], width))
        tp.prune_linear_out_channels(modules["value"], _removed(plan.value[index], width))
        tp.prune_linear_in_channels(modules["output"], _removed(plan.value[index], width))
    student = type(teacher)(student_config)
    try:
        student.load_state_dict(model.state_dict(), strict=True)
    except RuntimeError as error:
        raise PruningError(f"pruning a {teacher.config.model_type} teacher left weights that do not fit the student's "
                           f"config: {str(error).splitlines()[1] if len(str(error).splitlines()) > 1 else error}"
                           ) from None
    return student.eval()
