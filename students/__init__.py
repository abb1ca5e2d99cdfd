"""Students: TinyBERT-style small encoders built as plain `transformers` models."""

from students.build import PRESETS, RELATIVE_PRESETS, build_student, init_from_teacher, student_family, student_shape

__all__ = ["PRESETS", "RELATIVE_PRESETS", "build_student", "init_from_teacher", "student_family", "student_shape"]
