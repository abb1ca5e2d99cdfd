"""Load teachers and masked LMs from a hub name or a local path, and check they are what they claim to be."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from distill.tasks.base import ModelError, TaskSpec  # noqa: F401  (ModelError: teachers' own API too)
from teachers.assets import ASSETS, AssetError

logger = logging.getLogger(__name__)


def resolve_model(name_or_path: str) -> str:
    """Map an asset name to its folder ("minilm": the bundled all-MiniLM-L6-v2 BERT; "mpnet": all-mpnet-base-v2,
    see :mod:`teachers.assets`); anything else is returned as is.

    Raises:
        ModelError: the asset is not installed (the message gives the install command).
    """
    if name_or_path in ASSETS:
        try:
            return ASSETS[name_or_path]()
        except AssetError as error:
            raise ModelError(str(error)) from None
    return name_or_path


def load_config(name_or_path: str):
    """``AutoConfig`` of a hub name or folder, with an error that says what to check when it cannot be found."""
    path = resolve_model(name_or_path)
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:
        hint = "the folder has no config.json" if Path(path).is_dir() else "no such folder, and the hub is unreachable or has no such model"
        raise ModelError(f"cannot load model {name_or_path!r}: {hint} ({error.__class__.__name__})") from error


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


def load_teacher(name_or_path: str, spec: TaskSpec, remap_labels: bool = False) -> PreTrainedModel:
    """A fine-tuned model with ``spec``'s head (its task type's, e.g. a sequence classifier), frozen and in eval mode.

    Args:
        name_or_path: hub name, folder, or alias.
        spec: the task; its label names (in id order) are checked against the model's ``id2label``.
        remap_labels: when the model names the task's labels in another order, reorder its output layer's rows so
            that logit i is the task's class i (instead of raising).

    Raises:
        ModelError: the checkpoint has no trained classification head (a pre-trained encoder, or another head), its
            number of labels differs from the task's, or its named labels are in another order (and
            ``remap_labels`` is off, or they are not the task's labels at all); a model that is not one
            `transformers` model (a sentence encoder saved with a map after it).
    """
    config = load_config(name_or_path)
    order = check_teacher_config(config, spec, name_or_path, remap_labels)
    model, info = spec.type.model_class(spec).from_pretrained(resolve_model(name_or_path), output_loading_info=True)
    if not hasattr(model, "base_model"):  # not one transformers model (a student with a map after its encoder)
        raise ModelError(f"teacher {name_or_path!r} is a {type(model).__name__} (an encoder and a learnt map after "
                         "it), which cannot be distilled layer by layer; give a teacher that is one transformers model")
    missing = [key for key in info["missing_keys"] if not (spec.type.teacher_as_is and key.startswith("pooler."))]
    if missing:
        raise ModelError(
            f"teacher {name_or_path!r} lacks weights {sorted(missing)[:4]}: it is not fine-tuned. "
            "Omit --teacher to fine-tune one, or give a fine-tuned checkpoint."
        )
    if order is not None:
        reorder_output_layer(model, order, spec)
        logger.info("teacher %s: outputs reordered %s -> %s", name_or_path,
                    [config.id2label[i] for i in sorted(config.id2label)], list(spec.label_names))
    return model.eval().requires_grad_(False)


def check_teacher_config(config, spec: TaskSpec, name: str, remap_labels: bool = False) -> list[int] | None:
    """Check a teacher's config before loading its weights: a model with the task type's head and the task's labels.

    Returns:
        The label reordering to apply (see :func:`label_permutation`), or None.

    Raises:
        ModelError: not a sequence classifier, another number of labels, or labels in another order.
    """
    architectures = config.architectures or []
    if spec.type.teacher_as_is:  # used as the user deploys it: any encoder, no head or labels to check
        return None
    if not any(a.endswith(spec.type.architecture) for a in architectures):
        raise ModelError(
            f"teacher {name!r} is not a fine-tuned {spec.type.description} (architectures: {architectures or 'none'}). "
            f"Give a ...{spec.type.architecture} checkpoint fine-tuned on the task, or omit --teacher to fine-tune "
            "one from teacher.base_model."
        )
    if config.num_labels != spec.num_labels:
        raise ModelError(
            f"teacher {name!r} has {config.num_labels} labels but task {spec.name} has {spec.num_labels} "
            f"({spec.type.describe_labels(spec)}); it was fine-tuned on another task"
        )
    return label_permutation(config.id2label, spec, name, remap_labels)


def label_permutation(id2label: dict, spec: TaskSpec, name: str, remap: bool = False) -> list[int] | None:
    """Check the model's named labels against the task's; generic ``LABEL_i`` names are accepted as they are.

    Returns:
        None when the order agrees; with ``remap``, the model's output index of each task class when the model has
        the task's labels in another order.

    Raises:
        ModelError: the orders differ (both printed) and ``remap`` is off, or the names are not the task's labels.
    """
    names = [str(id2label[i]).lower() for i in sorted(id2label)]
    if not spec.label_names or all(n.startswith("label_") for n in names):
        return None
    expected = [n.lower() for n in spec.label_names]
    if names == expected:
        return None
    if sorted(names) != sorted(expected):
        given = [str(id2label[i]) for i in sorted(id2label)]
        raise ModelError(
            f"{name!r} labels are {names} but task {spec.name} has labels {expected}: it was fine-tuned on another "
            "task or names its classes otherwise. If they are the same classes, write the data's labels as the "
            f"teacher names them ({', '.join(given)}), or give them as ids with the teacher's names in its order: "
            f"--set 'task.label_names=[{', '.join(given)}]'"
        )
    if not remap:
        raise ModelError(
            f"{name!r} labels are {names} but task {spec.name} expects {expected} in that order; a teacher with "
            "another label order would distil wrong answers. Set teacher.remap_labels: true (--set "
            "teacher.remap_labels=true) to reorder the teacher's outputs to the task's order."
        )
    return [names.index(n) for n in expected]


@torch.no_grad()
def reorder_output_layer(model: PreTrainedModel, order: list[int], spec: TaskSpec) -> None:
    """Permute the rows of a classifier's output layer so that new logit i is old logit ``order[i]``; the config's
    ``id2label``/``label2id`` become the task's.

    The output layer is the last ``nn.Linear`` with ``num_labels`` outputs (BERT ``classifier``, RoBERTa/ELECTRA
    ``classifier.out_proj``).

    Raises:
        ModelError: no such layer.
    """
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(order)]
    if not layers:
        raise ModelError(f"cannot find the output layer of {type(model).__name__} to reorder its labels")
    layer = layers[-1]
    index = torch.tensor(order)
    layer.weight.copy_(layer.weight[index])
    if layer.bias is not None:
        layer.bias.copy_(layer.bias[index])
    model.config.id2label = dict(enumerate(spec.label_names))
    model.config.label2id = {name: i for i, name in enumerate(spec.label_names)}


def load_masked_lm(name_or_path: str) -> PreTrainedModel:
    """A masked LM with a trained MLM head, in eval mode.

    Raises:
        ModelError: the checkpoint has no MLM head (e.g. a sentence-embedding or fine-tuned encoder).
    """
    load_config(name_or_path)
    model, info = AutoModelForMaskedLM.from_pretrained(resolve_model(name_or_path), output_loading_info=True)
    head_missing = [k for k in info["missing_keys"] if "embeddings" not in k]
    if head_missing:
        raise ModelError(
            f"{name_or_path!r} has no masked-LM head (missing {sorted(head_missing)[:3]}...). Train one with "
            f"`python run_distill.py adapt-mlm --model {name_or_path} --output-dir DIR`, or give a masked LM "
            "such as bert-base-uncased."
        )
    return model.eval()


def check_same_vocabulary(teacher_tokenizer, student_tokenizer, student_name: str) -> None:
    """Raise when the student's vocabulary differs from the teacher's (token ids would mean different words)."""
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab != student_vocab:
        differing = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()))[:3]
        raise ModelError(
            f"student {student_name!r} has a vocabulary of {len(student_vocab)} tokens, the teacher {len(teacher_vocab)}, "
            f"and they differ (e.g. {differing}); distillation needs the same tokenizer. Build the student from the "
            "teacher (student.model: null) or use a teacher with the student's tokenizer."
        )
