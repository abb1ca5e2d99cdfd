"""Build TinyBERT-style students as plain `transformers` models.

The student copies the teacher's config (model type, vocabulary, positions, token types, labels) and overrides its
shape; so it loads with ``from_pretrained`` and runs in ``pipeline()`` with no code of ours.
"""

from __future__ import annotations

import copy
import logging
import re

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

from distill.config import StudentConfig
from distill.method.layer_map import build_layer_map

logger = logging.getLogger(__name__)

# Shapes from TinyBERT (Jiao et al., 2020, §4.1) and common small configurations.
PRESETS: dict[str, dict[str, int]] = {
    "tinybert-4l-312": {"num_hidden_layers": 4, "hidden_size": 312, "intermediate_size": 1200, "num_attention_heads": 12},
    "tinybert-6l-768": {"num_hidden_layers": 6, "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12},
    "2l-128": {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 2},
    "3l-384": {"num_hidden_layers": 3, "hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12},
    # ALBERT-style (Lan et al., 2019, §3.1): factorized embedding E = 128 < H and one set of layer weights shared by
    # all layers; the TinyBERT 4l-312 shape otherwise.
    "albert-4l-312": {"model_type": "albert", "num_hidden_layers": 4, "hidden_size": 312, "intermediate_size": 1200,
                      "num_attention_heads": 12, "embedding_size": 128, "num_hidden_groups": 1},
}

# Shapes taken from the teacher's config: "teacher-half" is the teacher's width, FFN size and heads at half its depth
# (rounded up), the shape DistilBERT cut from BERT-base (Sanh et al., 2019, §3) and "shrink and fine-tune" cuts from
# a fine-tuned teacher's own layers (Shleifer & Rush, 2020): with init "teacher", layers 2, 4, ... of the teacher.
RELATIVE_PRESETS = ("teacher-half",)

SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")
ALBERT_FIELDS = ("embedding_size", "num_hidden_groups")
# Config fields a student of another family takes from the teacher: vocabulary, positions, token types, labels.
# Config fields a family names differently from BERT (DistilBERT's FFN size is ``hidden_dim``; its attribute_map
# covers hidden_size, num_hidden_layers and num_attention_heads itself).
FIELD_NAMES = {"distilbert": {"intermediate_size": "hidden_dim"}}
# The family of a student shaped anew (init random or teacher_embeddings) for a teacher family that is not the best
# one to ship: one sharing its tokenizer and vocabulary whose attention runs the fused SDPA kernel (MPNet's adds a
# relative position bias in its own eager attention). A student cut from the teacher's layers (init teacher) is of
# the teacher's family, whose layers it copies.
STUDENT_FAMILY = {"mpnet": "bert"}
# Families whose position ids start after the padding index (padding_idx + 1: 2 with their own vocabularies); BERT's
# start at 0.
POSITION_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet")
SHARED_FIELDS = ("vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id", "layer_norm_eps",
                 "hidden_act", "num_labels", "id2label", "label2id", "problem_type")


def student_shape(config: StudentConfig, teacher_config: PretrainedConfig | None = None) -> dict:
    """The student's family, layer count and sizes: the preset, overridden by explicit fields.

    Args:
        config: the student section (preset, explicit sizes, family).
        teacher_config: the teacher's config, which a preset of :data:`RELATIVE_PRESETS` reads its sizes from.

    Returns:
        ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``, ``num_attention_heads``; ``model_type`` when
        the student's family is not the teacher's; ``embedding_size`` and ``num_hidden_groups`` for ALBERT.

    Raises:
        ValueError: unknown preset or family, a relative preset without ``teacher_config``, a field missing when there
            is no preset, a hidden size the heads do not divide, or ALBERT fields on a non-ALBERT student.
    """
    if config.preset is not None and config.preset not in PRESETS and config.preset not in RELATIVE_PRESETS:
        raise ValueError(f"unknown student preset {config.preset!r}; presets: "
                         f"{', '.join([*PRESETS, *RELATIVE_PRESETS])}")
    if config.preset in RELATIVE_PRESETS:
        if teacher_config is None:
            raise ValueError(f"student preset {config.preset!r} takes its sizes from the teacher's config, and none "
                             "was given")
        shape = {"num_hidden_layers": (teacher_config.num_hidden_layers + 1) // 2,
                 **{key: config_value(teacher_config, key) for key in SHAPE_FIELDS[1:]}}
    else:
        shape = dict(PRESETS[config.preset]) if config.preset else {}
    shape.update({k: getattr(config, k) for k in (*SHAPE_FIELDS, *ALBERT_FIELDS, "model_type")
                  if getattr(config, k) is not None})
    missing = [k for k in SHAPE_FIELDS if k not in shape]
    if missing:
        raise ValueError(f"student shape incomplete: set student.preset or student.{missing[0]}")
    hidden, heads = shape["hidden_size"], shape["num_attention_heads"]
    if hidden % heads:
        sizes = sorted({max(hidden // heads, 1), hidden // heads + 1})  # head sizes around hidden / heads
        # A head count that divides the hidden size, and the teacher's heads too (the attention loss groups them)
        teacher_heads = None if teacher_config is None else config_value(teacher_config, "num_attention_heads")
        counts = [h for h in range(1, hidden + 1)
                  if hidden % h == 0 and (teacher_heads is None or teacher_heads % h == 0)]
        divisor = min(counts, key=lambda h: (abs(h - heads), h))
        raise ValueError(f"student hidden_size {hidden} is not divisible by num_attention_heads {heads}: nearest "
                         f"hidden_size {' or '.join(str(s * heads) for s in sizes)} ({heads} heads of "
                         f"{' or '.join(map(str, sizes))}), or num_attention_heads {divisor} (head size "
                         f"{hidden // divisor})")
    albert = shape.get("model_type") == "albert"
    if not albert and any(k in shape for k in ALBERT_FIELDS):
        raise ValueError("student.embedding_size and num_hidden_groups are ALBERT settings: set student.model_type: "
                         "albert, or remove them")
    if albert:
        groups = shape.setdefault("num_hidden_groups", 1)
        shape.setdefault("embedding_size", shape["hidden_size"])
        if shape["num_hidden_layers"] % groups:
            raise ValueError(f"student num_hidden_groups {groups} must divide num_hidden_layers "
                             f"{shape['num_hidden_layers']} (layers are shared within a group)")
    return shape


def student_family(teacher_type: str, init: str = "random") -> str:
    """The default student family for a teacher family: the teacher's own, or for a student shaped anew one sharing
    its tokenizer (:data:`STUDENT_FAMILY`: an MPNet teacher gets a BERT student unless ``init`` is "teacher" or
    "pruned", which keep the teacher's layers and so its family)."""
    return teacher_type if init in ("teacher", "pruned") else STUDENT_FAMILY.get(teacher_type, teacher_type)


def student_config(teacher_config: PretrainedConfig, shape: dict, init: str = "random") -> PretrainedConfig:
    """The student's config: the teacher's with the student's shape, or, for a student of another family
    (``shape["model_type"]``, else :func:`student_family` of the teacher's and ``init``), that family's config with
    the teacher's vocabulary, positions and labels."""
    shape = dict(shape)
    model_type = shape.pop("model_type", student_family(teacher_config.model_type, init))
    names = FIELD_NAMES.get(model_type, {})
    shape = {names.get(key, key): value for key, value in shape.items()}
    if model_type == teacher_config.model_type:
        config = copy.deepcopy(teacher_config)
        for key, value in shape.items():
            setattr(config, key, value)
    else:
        shared = {k: copy.deepcopy(getattr(teacher_config, k)) for k in SHARED_FIELDS if hasattr(teacher_config, k)}
        shared["type_vocab_size"] = max(1, shared.get("type_vocab_size", 1) or 1)  # DeBERTa-v2 and others have 0
        config = AutoConfig.for_model(model_type, **shared, **shape)
    config.architectures = None
    return config


def build_student(
    teacher: PreTrainedModel, config: StudentConfig, layer_map: list[int] | None = None, encoder_only: bool = False,
    shape: dict | None = None,
) -> PreTrainedModel:
    """A new student shaped by ``config``, randomly initialised or initialised from teacher layers.

    Args:
        teacher: the teacher, classifier or bare encoder (its config supplies everything but the shape).
        config: preset / sizes and ``init`` ("random", "teacher_embeddings" or "teacher").
        layer_map: teacher layers [g(1), ..., g(M)] copied into student layers 1..M when ``init == "teacher"``;
            None: the uniform map (:func:`distill.method.layer_map.build_layer_map`, 3-of-6 -> [2, 4, 6]).
        encoder_only: build a bare encoder (``AutoModel``, for general distillation) instead of a classifier.
        shape: the student's shape as the job resolved it (:func:`student_shape`); None: resolved here from
            ``config`` and the teacher's config.

    Raises:
        ValueError: ``init == "teacher"`` but hidden or FFN sizes differ from the teacher's, or (no ``layer_map``)
            the student is deeper than the teacher.
    """
    shape = shape if shape is not None else student_shape(config, teacher.config)
    model_class = AutoModel if encoder_only else head_class(teacher)
    model = model_class.from_config(student_config(teacher.config, shape, config.init))
    if config.init == "teacher":
        if layer_map is None:  # the config's default map, as everywhere else (not layers 1..M)
            layer_map = build_layer_map("uniform", config_value(teacher.config, "num_hidden_layers"),
                                        shape["num_hidden_layers"])
        init_from_teacher(model, teacher, layer_map)
    elif config.init == "teacher_embeddings":
        init_embeddings_from_teacher(model, teacher)
    logger.info("student: %s, %.1fM parameters, init %s", shape, model.num_parameters() / 1e6, config.init)
    return model


def head_class(teacher: PreTrainedModel) -> type:
    """The Auto class of the teacher's head (its task type's, :func:`distill.tasks.head_type`); a bare encoder
    teacher gets a sequence classifier."""
    from distill.tasks import head_type

    return head_type([type(teacher).__name__]).model_class(None)


def first_position(config: PretrainedConfig) -> int:
    """The position id of a sequence's first token: ``pad_token_id + 1`` in RoBERTa-style families, else 0."""
    if config.model_type in POSITION_AFTER_PADDING:
        return (config.pad_token_id if config.pad_token_id is not None else 1) + 1
    return 0


def config_value(config: PretrainedConfig, key: str):
    """A BERT-named config field of any family (``intermediate_size`` is DistilBERT's ``hidden_dim``)."""
    return getattr(config, FIELD_NAMES.get(config.model_type, {}).get(key, key), None)


def principal_basis(matrix: torch.Tensor, size: int) -> torch.Tensor:
    """The top ``size`` principal directions of the rows of ``matrix`` (V, H): an orthonormal (H, size) basis."""
    centred = matrix.float() - matrix.float().mean(dim=0, keepdim=True)
    _, _, right = torch.linalg.svd(centred, full_matrices=False)  # right: (H, H), rows by decreasing variance
    return right[:size].T.contiguous()


@torch.no_grad()
def init_embeddings_from_teacher(student: PreTrainedModel, teacher: PreTrainedModel) -> None:
    """Initialise the student's embedding tables (word, position, token type) from the teacher's.

    Our addition, not in TinyBERT: when h_S < h_T the teacher's tables are projected onto the top h_S principal
    directions of its word embeddings (PCA), keeping as much of their variance as h_S dimensions can; when sizes are
    equal they are copied. A random student then starts with the teacher's lexical knowledge, which matters most
    when there is no general distillation. Embedding LayerNorm and all layers stay randomly initialised. Position
    tables are aligned when the families count positions differently (an MPNet teacher's position p + 2 is a BERT
    student's position p).

    Raises:
        ValueError: the student's hidden size is larger than the teacher's.
    """
    source, target = teacher.get_input_embeddings(), student.get_input_embeddings()
    h_s, h_t = target.weight.shape[1], source.weight.shape[1]  # ALBERT: the student's embedding size E
    if h_s > h_t:
        raise ValueError(f"student.init 'teacher_embeddings' needs an embedding width <= the teacher's ({h_t}), "
                         f"got {h_s}")
    basis = principal_basis(source.weight, h_s) if h_s < h_t else torch.eye(h_t, device=source.weight.device)
    target.weight.copy_(source.weight.float() @ basis)
    source_tables = dict(teacher.base_model.embeddings.named_children())
    for name, module in student.base_model.embeddings.named_children():
        if name == "word_embeddings" or not isinstance(module, torch.nn.Embedding) or name not in source_tables:
            continue
        teacher_table = source_tables[name].weight
        if name == "position_embeddings":
            # Position p of the student is position p + offset of the teacher (an MPNet or RoBERTa teacher counts
            # from padding_idx + 1, a BERT student from 0); rows the teacher lacks stay random.
            offset = first_position(teacher.config) - first_position(student.config)
            if offset != 0:
                source_start, target_start = max(offset, 0), max(-offset, 0)
                rows = min(module.weight.shape[0] - target_start, teacher_table.shape[0] - source_start)
                if rows > 0:
                    module.weight[target_start : target_start + rows].copy_(
                        teacher_table[source_start : source_start + rows].float() @ basis)
                continue
        if teacher_table.shape[0] == module.weight.shape[0]:
            module.weight.copy_(teacher_table.float() @ basis)


def _relative_names(model: PreTrainedModel) -> dict[str, str]:
    """Parameter names relative to the encoder (``encoder.layer.0...``) -> names in ``model``'s state dict, for a
    bare encoder or a classifier (whose head keeps its own name, e.g. ``classifier.weight``)."""
    prefix = f"{model.base_model_prefix}."
    bare = model.base_model is model
    return {(name[len(prefix):] if not bare and name.startswith(prefix) else name): name for name in model.state_dict()}


def init_from_teacher(student: PreTrainedModel, teacher: PreTrainedModel, layer_map: list[int]) -> None:
    """Copy embeddings, teacher layers g(1..M) and the pooler/classifier into the student (DistilBERT-style).

    Works between classifiers and bare encoders in any combination (names are matched relative to the encoder).

    Raises:
        ValueError: the families, hidden or FFN sizes, head counts or (ALBERT) embedding sizes differ, so the
            copied weights would not compute the teacher's layers.
    """
    if student.config.model_type != teacher.config.model_type:
        raise ValueError(
            f"student.init 'teacher' copies layers between models of one family; the student is "
            f"{student.config.model_type}, the teacher {teacher.config.model_type}. Use init teacher_embeddings or random"
        )
    # The head count too: the same Q/K/V weights split into other heads compute another function.
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "embedding_size"):
        if config_value(student.config, key) != config_value(teacher.config, key):
            raise ValueError(
                f"student.init 'teacher' needs the teacher's {key} ({config_value(teacher.config, key)}), the student "
                f"has {config_value(student.config, key)}; use init 'random' or the teacher's sizes"
            )
    teacher_state = teacher.state_dict()
    teacher_names = _relative_names(teacher)
    state = {}
    for name, full_name in _relative_names(student).items():
        # Layer i of the student <- layer g(i+1) of the teacher (BERT-style "encoder.layer.i", DistilBERT "transformer.layer.i").
        source = re.sub(r"^(encoder|transformer)\.layer\.(\d+)\.",
                        lambda m: f"{m.group(1)}.layer.{layer_map[int(m.group(2))] - 1}.", name)
        if source in teacher_names:
            state[full_name] = teacher_state[teacher_names[source]]
    student.load_state_dict(state, strict=False)
