"""tinydistill: TinyBERT-style knowledge distillation (Jiao et al., 2020).

The public API, for distilling from Python instead of the command line (see the README's quick start):

- models: :func:`resolve_model` (``"minilm"``: the MiniLM-L6 encoder installed with the package, else the name as
  given), :func:`build_student` (a student shaped from the teacher's config), :class:`StudentConfig`;
- data: :func:`get_task`, :func:`load_task_data`, :func:`tokenize`, :func:`collator`, :class:`TaskConfig`;
- training: :func:`train` (the one loop of every stage), :class:`TrainConfig`, :class:`ModelLossObjective`
  (fine-tuning a teacher on its own loss);
- distillation: :func:`build_layer_map`, :class:`DistillationObjective`, :data:`LOSS_TERMS`;
- evaluation and devices: :func:`evaluate_task`, :func:`run_device`;
- serving: :class:`QuestionAnswerer` (answers from an extractive QA student or its ONNX file);
- the whole job: :func:`load_config`, :func:`run_pipeline`, :func:`run_seeds` (one run per seed, mean and spread),
  :func:`run_augment` (TinyBERT's augmentation of a training set alone).

Names are imported on first use, so ``import distill`` stays cheap and submodules import each other freely;
``dir(distill)`` and ``help(distill)`` list them all the same.

Stage messages are logged at INFO under ``distill`` (and ``teachers``, ``students``, ``augment``); until your program
configures logging they are printed to stderr, and the libraries' INFO chatter is kept below WARNING
(:mod:`distill.logs`).
"""

from __future__ import annotations

import importlib

from distill.logs import install_default_handler

_API = {
    "build_student": "students", "StudentConfig": "distill.config", "TaskConfig": "distill.config",
    "TrainConfig": "distill.config", "load_config": "distill.config", "get_task": "distill.tasks",
    "load_task_data": "distill.tasks.data", "tokenize": "distill.tasks.data", "collator": "distill.tasks.data",
    "build_layer_map": "distill.method.layer_map", "DistillationObjective": "distill.method.objective",
    "train": "distill.method.trainer", "LOSS_TERMS": "distill.method.terms", "evaluate_task": "distill.tasks.evaluate",
    "run_device": "distill.device", "ModelLossObjective": "distill.method.objective",
    "resolve_model": "teachers.models", "run_pipeline": "distill.job.pipeline", "run_seeds": "distill.job.seeds",
    "QuestionAnswerer": "distill.publish.serving", "run_augment": "distill.job.augmentation",
}
__all__ = sorted(_API)

install_default_handler()


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'distill' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
