"""Stages of the pipeline and their run ids, derived from what each stage reads.

Each stage declares the config fields it reads (:attr:`StageSpec.reads`, dotted paths) and the stages whose outputs it
reads (:attr:`StageSpec.inputs`). Its run id is a hash of exactly those fields' values and those inputs' run ids, so
a change to a field re-runs the stages that read it and the stages after them, and nothing else: a new temperature
re-runs the prediction step and reuses the intermediate step; new augmentation settings re-run augmentation and every
step after it, and reuse the teacher.

A stage's code sees the config only through :meth:`StageSpec.view`, which refuses a field the stage did not declare
(:class:`UndeclaredFieldError`), so the declaration cannot fall behind the code: a stage that starts reading a new
field fails its first test until the field is declared, and with it enters the run id.

A declared field that names a local file or folder (:data:`INPUT_FIELDS`) enters the run id by the bytes it names
(:mod:`distill.method.fingerprints`), not by its spelling: editing a data file, or retraining a teacher into the same
folder, re-runs the stages that read it (and those after them); a hub name or a bundled asset counts by its name.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from distill.config import fingerprint, hashed_dict
from distill.method.checkpoint import finished_or_superseded, mark_stage_started
from distill.method.fingerprints import content_or_name, is_local
from distill.method.terms import terms_of

logger = logging.getLogger(__name__)
# The job's progress lines ("=== stage: ...") keep the logger name they have always had, whichever module runs the stage.
progress = logging.getLogger("distill.job.pipeline")

# Fields any stage may read that do not change its output.
ALWAYS_READABLE = ("output_dir",)


class UndeclaredFieldError(AttributeError):
    """A stage read a config field it does not declare (a bug in the stage, not in the user's config)."""


@dataclass(frozen=True)
class StageSpec:
    """A stage: its output folder, the config fields it reads and the stages whose outputs it reads.

    Attributes:
        name: the stage's folder under the output directory.
        reads: dotted config paths that decide its output ("teacher" is the whole section, "distill.weights.hidden"
            one key of a mapping).
        inputs: names of the stages whose outputs it reads; their run ids enter its run id.
        canonical: rewrites the hashed values ({declared path: value}) in place so that settings that give the
            same output hash alike (the teacher: a task cap and a teacher share that leave it the same examples).
    """

    name: str
    reads: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    canonical: Callable[[dict], None] | None = None

    def run_id(self, config: Any, inputs: dict[str, str]) -> str:
        """Hash of the declared fields' values and the inputs' run ids (``inputs``: {stage name: run id})."""
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            raise ValueError(f"stage {self.name}: run ids of its inputs {missing} are needed")
        values = {path: _plain(_lookup(config, path)) for path in self.reads}
        with_contents(values, config)
        if self.canonical is not None:
            self.canonical(values)
        return fingerprint(self.name, values, {name: inputs[name] for name in self.inputs})

    def view(self, config: Any) -> "ConfigView":
        """``config`` as this stage may see it: the declared fields only."""
        return ConfigView(config, "", frozenset((*self.reads, *ALWAYS_READABLE)), self.name)


# Config fields that name files or folders a stage loads: a local one counts by its bytes (a list field, item by item).
INPUT_FIELDS = ("task.data_dir", "task.train_file", "task.dev_file", "teacher.model", "teacher.base_model",
                "mlm.model", "mlm.base_model", "mlm.corpus", "augment.unlabelled", "augment.word_vectors",
                "augment.stopwords", "student.model")


def task_data_files(task: Any) -> list[str] | None:
    """The files of ``task.data_dir`` that the task reads (train, dev and any extra dev file of its layout), so that
    an unrelated file there (GLUE's test.tsv) does not enter run ids; None when the task does not read the folder (its
    own ``train_file``/``dev_file``, the hub): the folder then stays out of run ids.

    Args:
        task: the ``task`` config section (:class:`distill.config.TaskConfig`, or a view of it).
    """
    if task.train_file is not None or not task.data_dir or task.source not in ("auto", "local"):
        return None
    from distill.tasks import TASKS

    spec = TASKS.get(task.name)
    if spec is None:
        return None
    return [spec.train_file, spec.dev_file, *(file for _, file, _ in spec.extra_dev)]


def data_folder_content(task: Any) -> Any:
    """``task.data_dir`` as it enters run ids: ``sha256:<digest>`` of the files the task reads there, or the value as
    it is when the task does not read the folder or it does not exist (the data loader reports a missing folder).

    Raises:
        DataError: a file the task reads is missing from the folder (naming it).
    """
    names = task_data_files(task)
    if names is None or not is_local(task.data_dir):
        return task.data_dir
    try:
        return content_or_name(task.data_dir, names)
    except FileNotFoundError as error:
        from distill.tasks.base import DataError

        raise DataError(f"task {task.name}: {error}; the data folder needs {', '.join(names)}") from None


def with_contents(values: dict[str, Any], config: Any) -> None:
    """Replace, in the hashed ``values`` ({declared path: value}), each :data:`INPUT_FIELDS` entry that names a local
    file or folder with ``sha256:<digest>`` of its bytes (a data folder: the files its task reads)."""
    for field_path in INPUT_FIELDS:
        declared = next((p for p in values if field_path == p or field_path.startswith(p + ".")), None)
        if declared is None:
            continue
        parent, key = values, declared
        for part in field_path[len(declared) + 1:].split(".") if field_path != declared else []:
            parent, key = parent.get(key) if isinstance(parent, dict) else None, part
        if not isinstance(parent, dict) or key not in parent:
            continue
        value = parent[key]
        if field_path == "task.data_dir":
            parent[key] = data_folder_content(_lookup(config, "task"))
        else:
            parent[key] = [content_or_name(v) for v in value] if isinstance(value, list) else content_or_name(value)


def _lookup(node: Any, path: str) -> Any:
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)
    return node


def _plain(value: Any) -> Any:
    """A section as its run id hashes it: without its speed-only fields (:func:`distill.config.hashed_dict`)."""
    return hashed_dict(value) if dataclasses.is_dataclass(value) else value


class ConfigView:
    """A read-only view of a config (dataclasses and mappings) that lets through the allowed paths only.

    A fully allowed field comes back as it is (a dataclass section, a value); a field with some allowed sub-fields
    comes back as another view; any other field raises :class:`UndeclaredFieldError` naming the stage and the path.
    """

    def __init__(self, node: Any, path: str, allowed: frozenset[str], stage: str):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_stage", stage)

    def _child(self, name: str, value: Any) -> Any:
        path = f"{self._path}.{name}" if self._path else name
        if any(path == a or path.startswith(a + ".") for a in self._allowed):
            return value
        if any(a.startswith(path + ".") for a in self._allowed):
            return ConfigView(value, path, self._allowed, self._stage)
        raise UndeclaredFieldError(
            f"stage {self._stage!r} read config field {path!r}, which its StageSpec does not declare: add it to "
            f"distill.job.stages.STAGES[{self._stage!r}].reads (it then enters the stage's run id)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._child(name, getattr(self._node, name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"stage {self._stage!r}: the config is read-only")

    # A view of a mapping (distill.weights): the lookups the stages use.
    def get(self, key: str, default: Any = None) -> Any:
        return self._child(key, self._node.get(key, default))

    def __getitem__(self, key: str) -> Any:
        return self._child(key, self._node[key])

    def __contains__(self, key: str) -> bool:
        self._child(key, None)
        return key in self._node


INTERMEDIATE_WEIGHTS = tuple(f"distill.weights.{name}" for name in terms_of("intermediate"))
PREDICTION_WEIGHTS = tuple(f"distill.weights.{name}" for name in terms_of("prediction"))


def teacher_examples(values: dict) -> None:
    """The teacher is fine-tuned on the first ``min(task.max_train_examples, teacher.max_train_examples_cpu)``
    training examples (both as :func:`distill.job.pipeline.for_device` resolves them; None: no cap), whichever cap gives
    that number: hash it as the task's cap with no teacher share, so that a teacher made for one split of the work is
    reused by another that leaves it the same examples (the task at 16,000 with a share of 8,000 = the task at 8,000).
    """
    task, teacher = values.get("task"), values.get("teacher")
    if not isinstance(task, dict) or not isinstance(teacher, dict) or teacher.get("max_train_examples_cpu") is None:
        return
    share, cap = teacher["max_train_examples_cpu"], task.get("max_train_examples")
    task["max_train_examples"] = share if cap is None else min(cap, share)
    teacher["max_train_examples_cpu"] = None


# What only fine-tuning reads: with ``teacher.model`` given, nothing is fine-tuned and these make no difference.
FINE_TUNING_FIELDS = ("base_model", "train", "select_best", "eval_steps")


def teacher_canonical(values: dict) -> None:
    """The teacher's hashed values as :func:`teacher_examples` makes them, and ``teacher.min_dev_metric`` hashed as
    its default (None) whatever it is: the bar decides whether the job goes on with the teacher, not the teacher it
    makes, so lowering it after a refusal (as the refusal suggests) finds the finished fine-tuning instead of moving it
    aside and training again. Likewise, with a given ``teacher.model`` the :data:`FINE_TUNING_FIELDS` are hashed at
    their defaults: a fine-tuning setting changed there re-scores nothing. Hashed at the defaults rather than left out,
    so that run ids made before keep theirs."""
    from distill.config import TeacherConfig
    from distill.method.fingerprints import content_or_name

    teacher_examples(values)
    teacher = values.get("teacher")
    if not isinstance(teacher, dict):
        return
    if "min_dev_metric" in teacher:
        teacher["min_dev_metric"] = None
    if teacher.get("model") is not None:
        defaults = hashed_dict(TeacherConfig())
        defaults["base_model"] = content_or_name(defaults["base_model"])  # as with_contents hashes the default
        teacher.update({name: defaults[name] for name in FINE_TUNING_FIELDS if name in teacher})


# Task options only the prediction step reads (a sentence encoder's map to the teacher's space): out of the run ids of
# the stages before it, in the prediction step's only when set, so that the run ids made before them keep theirs.
STUDENT_OPTIONS = ("teacher_space",)


def without_student_options(values: dict) -> None:
    """The hashed ``task`` section without the :data:`STUDENT_OPTIONS` (the teacher, augmentation and pruning
    stages do not read them)."""
    options = (values.get("task") or {}).get("options") if isinstance(values.get("task"), dict) else None
    if isinstance(options, dict):
        for name in STUDENT_OPTIONS:
            options.pop(name, None)


def teacher_stage_canonical(values: dict) -> None:
    """:func:`teacher_canonical` and :func:`without_student_options`."""
    teacher_canonical(values)
    without_student_options(values)


def student_canonical(values: dict) -> None:
    """The prediction step's hashed ``task.options``: the :data:`STUDENT_OPTIONS` that are set (true), or nothing."""
    options = values.pop("task.options", None) or {}
    for name in STUDENT_OPTIONS:
        if options.get(name):
            values[f"task.options.{name}"] = options[name]


STAGES: dict[str, StageSpec] = {spec.name: spec for spec in (
    StageSpec("teacher", reads=("task", "teacher"), canonical=teacher_stage_canonical),
    StageSpec("mlm", reads=("mlm",)),
    StageSpec("augmented", reads=("task", "augment", "mlm.model"), inputs=("mlm",), canonical=without_student_options),
    StageSpec("teacher_logits", reads=("task.max_seq_length",), inputs=("teacher", "augmented")),
    # A student pruned from the fine-tuned teacher (student.init "pruned"): importance on the task's training data,
    # then the teacher cut to the student's shape and layers (distill.job.pruned).
    StageSpec("pruned", reads=("task", "student", "distill.layer_map"), inputs=("teacher",),
              canonical=without_student_options),
    StageSpec("student_intermediate",
              reads=("task.max_seq_length", "student", "distill.layer_map", "distill.share_projection",
                     *INTERMEDIATE_WEIGHTS, "distill.relation_heads", "distill.hidden_loss", "distill.intermediate",
                     "distill.teacher_cache"),
              inputs=("teacher", "augmented", "general")),
    # Its run id also covers the teacher buffers it holds (distill.job.stage_distill.teacher_outputs_run_id).
    StageSpec("teacher_outputs", reads=("task.max_seq_length", "distill.teacher_cache"), inputs=("teacher", "augmented")),
    StageSpec("student",
              reads=("task.max_seq_length", "distill.prediction", "distill.temperature", "distill.temperature_squared",
                     "distill.hard_label_weight", *PREDICTION_WEIGHTS, "task.options"),
              inputs=("student_intermediate", "teacher_logits"), canonical=student_canonical),
)}


def banner(name: str, folder: Path) -> None:
    """Log that a stage begins, and where it writes."""
    progress.info("=== stage: %s -> %s", name, folder)


def start_stage(name: str, folder: Path) -> None:
    """A stage with a ``stage.json`` begins to run: log it and note the time (its record gets ``seconds``)."""
    banner(name, folder)
    mark_stage_started(folder)


def open_stage(name: str, config: Any, folder: Path, inputs: dict[str, str] | None = None
               ) -> tuple[str, "ConfigView", dict | None]:
    """A stage's run id (from the fields it declares and its inputs' run ids), the config as it may read it, and its
    record when it is finished under that run id (None: run it; a folder of another run id was moved aside)."""
    spec = STAGES[name]
    run_id = spec.run_id(config, inputs or {})
    return run_id, spec.view(config), finished_or_superseded(folder, run_id)
