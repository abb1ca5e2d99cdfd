"""The task interface, at the bottom of the house: what a task is (:class:`TaskSpec`), what a task type must answer
(:class:`TaskType`), the errors of bad data and of a model that does not fit, and the registries of task types and
named tasks.

This module imports nothing of the project. Each task type is one module of :mod:`distill.tasks` that subclasses
:class:`TaskType`, registers an instance with :func:`register_task_type` and its named tasks (the GLUE table,
``wnut_17``, ``squad``...) with :func:`register_task`; ``import distill.tasks`` imports them all. The method
(losses, objective, capture, loop) never imports this: it receives a :class:`PredictionHead` from the type.
"""

from __future__ import annotations

from pathlib import Path

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

# The type of a task that names none, and of a checkpoint whose architecture names no registered head (as before task
# types existed).
DEFAULT_TYPE = "sequence_classification"


# The key prefix of a student's scores read against its teacher's outputs (:meth:`TaskType.paired_metrics`).
PAIRED = "teacher_index"


class ModelError(ValueError):
    """A checkpoint is missing, of the wrong kind, or incompatible with the task or the other model."""


class DataError(ValueError):
    """Input data is malformed: the message names the file, the line and what to fix."""


@dataclass(frozen=True)
class TaskSpec:
    """What a task's data looks like and how it is scored.

    Column names are those of the hub dataset (``glue/<task>``); GLUE TSV headers that differ are renamed on read
    (``tsv_columns``). Labels in TSV files may be class ids or class names (MNLI's ``entailment``), both mapped to
    ids in ``label_names`` order, which is the hub's order.
    """

    name: str
    text_columns: tuple[str, ...]  # one column (single sentence) or two (pairs)
    label_column: str  # column of the label in the GLUE TSV files (after renaming)
    label_names: tuple[str, ...] = ()  # class names in id order; empty for regression
    metrics: tuple[str, ...] = ("accuracy",)
    hub: tuple[str, str] | None = ("glue", "")  # datasets.load_dataset(*hub); None: no hub copy (a user's files)
    tsv_columns: dict = field(default_factory=dict)  # TSV header name -> our column name, where they differ
    dev_file: str = "dev.tsv"
    hub_dev_split: str = "validation"
    header: tuple[str, ...] | None = None  # column names of headerless TSV files (CoLA)
    # More dev sets, scored beside the main one: (suffix, TSV file, hub split); metrics get "_<suffix>" appended.
    extra_dev: tuple[tuple[str, str, str], ...] = ()
    train_file: str = "train.tsv"
    task_type: str = DEFAULT_TYPE  # a name of TASK_TYPES: how the task reads, trains, scores
    hub_label_column: str = "label"  # the label column of the hub's copy (GLUE: label; NER data sets: ner_tags)
    options: dict = field(default_factory=dict)  # settings of the task's type (``task.options``), read by its module

    @property
    def type(self) -> TaskType:
        """The task's :class:`TaskType`, which the rest of the code asks what the task is."""
        return get_task_type(self.task_type)

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    @property
    def dev_splits(self) -> dict[str, str]:
        """Dev split name in the DatasetDict -> suffix of its metric names ("" for the main dev set)."""
        return {"dev": "", **{f"dev_{suffix}": f"_{suffix}" for suffix, _, _ in self.extra_dev}}



# A teacher of at least this many layers (BERT-base, RoBERTa-base, MPNet-base and larger) gets its task type's
# 12-layer recipe (:meth:`TaskType.recipe`): a pruned 4-layer/312 student, about 15x faster, rather than the
# MiniLM recipes' student at half the teacher's depth.
DEEP_TEACHER_LAYERS = 12


def deep(teacher_layers: int | None) -> bool:
    """Whether a teacher of this depth (None: not known) takes the 12-layer recipes."""
    return teacher_layers is not None and teacher_layers >= DEEP_TEACHER_LAYERS


class TaskType:
    """The interface of a task type (every method takes the task's :class:`TaskSpec` where it needs it). Shapes: N
    examples, B batch, T tokens, C labels. A type is one module of :mod:`distill.tasks` that subclasses this, registers
    an instance (:func:`register_task_type`) and its named tasks (:func:`register_task`)."""

    name: str = ""
    metric_names: tuple[str, ...] = ()  # the metrics this type scores (task.metrics chooses among them)
    # metrics it adds beyond them (keys of compute_metrics with a "/") that the seeds summary shows over seeds too
    summary_metrics: tuple[str, ...] = ()
    pipeline_tag: str = ""  # the hub's pipeline tag of the model card, and the pipeline() task name
    library_name: str = "transformers"  # the library the model card names (the hub's library_name)
    architecture: str = ""  # the end of a checkpoint's architecture name with this head, e.g. ForTokenClassification
    description: str = ""  # in words, for messages: "sequence classifier"

    def model_class(self, spec: TaskSpec) -> type:
        """The ``transformers`` Auto class of the head (teacher and student)."""
        raise NotImplementedError

    def read_split(self, path, spec: TaskSpec) -> "datasets.Dataset":
        """One split from a local file in the task's layout (GLUE TSV, CoNLL, ...), columns ``spec.text_columns``
        and ``label``."""
        raise NotImplementedError

    def user_spec(self, config) -> TaskSpec:
        """The spec of a task of the user's own files (``task.train_file``, ``dev_file``, ...) of this type."""
        raise NotImplementedError

    def read_user_split(self, path, spec: TaskSpec, split: str = "train") -> "datasets.Dataset":
        """One split of the user's own files, columns ``spec.text_columns`` and ``label``; ``split`` ("train" or
        "dev") picks the split of a source that holds several (a saved ``DatasetDict``, a hub dataset)."""
        raise NotImplementedError

    def tokenize(self, dataset: "datasets.Dataset", tokenizer: "PreTrainedTokenizerBase", spec: TaskSpec,
                 max_seq_length: int) -> "datasets.Dataset":
        """Model inputs and ``labels``, unpadded."""
        raise NotImplementedError

    def collator(self, tokenizer: "PreTrainedTokenizerBase") -> Callable[[list[dict]], dict[str, torch.Tensor]]:
        """Pads tokenized examples (and cached ``teacher_logits``) into a batch."""
        raise NotImplementedError

    def compute_metrics(self, spec: TaskSpec, outputs: Any, labels: Any, context: Any = None) -> dict[str, float]:
        """The task's metrics (``spec.metrics``) from the outputs :func:`distill.tasks.evaluate.predict` returns, and
        any the type measures beyond them (keys outside :func:`metric_names`, shown in its report sections); with
        ``context`` (:meth:`metric_context`), those that need more than the outputs and labels."""
        raise NotImplementedError

    def compute_metrics_with(self, spec: TaskSpec, outputs: Any, labels: Any, context: Any,
                             settings: dict) -> dict[str, float]:
        """:meth:`compute_metrics` with ``settings`` chosen elsewhere (:meth:`tuned_settings` on the dev set's tuning
        half, applied to its report half: :mod:`distill.tasks.split`). This default: the type chooses nothing, so
        ``settings`` is ignored."""
        return self.compute_metrics(spec, outputs, labels, context) if context is not None else \
            self.compute_metrics(spec, outputs, labels)

    def tuned_settings(self, spec: TaskSpec, metrics: dict) -> dict:
        """The scoring settings :meth:`compute_metrics` chose on a set (its metrics ``metrics``) that a score on
        other data must reuse rather than choose again, under the names a model's ``config.json`` keeps them by (a
        multi-label classifier's ``decision_threshold``): chosen on the dev set's tuning half, they score its report
        half and ship with the model (:func:`record_tuned`). This default: none."""
        return {}

    def sniff_file(self, path: Path) -> dict | None:
        """Whether a user's training file is in this type's own layout (not a table: CoNLL lines, SQuAD JSON), and
        then the ``task.*`` settings it implies ({} for none beyond the type); None: not this type's layout. Asked by
        :func:`distill.tasks.infer.infer_task` of every type; this default: None."""
        return None

    def sniff_labels(self, values: list) -> dict | None:
        """Whether a table's label column (its values, as read) holds this type's labels, and then the ``task.*``
        settings they imply (``{"task.regression": True}``); None: not this type's. Two types that claim one column
        are an error asking for ``task.task_type``, so a type claims only what it alone reads. This default: None."""
        return None

    def example_key(self, spec: TaskSpec, row: dict) -> str:
        """What identifies an example for the dev split's halves (:mod:`distill.tasks.split`): a string of its
        inputs. This default: the text columns' values (a word list joined by spaces), separated by tabs."""
        return "\t".join(" ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
                         for value in (row[column] for column in spec.text_columns))

    def row_examples(self, labels: Any) -> list[int]:
        """For each row of a tokenized split (its ``labels``), the index of the example it came from. This default:
        one row an example, in order; a type that cuts an example into several rows (QA's windows) says which."""
        return list(range(len(labels)))

    def prediction_loss(self, spec: TaskSpec, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                        batch: dict, *, temperature: float, temperature_squared: bool, hard_label_weight: float
                        ) -> torch.Tensor:
        """The prediction step's loss (TinyBERT Eq. 10 in the head's output space), a float32 scalar: the student's
        logits against the teacher's (soft targets at ``temperature``, × T² with ``temperature_squared``), plus
        ``hard_label_weight`` times the loss on the gold labels of the batch (``batch["labels"]``, or what else of the
        batch the type reads: QA's positions and which of them may hold an answer)."""
        raise NotImplementedError

    def prediction_inputs_differ(self, spec: TaskSpec, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                                 batch: dict) -> torch.Tensor:
        """Scalar bool tensor: whether the student's and the teacher's logits differ at a position
        :meth:`prediction_loss` reads. A loss exactly 0 while this is true stops training (a sum or count lost to
        rounding); positions the loss does not read (padding, unscored pieces) must not make it true, or a batch
        with nothing scored, whose loss is 0 by definition, would stop it. This default: every position."""
        return (student_logits.float() != teacher_logits.float()).any()

    def prediction_model(self, spec: TaskSpec, student, teacher, projection: "torch.nn.Linear | None" = None):
        """The model the prediction step trains, from the intermediate step's ``student``: this default, the student
        itself; a type may add a learnt part it ships with the student (sentence embeddings: a map to the teacher's
        width). ``projection``: the intermediate step's learnt hidden-state projection W_h (H_S -> H_T, TinyBERT
        Eq. 8), None where it had none."""
        return student

    def check_options(self, spec: TaskSpec) -> None:
        """Check the task's options (``task.options``) that this type reads before any stage runs (the job's
        preflight). This default: none to check.

        Raises:
            DataError: an option the type cannot take, naming it and the values it can."""

    def against_teacher(self, spec: TaskSpec, student, teacher) -> bool:
        """Whether the student's outputs are also scored against the teacher's (:meth:`paired_metrics`); this
        default: never."""
        return False

    def paired_metrics(self, spec: TaskSpec, outputs: Any, teacher_outputs: Any, labels: Any) -> dict[str, float]:
        """Metrics of the student's dev outputs read against the teacher's on the same rows (sentence embeddings in
        the teacher's space: the student's queries against the teacher's passages); keys as :meth:`compute_metrics`
        names them, reported under ``teacher_index/``. Only called where :meth:`against_teacher` is true."""
        return {}

    def prediction_head(self, spec: TaskSpec) -> PredictionHead:
        """What the distillation objective asks of the head for this task (:class:`distill.method.objective.
        PredictionHead`: the logits of a model's outputs, the prediction loss and whether its inputs differ), bound
        to ``spec``: the method reads no task name, it calls this."""
        return PredictionHead(self, spec)

    def logits(self, outputs) -> torch.Tensor | None:
        """The head's output of a `transformers` model output as one tensor: (B, C) per example or (B, T, C) per
        token (:attr:`per_token`); None for a bare encoder. This default: ``outputs.logits``."""
        return getattr(outputs, "logits", None)

    # The head gives one row of logits per real token ((B, T, C); evaluation keeps each example's rows), not one per
    # example ((B, C)).
    per_token: bool = False
    # The layout of the model inputs, dimension by dimension: ("batch", "sequence") for every type here (a
    # multiple-choice type would give ("batch", "choice", "sequence")). Evaluation, timing and export inputs, the
    # teacher-output cache and length grouping ask it (:meth:`example_inputs`, :meth:`example_lengths`).
    input_dims: tuple[str, ...] = ("batch", "sequence")

    def example_inputs(self, config, batch_size: int, seq_length: int, generator: torch.Generator | None = None
                       ) -> dict[str, torch.Tensor]:
        """Model inputs of the type's layout for timing and export probes: random ids of ``config``'s vocabulary,
        every position real, token types where the model has them ((B, T) each in this default)."""
        low = min(1000, config.vocab_size - 1) if config.vocab_size > 2000 else 1
        ids = torch.randint(low, config.vocab_size, (batch_size, seq_length), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if getattr(config, "type_vocab_size", 0) > 1:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        return inputs

    def encoder_inputs(self, batch: dict) -> dict[str, torch.Tensor]:
        """The model inputs of a batch of this type's layout as the encoder reads them: one row a sequence, (N, T),
        every dimension before the sequence's flattened into N (a multiple-choice batch (B, C, T): N = B × C, as
        ``...ForMultipleChoice`` flattens it). The hidden states and attention scores captured for distillation are
        of those N rows, so the loss terms' masks, pruning's token counts and the capture check read this. This
        default: (B, T) inputs as they are."""
        names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in batch]
        if len(self.input_dims) == 2:
            return {name: batch[name] for name in names}
        return {name: batch[name].reshape(-1, batch[name].shape[-1]) for name in names}

    def example_lengths(self, dataset) -> list[int] | None:
        """Tokens per example of a tokenized dataset of this type's layout, for length grouping; None: the loop's own
        count of ``input_ids`` (:func:`distill.method.trainer.example_lengths`), right for (batch, sequence) inputs. A
        type of another layout counts what one example puts through the model (every choice's tokens)."""
        return None

    def head_config(self, spec: TaskSpec) -> dict:
        """The head's entries of a model config for the task: ``num_labels``, ``id2label``, ``label2id`` and, where
        ``transformers`` reads one, ``problem_type`` (so ``pipeline()`` applies the right output function). This
        default: one output per label name."""
        if not spec.label_names:  # an explicit id2label=None would reset num_labels
            return {"num_labels": spec.num_labels}
        labels = dict(enumerate(spec.label_names))
        return {"num_labels": spec.num_labels, "id2label": labels,
                "label2id": {name: i for i, name in labels.items()}}

    def init_head(self, spec: TaskSpec, model, train_data) -> None:
        """Start the new head of a teacher about to be fine-tuned, in place, from the training data (``train_data``:
        the examples it is fine-tuned on, before tokenisation). This default leaves the head as drawn."""

    def uses_temperature(self, spec: TaskSpec) -> bool:
        """Whether the prediction loss reads ``distill.temperature`` (soft targets do; a regression MSE does not)."""
        return True

    def describe_labels(self, spec: TaskSpec) -> str:
        """The task's labels in words, for the dry run (this default: the label names)."""
        return ", ".join(spec.label_names)

    def metric_context(self, spec: TaskSpec, data, split: str, tokenizer, max_seq_length: int) -> Any:
        """What :meth:`compute_metrics` needs beyond a split's outputs and labels to score it fully, from the task's
        untokenized ``data`` (every split; ``split`` the one scored), or None (this default: nothing more). Token
        classification: the scored words and the training set's entity names, for surface-form F1 and the F1 of
        entities seen and unseen in training."""
        return None

    def report_sections(self, spec: TaskSpec, metrics: dict[str, dict]) -> list[str]:
        """Markdown sections the report adds after its table, from each model's dev metrics ({model name: metrics}):
        what the type measures beyond the table's columns (a multi-label task's F1 per label). This default: none."""
        return []

    # Integer labels of a row are class ids of ``spec.label_names`` (shown by name in the dry run's preview); False
    # where they are something else (QA's answer offsets).
    labels_are_classes: bool = True

    supports_augmentation: bool = True  # TinyBERT's word replacement keeps this type's labels true
    # The teacher is used as the user deploys it (a sentence encoder): never fine-tuned, no head or labels to check,
    # any checkpoint of an encoder read as its encoder.
    teacher_as_is: bool = False
    augmentation_refusal: str = ""  # where it does not, what it would change, in words: "(answers and their offsets)"

    def finish_folder(self, spec: TaskSpec, model, folder, max_seq_length: int) -> None:
        """Write what else a saved model's folder needs beside its weights, config and tokenizer for the tools that
        read it (a sentence encoder's sentence-transformers modules). This default: nothing."""

    def serving_config(self, spec: TaskSpec, max_seq_length: int) -> dict:
        """Entries a model of this type keeps in its ``config.json`` (and its ONNX record) so that it is served as it
        was scored: {attribute: value}, set by :func:`record_serving` whenever a model is saved or exported. This
        default: none."""
        return {}

    def chance(self, spec: TaskSpec, dev_labels: Any = None) -> dict:
        """What a model that has learnt nothing (the best constant guess on the dev set) scores on
        ``spec.metrics[0]``: {"metric", "value", "basis" (in words)}; a teacher within 0.05 of it is refused."""
        raise NotImplementedError

    def same_prediction(self, outputs: Any, reference: Any, spec: TaskSpec, labels: Any = None) -> np.ndarray:
        """(N,) bool: whether two models' outputs (ONNX and PyTorch, say) predict the same for each example, at the
        positions that are scored (``labels``, per example, where the task has several)."""
        raise NotImplementedError

    def recipe(self, spec: TaskSpec, teacher_layers: int | None = None) -> tuple[str, str] | None:
        """The shipped config (a file of ``configs/``) that ``pipeline --task NAME`` runs for this task when the
        default job's is not made for it, and what it is for in words; None: the default job's. ``teacher_layers``:
        the depth of the teacher the user names (``--teacher``), None when not known; from
        :data:`DEEP_TEACHER_LAYERS` layers on, the type's recipe for a 12-layer teacher."""
        return None

    def card_task(self, spec: TaskSpec) -> str:
        """The model card's ``model-index`` task type (hub vocabulary)."""
        return self.pipeline_tag

    def usage(self, model: str, spec: "TaskSpec | None" = None) -> str:
        """Python that runs the student through ``transformers.pipeline`` (the model card's "Use" section); ``spec``:
        the task, where the call depends on it (a pair task's classifier takes both texts)."""
        raise NotImplementedError

    def replaceable_words(self, spec: TaskSpec, replace_entities: bool = False) -> Callable[[dict], list[bool]] | None:
        """For augmentation: which words of an example may be replaced (None: any the algorithm picks)."""
        return None

    def unlabelled_rows(self, spec: TaskSpec, texts: list[str]) -> dict[str, list]:
        """Training rows made of unlabelled sentences (``augment.unlabelled``, a transfer set whose only targets are
        the teacher's logits): {column: N values}, the task's text column and ``label``, a placeholder whose value no
        loss reads (the soft prediction loss takes the teacher's logits; a token classifier's reads only where a word
        begins, the pieces it scores; preflight refuses a hard-label term beside them).

        Raises:
            ValueError: this type, or this task (sentence pairs), cannot make a training row of one sentence.
        """
        raise ValueError(f"a {self.description} cannot take unlabelled sentences (one text a row)")

    def transfer_scores(self, spec: TaskSpec, logits: list[np.ndarray], labels: list[np.ndarray]) -> np.ndarray | None:
        """How much of what the student most needs to learn each unlabelled row holds, by the teacher's logits on it:
        ``augment.unlabelled_ranked`` keeps the rows with the highest scores (a transfer set chosen by the teacher's
        own predictions on unlabelled text). Called with no rows, it says whether the type has a score at all
        (preflight refuses the option for a type without one).

        Args:
            logits: the teacher's logits per row, as :func:`distill.tasks.evaluate.predict` gives them.
            labels: each row's ``labels`` as the type tokenizes it (a scored position's placeholder label; others
                ``IGNORE``).

        Returns:
            (N,) float64 scores, higher is kept first; None: this type has no such score.
        """
        return None


class PredictionHead:
    """A task type's answers for the distillation objective, bound to one task (TextBrewer's adaptor in spirit): the
    logits of a model's outputs, the prediction loss and whether its inputs differ. The objective calls these and
    never the task's name (:class:`distill.method.objective.DistillationObjective`)."""

    def __init__(self, task_type: TaskType, spec: TaskSpec):
        self.task_type, self.spec = task_type, spec

    def logits(self, outputs) -> torch.Tensor | None:
        return self.task_type.logits(outputs)

    def loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict, *, temperature: float,
             temperature_squared: bool, hard_label_weight: float) -> torch.Tensor:
        return self.task_type.prediction_loss(self.spec, student_logits, teacher_logits, batch, temperature=temperature,
                                              temperature_squared=temperature_squared,
                                              hard_label_weight=hard_label_weight)

    def inputs_differ(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.task_type.prediction_inputs_differ(self.spec, student_logits, teacher_logits, batch)

    def encoder_inputs(self, batch: dict) -> dict[str, torch.Tensor]:
        return self.task_type.encoder_inputs(batch)

    def example_inputs(self, config, batch_size: int, seq_length: int, generator: torch.Generator | None = None
                       ) -> dict[str, torch.Tensor]:
        return self.task_type.example_inputs(config, batch_size, seq_length, generator)


def pad_rows(rows: list, length: int, fill: float, dtype: torch.dtype, left: bool = False) -> torch.Tensor:
    """Rows of per-token values (each (T_i,) or (T_i, C)) padded with ``fill`` to (B, length[, C]), on the
    tokenizer's padding side (``left``)."""
    first = torch.as_tensor(rows[0], dtype=dtype)
    out = torch.full((len(rows), length, *first.shape[1:]), fill, dtype=dtype)
    for row, values in enumerate(rows):
        values = torch.as_tensor(values, dtype=dtype)
        out[row, slice(length - len(values), None) if left else slice(0, len(values))] = values
    return out



TASK_TYPES: dict[str, TaskType] = {}  # name -> the type's instance, in registration order
TASKS: dict[str, TaskSpec] = {}  # named tasks (--task NAME): the GLUE table, wnut_17, conll2003, squad, ...


def register_task_type(task_type: TaskType) -> TaskType:
    """Add a task type to :data:`TASK_TYPES` (its module calls this when imported); returns it."""
    TASK_TYPES[task_type.name] = task_type
    return task_type


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add a named task to :data:`TASKS` (its type's module calls this when imported); returns it."""
    TASKS[spec.name] = spec
    return spec


def get_task_type(name: str) -> TaskType:
    """The task type called ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in TASK_TYPES:
        raise ValueError(f"unknown task type {name!r}; use {', '.join(TASK_TYPES)}")
    return TASK_TYPES[name]


def get_task(name: str) -> TaskSpec:
    """The named :class:`TaskSpec` called ``name``; raises ValueError listing the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}, or a task of your own "
                         "files (task.train_file, task.text_columns, task.label_column)")
    return TASKS[name]


def metric_names() -> tuple[str, ...]:
    """Every metric a registered task type scores, each once, in registration order."""
    return tuple(dict.fromkeys(name for kind in TASK_TYPES.values() for name in kind.metric_names))


def headline_metrics(metrics: dict) -> list[str]:
    """The keys of a model's dev metrics that are registered metrics (:func:`metric_names`), or one of them with the
    suffix of another dev set (``accuracy_mismatched``): the columns of the report and the seeds summary, in order.
    Other keys a type adds (a label's F1, ``f1/joy``) stay in the records and the type's report sections."""
    names = metric_names()
    return [key for key in metrics if any(key == name or key.startswith(f"{name}_") for name in names)]


def markdown_table(first: str, models: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    """The lines of a Markdown table for a report section: a column ``first`` and one per model, then each row's label
    and its cells (already formatted, one per model)."""
    return (["| " + " | ".join([first, *models]) + " |", "|---|" + "---|" * len(models)]
            + [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows])


def summary_metrics(metrics: dict) -> list[str]:
    """The columns of the seeds summary: each of :func:`headline_metrics` and of the keys of these dev metrics that a
    registered type names in :attr:`TaskType.summary_metrics` (NER's F1 on entities unseen in training), on the dev
    set's report half (``report/<metric>``, where scored: :mod:`distill.tasks.split`), then the same on the whole dev
    set, then on its tuning half."""
    extras = dict.fromkeys(name for kind in TASK_TYPES.values() for name in kind.summary_metrics)
    whole = headline_metrics(metrics) + [name for name in extras if name in metrics]
    return ([f"report/{name}" for name in whole if f"report/{name}" in metrics] + whole
            + [f"tuning/{name}" for name in whole if f"tuning/{name}" in metrics])


def head_type(architectures: list[str], default: str | None = DEFAULT_TYPE) -> TaskType | None:
    """The task type whose head a checkpoint of these ``architectures`` carries (its :attr:`TaskType.architecture`
    ends one of them; where several types share a head class, the ``default`` one if it is among them, else the first
    registered); with none, the ``default`` type (None: None)."""
    found = [t for t in TASK_TYPES.values() if any(a.endswith(t.architecture) for a in architectures)]
    if default is not None and (not found or any(t.name == default for t in found)):
        return TASK_TYPES[default]
    return found[0] if found else None


def load_head_model(folder, **kwargs):
    """A saved checkpoint with the head it was saved with (sequence or token classifier, ...), read from its config's
    ``architectures`` (:func:`head_type`); a checkpoint naming none of them loads as a sequence classifier.

    Raises:
        OSError: ``folder`` holds no checkpoint (as ``from_pretrained`` raises it).
    """
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(folder).architectures or []
    return head_type(architectures).model_class(None).from_pretrained(folder, **kwargs)


def record_serving(model, spec: TaskSpec, max_seq_length: int, keep: bool = False) -> dict:
    """Set the task type's :meth:`TaskType.serving_config` entries on ``model.config`` (before it is saved), and
    return them as they now are there.

    Args:
        model: a model with a ``config``.
        spec: the task. max_seq_length: the word pieces per example it was trained and scored with.
        keep: leave an entry the config already has as it is (an export of a student saved with its own).
    """
    entries = spec.type.serving_config(spec, max_seq_length)
    for name, value in entries.items():
        if not (keep and getattr(model.config, name, None) is not None):
            setattr(model.config, name, value)
    return {name: getattr(model.config, name) for name in entries}


def tuned_from(spec: TaskSpec, metrics: dict) -> dict:
    """The settings a model's type chose on the dev set's tuning half (:meth:`TaskType.tuned_settings` of its
    ``tuning/<metric>`` scores), {} where it chose none or the metrics have no tuning half."""
    tuning = {key.split("/", 1)[1]: value for key, value in metrics.items() if key.startswith("tuning/")}
    return spec.type.tuned_settings(spec, tuning) if tuning else {}


def record_tuned(model, spec: TaskSpec, metrics: dict) -> dict:
    """Set the settings chosen on the dev set's tuning half (:func:`tuned_from`: a multi-label ``decision_threshold``)
    on ``model.config`` before it is saved, so the model ships with the settings it was scored with; returns them."""
    settings = tuned_from(spec, metrics)
    for name, value in settings.items():
        setattr(model.config, name, value)
    return settings


def saved_settings(config, spec: TaskSpec) -> dict:
    """The tuned settings a saved model's config carries (:func:`record_tuned`), {} for none: what it is scored and
    served with."""
    probe = spec.type.tuned_settings(spec, {name: 0.0 for name in spec.metrics})  # which names the type keeps
    return {name: getattr(config, name) for name in probe if getattr(config, name, None) is not None}


def check_model_head(folder, spec: TaskSpec, role: str) -> None:
    """A saved model fits the task it is about to be scored or exported on: its head is the task type's, with the
    task's number of labels and, where it names them, the task's labels in order (a model loaded on the wrong task
    would otherwise get a new random head, or be scored against labels it never had).

    Args:
        folder: the checkpoint folder. spec: the task. role: how the command line names it ("--teacher", ...).

    Raises:
        ModelError: one line naming the model, what it is, what the task needs and how to give the right task.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    architectures = config.architectures or []
    if spec.type.teacher_as_is:  # any encoder: no head or labels to check
        return
    kind = spec.type if any(a.endswith(spec.type.architecture) for a in architectures) else \
        head_type(architectures, default=None)
    names = [str(config.id2label[i]) for i in sorted(config.id2label)] if config.id2label else []
    generic = all(name.lower().startswith("label_") for name in names)
    if kind is spec.type and config.num_labels == spec.num_labels and (
            generic or spec.is_regression or [n.lower() for n in names] == [n.lower() for n in spec.label_names]):
        return
    what = f"a {kind.description}" if kind else "a model without a task head"
    labels = "" if generic else f" {names}"
    needs = ", ".join(spec.label_names) or "one score"
    raise ModelError(f"{role} {folder} is {what} ({', '.join(architectures) or 'no architecture'}, {config.num_labels} "
                     f"labels{labels}) and task {spec.name} needs a {spec.type.description} of {spec.num_labels} "
                     f"({needs}): it was made for another task; give the config of the run that made it (--config "
                     "RUN/config.json) or its task (--task NAME --data-dir DIR)")
