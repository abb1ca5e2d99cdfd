"""Teachers: load a fine-tuned classifier (hub name or path) or fine-tune one; masked LMs for augmentation."""

from teachers.finetune import check_teacher_quality, finetune_teacher
from teachers.mlm import adapt_mlm
from teachers.models import (
    ModelError,
    check_same_vocabulary,
    load_masked_lm,
    load_teacher,
    load_tokenizer,
    resolve_model,
)

__all__ = [
    "ModelError",
    "adapt_mlm",
    "check_same_vocabulary",
    "check_teacher_quality",
    "finetune_teacher",
    "load_masked_lm",
    "load_teacher",
    "load_tokenizer",
    "resolve_model",
]
