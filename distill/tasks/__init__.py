"""The task layer: what a kind of task is, in one module per type, behind one interface.

A task (:class:`TaskSpec`: SST-2, MRPC, WNUT-17, a user's files) has a task type (:class:`TaskType`) that says how
its data read and tokenise, which `transformers` head the teacher and the student carry, how a batch is padded, what
the prediction step's loss is, how its outputs are scored and what a model that learnt nothing scores, what
augmentation may change, and how the model card and ``pipeline()`` name it. The stages, the training loop and the
objective never branch on the task: they call its type.

- :mod:`distill.tasks.base`: the interface, the errors and the registries (imports nothing of the project);
- :mod:`distill.tasks.sequence_classification` (classification and regression of one text or a pair: GLUE, a user's
  CSV/JSONL), :mod:`distill.tasks.token_classification` (one label per word: NER, BIO tags),
  :mod:`distill.tasks.question_answering` (extractive QA: a span of the context, SQuAD v1.1): one module per type,
  each registering itself and its named tasks;
- :mod:`distill.tasks.files`, :mod:`distill.tasks.words`, :mod:`distill.tasks.qa_postprocess`: helpers low in the
  house; :mod:`distill.tasks.data` and :mod:`distill.tasks.evaluate`: loading and scoring any task through its type.

Importing this package imports every type module (every module here but the helpers), so the registries are full.
"""

from distill.tasks.base import (
    DEFAULT_TYPE,
    TASK_TYPES,
    TASKS,
    DataError,
    ModelError,
    PredictionHead,
    TaskSpec,
    TaskType,
    check_model_head,
    get_task,
    get_task_type,
    head_type,
    headline_metrics,
    summary_metrics,
    load_head_model,
    metric_names,
    pad_rows,
    record_serving,
    record_tuned,
    register_task,
    register_task_type,
    saved_settings,
    tuned_from,
)
# Every other module of this package is a task type's, which registers itself and its named tasks when imported: a
# new type is a new module here, with no line to add elsewhere. Imported by name.
HELPERS = {"base", "data", "evaluate", "files", "words", "qa_postprocess", "split", "infer"}


def _import_types() -> None:
    import importlib
    import pkgutil

    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in HELPERS and not m.name.startswith("_")]
    for name in sorted(names):
        importlib.import_module(f"{__name__}.{name}")


_import_types()

__all__ = ["DEFAULT_TYPE", "TASK_TYPES", "TASKS", "DataError", "ModelError", "PredictionHead", "TaskSpec", "TaskType",
           "check_model_head", "get_task", "get_task_type", "head_type", "headline_metrics", "summary_metrics", "load_head_model", "metric_names", "pad_rows",
           "record_serving", "record_tuned", "register_task", "register_task_type", "saved_settings", "tuned_from"]
