"""Task types: what a kind of task is, in one place that the rest of the code asks.

A task (:class:`distill.tasks.data.TaskSpec`: SST-2, MRPC, WNUT-17, a user's files) has a task type that says how its data
read and tokenise, which `transformers` head the teacher and the student carry, how a batch is padded, what the
prediction step's loss is, how its outputs are scored and what a model that learnt nothing scores, what augmentation
may change, and how the model card and ``pipeline()`` name it. The stages, the training loop and the objective never
branch on the task: they call its type. A new head is one module here and its tests.

Types: ``sequence_classification`` (classification and regression of one text or a pair: GLUE, a user's CSV/JSONL),
``token_classification`` (one label per word: NER, with BIO tags), ``question_answering`` (extractive QA: a span of
the context, SQuAD v1.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

    from distill.tasks.data import TaskSpec


class TaskType:
    """The interface of a task type (every method takes the task's :class:`~distill.tasks.data.TaskSpec` where it needs
    it). Shapes: N examples, B batch, T tokens, C labels."""

    name: str = ""
    pipeline_tag: str = ""  # the hub's pipeline tag of the model card, and the pipeline() task name
    architecture: str = ""  # the end of a checkpoint's architecture name with this head, e.g. ForTokenClassification
    description: str = ""  # in words, for messages: "sequence classifier"

    def model_class(self, spec: "TaskSpec") -> type:
        """The ``transformers`` Auto class of the head (teacher and student)."""
        raise NotImplementedError

    def read_split(self, path, spec: "TaskSpec") -> "datasets.Dataset":
        """One split from a local file in the task's layout (GLUE TSV, CoNLL, ...), columns ``spec.text_columns``
        and ``label``."""
        raise NotImplementedError

    def user_spec(self, config) -> "TaskSpec":
        """The spec of a task of the user's own files (``task.train_file``, ``dev_file``, ...) of this type."""
        raise NotImplementedError

    def read_user_split(self, path, spec: "TaskSpec", split: str = "train") -> "datasets.Dataset":
        """One split of the user's own files, columns ``spec.text_columns`` and ``label``; ``split`` ("train" or
        "dev") picks the split of a source that holds several (a saved ``DatasetDict``, a hub dataset)."""
        raise NotImplementedError

    def tokenize(self, dataset: "datasets.Dataset", tokenizer: "PreTrainedTokenizerBase", spec: "TaskSpec",
                 max_seq_length: int) -> "datasets.Dataset":
        """Model inputs and ``labels``, unpadded."""
        raise NotImplementedError

    def collator(self, tokenizer: "PreTrainedTokenizerBase") -> Callable[[list[dict]], dict[str, torch.Tensor]]:
        """Pads tokenized examples (and cached ``teacher_logits``) into a batch."""
        raise NotImplementedError

    def compute_metrics(self, spec: "TaskSpec", outputs: Any, labels: Any) -> dict[str, float]:
        """The task's metrics (``spec.metrics``) from the outputs :func:`distill.tasks.evaluate.predict` returns."""
        raise NotImplementedError

    def prediction_loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor | None,
                        *, temperature: float, temperature_squared: bool, hard_label_weight: float,
                        regression: bool, batch: dict | None = None) -> torch.Tensor:
        """The prediction step's loss (TinyBERT Eq. 10 in the head's output space), a float32 scalar. ``labels`` is
        the batch's ``labels``; ``batch`` the whole batch, for a type whose loss reads more of it (QA: which
        positions may hold an answer)."""
        raise NotImplementedError

    def prediction_inputs_differ(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                                 labels: torch.Tensor | None, batch: dict | None = None) -> torch.Tensor:
        """Scalar bool tensor: whether the student's and the teacher's logits differ at a position
        :meth:`prediction_loss` reads. A loss exactly 0 while this is true stops training (a sum or count lost to
        rounding); positions the loss does not read (padding, unscored pieces) must not make it true, or a batch
        with nothing scored, whose loss is 0 by definition, would stop it. This default: every position."""
        return (student_logits.float() != teacher_logits.float()).any()

    supports_augmentation: bool = True  # TinyBERT's word replacement keeps this type's labels true

    def serving_config(self, spec: "TaskSpec", max_seq_length: int) -> dict:
        """Entries a model of this type keeps in its ``config.json`` (and its ONNX record) so that it is served as it
        was scored: {attribute: value}, set by :func:`record_serving` whenever a model is saved or exported. This
        default: none."""
        return {}

    def chance(self, spec: "TaskSpec", dev_labels: Any = None) -> dict:
        """What a model that has learnt nothing (the best constant guess on the dev set) scores on
        ``spec.metrics[0]``: {"metric", "value", "basis" (in words)} (see :func:`teachers.finetune.chance`)."""
        raise NotImplementedError

    def same_prediction(self, outputs: Any, reference: Any, spec: "TaskSpec", labels: Any = None) -> np.ndarray:
        """(N,) bool: whether two models' outputs (ONNX and PyTorch, say) predict the same for each example, at the
        positions that are scored (``labels``, per example, where the task has several)."""
        raise NotImplementedError

    def recipe(self, spec: "TaskSpec") -> tuple[str, str] | None:
        """The shipped config (a file of ``configs/``) that ``pipeline --task NAME`` runs for this task when the
        default job's is not made for it, and what it is for in words; None: the default job's."""
        return None

    def card_task(self, spec: "TaskSpec") -> str:
        """The model card's ``model-index`` task type (hub vocabulary)."""
        return self.pipeline_tag

    def usage(self, model: str, spec: "TaskSpec | None" = None) -> str:
        """Python that runs the student through ``transformers.pipeline`` (the model card's "Use" section); ``spec``:
        the task, where the call depends on it (a pair task's classifier takes both texts)."""
        raise NotImplementedError

    def replaceable_words(self, spec: "TaskSpec", replace_entities: bool = False) -> Callable[[dict], list[bool]] | None:
        """For augmentation: which words of an example may be replaced (None: any the algorithm picks)."""
        return None

    def unlabelled_rows(self, spec: "TaskSpec", texts: list[str]) -> dict[str, list]:
        """Training rows made of unlabelled sentences (``augment.unlabelled``, a transfer set whose only targets are
        the teacher's logits): {column: N values}, the task's text column and ``label``, a placeholder whose value no
        loss reads (the soft prediction loss takes the teacher's logits; a token classifier's reads only where a word
        begins, the pieces it scores; preflight refuses a hard-label term beside them).

        Raises:
            ValueError: this type, or this task (sentence pairs), cannot make a training row of one sentence.
        """
        raise ValueError(f"a {self.description} cannot take unlabelled sentences (one text a row)")


class SequenceClassification(TaskType):
    """One label (or one score, for regression) per text or text pair: GLUE tasks and a user's CSV/TSV/JSONL."""

    name = "sequence_classification"
    pipeline_tag = "text-classification"
    architecture = "ForSequenceClassification"
    description = "sequence classifier"

    def model_class(self, spec):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification

    def read_split(self, path, spec):
        from distill.tasks.data import read_glue_tsv

        return read_glue_tsv(path, spec)

    def user_spec(self, config):
        from distill.tasks.data import sequence_user_spec

        return sequence_user_spec(config)

    def read_user_split(self, path, spec, split="train"):
        from distill.tasks.data import DEV_SPLITS, read_user_table

        return read_user_table(path, spec, "train" if split == "train" else DEV_SPLITS)

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        from distill.tasks.data import tokenize_texts

        return tokenize_texts(dataset, tokenizer, spec, max_seq_length)

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def compute_metrics(self, spec, outputs, labels):
        from distill.tasks.evaluate import sequence_metrics

        return sequence_metrics(spec, np.asarray(outputs), np.asarray(labels))

    def prediction_loss(self, student_logits, teacher_logits, labels, *, temperature, temperature_squared,
                        hard_label_weight, regression, batch=None):
        from distill.method.losses import prediction_loss

        return prediction_loss(student_logits, teacher_logits, temperature, temperature_squared, regression, labels,
                               hard_label_weight)

    def chance(self, spec, dev_labels=None):
        from teachers.finetune import chance

        return chance(spec, dev_labels)

    def recipe(self, spec):
        if len(spec.text_columns) == 2 or spec.is_regression:
            return "pair_minilm.yaml", "the recipe for pair and regression tasks"
        return None

    def card_task(self, spec):
        return "text-regression" if spec.is_regression else "text-classification"

    def usage(self, model, spec=None):
        start = f'from transformers import pipeline\n\nclassify = pipeline("text-classification", model="{model}")\n'
        if spec is not None and len(spec.text_columns) == 2:  # a pair: both texts, as the model was trained on them
            first, second = spec.text_columns
            return start + (f'# {first} and {second}\nprint(classify({{"text": "A man is playing a guitar.", '
                            '"text_pair": "A person plays an instrument."}))')
        return start + 'print(classify("a charming and often affecting journey"))'

    def unlabelled_rows(self, spec, texts):
        if len(spec.text_columns) != 1:
            raise ValueError(f"{spec.name} classifies text pairs ({', '.join(spec.text_columns)}); unlabelled text "
                             "gives one sentence a row")
        return {spec.text_columns[0]: list(texts), "label": [0.0 if spec.is_regression else 0] * len(texts)}

    def same_prediction(self, outputs, reference, spec, labels=None):
        """Classes: the same arg-max. Regression: the two scores within 1% of the range the reference's scores span
        on these examples (STS-B's 0-5 scale: about 0.05), a rule without a unit of its own."""
        outputs, reference = np.asarray(outputs, dtype=np.float64), np.asarray(reference, dtype=np.float64)
        if spec.is_regression:
            scores, expected = outputs.reshape(len(outputs), -1)[:, 0], reference.reshape(len(reference), -1)[:, 0]
            span = float(expected.max() - expected.min()) if len(expected) else 0.0
            return np.abs(scores - expected) <= 0.01 * span
        return outputs.argmax(-1) == reference.argmax(-1)


class TokenClassification(TaskType):
    """One label per word (NER, slot filling, PoS) with BIO tags scored by seqeval at the entity level
    (:mod:`distill.tasks.token_classification`)."""

    name = "token_classification"
    pipeline_tag = "token-classification"
    architecture = "ForTokenClassification"
    description = "token classifier"

    def model_class(self, spec):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification

    def read_split(self, path, spec):
        from distill.tasks.token_classification import read_tagged_file

        return read_tagged_file(path, spec)

    def user_spec(self, config):
        from distill.tasks.token_classification import user_spec

        return user_spec(config)

    def read_user_split(self, path, spec, split="train"):
        return self.read_split(path, spec)  # one file a split

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        from distill.tasks.token_classification import tokenize_words

        return tokenize_words(dataset, tokenizer, max_seq_length)

    def collator(self, tokenizer):
        from distill.tasks.token_classification import TokenCollator

        return TokenCollator(tokenizer)

    def compute_metrics(self, spec, outputs, labels):
        from distill.tasks.token_classification import entity_metrics

        metrics = entity_metrics(outputs, labels, spec.label_names)
        return {name: metrics[name] for name in spec.metrics}

    def prediction_loss(self, student_logits, teacher_logits, labels, *, temperature, temperature_squared,
                        hard_label_weight, regression, batch=None):
        from distill.tasks.token_classification import IGNORE, token_soft_cross_entropy

        if labels is None:
            raise ValueError("token classification: the prediction loss needs the batch's labels (which word pieces "
                             "are scored)")
        loss = token_soft_cross_entropy(student_logits, teacher_logits, labels, temperature)
        if temperature_squared:
            loss = loss * temperature**2
        if hard_label_weight > 0:
            hard = torch.nn.functional.cross_entropy(student_logits.float().flatten(0, 1), labels.flatten(),
                                                     ignore_index=IGNORE, reduction="sum")
            hard = hard / (labels != IGNORE).sum().clamp(min=1)  # 0, not NaN, on a batch with no scored token
            loss = loss + hard_label_weight * hard
        return loss

    def prediction_inputs_differ(self, student_logits, teacher_logits, labels, batch=None):
        from distill.tasks.token_classification import IGNORE

        scored = labels != IGNORE  # the padded teacher logits are zeros, never read
        return (student_logits[scored].float() != teacher_logits[scored].float()).any()

    def recipe(self, spec):
        return "ner_minilm.yaml", "the recipe for token classification"

    def chance(self, spec, dev_labels=None):
        from distill.tasks.token_classification import constant_guess

        return constant_guess(spec, dev_labels)

    def usage(self, model, spec=None):
        # "first": each word takes its first piece's tag, the piece the loss and the entity scores read (the other
        # pieces are never trained, so "simple" could serve a word's tail as another entity).
        return (f'from transformers import pipeline\n\ntag = pipeline("token-classification", model="{model}", '
                'aggregation_strategy="first")\nprint(tag("Empire State Building is in New York"))')

    def same_prediction(self, outputs, reference, spec, labels=None):
        from distill.tasks.token_classification import IGNORE

        same = []
        for i, (a, b) in enumerate(zip(outputs, reference)):
            a, b = np.asarray(a).argmax(-1), np.asarray(b).argmax(-1)
            scored = np.asarray(labels[i]) != IGNORE if labels is not None else np.ones(len(a), dtype=bool)
            same.append(np.array_equal(a[scored], b[scored]))  # every scored word predicted alike
        return np.array(same, dtype=bool)

    def unlabelled_rows(self, spec, texts):
        from augment.augmenter import split_words

        words = [[text[start:end] for start, end in split_words(text)] for text in texts]
        return {spec.text_columns[0]: words, "label": [[0] * len(w) for w in words]}  # tag 0 marks a scored word

    def replaceable_words(self, spec, replace_entities=False):
        if replace_entities:
            return None  # any word the algorithm picks, its tag kept
        from augment.tokens import only_tags

        return only_tags(spec.label_names)  # words tagged O only: an entity is never rewritten


class QuestionAnswering(TaskType):
    """Extractive question answering: the answer is a span of the context, given by start and end logits stacked
    into (T, 2) per feature (:mod:`distill.tasks.question_answering`: SQuAD v1.1 JSON, features over long contexts,
    span post-processing, the official EM and F1). TinyBERT's augmentation is not used, as in the paper's SQuAD
    runs: replacing context words would move or change the answers."""

    name = "question_answering"
    pipeline_tag = "question-answering"
    architecture = "ForQuestionAnswering"
    description = "question-answering reader"
    supports_augmentation = False

    def model_class(self, spec):
        from transformers import AutoModelForQuestionAnswering

        return AutoModelForQuestionAnswering

    def read_split(self, path, spec):
        from distill.tasks.question_answering import read_squad

        return read_squad(path, spec)

    def user_spec(self, config):
        from distill.tasks.question_answering import squad_spec

        return squad_spec(config)

    def read_user_split(self, path, spec, split="train"):
        return self.read_split(path, spec)  # one file a split

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        from distill.tasks.question_answering import doc_stride, tokenize_questions

        return tokenize_questions(dataset, tokenizer, max_seq_length, doc_stride(max_seq_length))

    def collator(self, tokenizer):
        from distill.tasks.question_answering import QuestionAnsweringCollator

        return QuestionAnsweringCollator(tokenizer)

    def compute_metrics(self, spec, outputs, labels):
        from distill.tasks.question_answering import squad_metrics

        metrics = squad_metrics(outputs, labels)
        return {name: metrics[name] for name in spec.metrics}

    def prediction_loss(self, student_logits, teacher_logits, labels, *, temperature, temperature_squared,
                        hard_label_weight, regression, batch=None):
        from distill.tasks.question_answering import span_cross_entropy, span_soft_cross_entropy

        if batch is None or "context_mask" not in batch:
            raise ValueError("question answering: the prediction loss needs the batch's context_mask (which "
                             "positions may hold an answer)")
        loss = span_soft_cross_entropy(student_logits, teacher_logits, batch["context_mask"], temperature)
        if temperature_squared:
            loss = loss * temperature**2
        if hard_label_weight > 0:
            loss = loss + hard_label_weight * span_cross_entropy(
                student_logits, batch["start_positions"], batch["end_positions"], batch["context_mask"])
        return loss

    def prediction_inputs_differ(self, student_logits, teacher_logits, labels, batch=None):
        if batch is None or "context_mask" not in batch:
            raise ValueError("question answering: comparing the prediction inputs needs the batch's context_mask "
                             "(which positions may hold an answer)")
        allowed = batch["context_mask"].bool()  # (B, T): [CLS] and the context, where the loss reads both outputs
        return (student_logits[allowed].float() != teacher_logits[allowed].float()).any()

    def recipe(self, spec):
        return "squad_minilm.yaml", "the recipe for extractive question answering"

    def serving_config(self, spec, max_seq_length):
        from distill.tasks.question_answering import WINDOWS_KEY, reader_windows

        return {WINDOWS_KEY: reader_windows(max_seq_length)}  # read by QuestionAnswerer

    def chance(self, spec, dev_labels=None):
        # A reader that has learnt nothing finds no answer: EM and F1 0 (a random span scores a few points of F1,
        # which the refusal margin covers).
        return {"metric": spec.metrics[0], "value": 0.0, "basis": "no answer found"}

    def usage(self, model, spec=None):
        # transformers 5 has no question-answering pipeline (transformers 4's reads the checkpoint as it is).
        return (f'from distill import QuestionAnswerer\n\nanswer = QuestionAnswerer("{model}")  # or "{model}/onnx/'
                'model.onnx"\nprint(answer(question="Where is the Empire State Building?", context="The Empire State '
                'Building is a skyscraper in Midtown Manhattan, New York City."))')

    def same_prediction(self, outputs, reference, spec, labels=None):
        from distill.tasks.question_answering import answers

        if labels is None:  # per feature: the same start and end piece
            return np.array([np.array_equal(np.asarray(a).argmax(0), np.asarray(b).argmax(0))
                             for a, b in zip(outputs, reference)], dtype=bool)
        # per question: the same answer span, the best over its features (a losing window may differ freely)
        ours, theirs = answers(outputs, labels), answers(reference, labels)
        return np.array([(ours[q]["start"], ours[q]["end"]) == (theirs[q]["start"], theirs[q]["end"])
                         for q in sorted(ours)], dtype=bool)


def pad_rows(rows: list, length: int, fill: float, dtype: torch.dtype, left: bool = False) -> torch.Tensor:
    """Rows of per-token values (each (T_i,) or (T_i, C)) padded with ``fill`` to (B, length[, C]), on the
    tokenizer's padding side (``left``)."""
    first = torch.as_tensor(rows[0], dtype=dtype)
    out = torch.full((len(rows), length, *first.shape[1:]), fill, dtype=dtype)
    for row, values in enumerate(rows):
        values = torch.as_tensor(values, dtype=dtype)
        out[row, slice(length - len(values), None) if left else slice(0, len(values))] = values
    return out


TASK_TYPES: dict[str, TaskType] = {t.name: t for t in (SequenceClassification(), TokenClassification(),
                                                       QuestionAnswering())}


def get_task_type(name: str) -> TaskType:
    """The task type called ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in TASK_TYPES:
        raise ValueError(f"unknown task type {name!r}; use {', '.join(TASK_TYPES)}")
    return TASK_TYPES[name]


def record_serving(model, spec: "TaskSpec", max_seq_length: int, keep: bool = False) -> dict:
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


def check_model_head(folder, spec: "TaskSpec", role: str) -> None:
    """A saved model fits the task it is about to be scored or exported on: its head is the task type's, with the
    task's number of labels and, where it names them, the task's labels in order (a model loaded on the wrong task
    would otherwise get a new random head, or be scored against labels it never had).

    Args:
        folder: the checkpoint folder. spec: the task. role: how the command line names it ("--teacher", ...).

    Raises:
        ModelError: one line naming the model, what it is, what the task needs and how to give the right task.
    """
    from transformers import AutoConfig

    from teachers.models import ModelError

    config = AutoConfig.from_pretrained(folder)
    architectures = config.architectures or []
    kind = next((t for t in TASK_TYPES.values() if any(a.endswith(t.architecture) for a in architectures)), None)
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


def load_head_model(folder, **kwargs):
    """A saved checkpoint with the head it was saved with (sequence or token classifier, ...), read from its config's
    ``architectures`` against each task type's :attr:`TaskType.architecture`; a checkpoint naming none of them loads
    as a sequence classifier, as before task types existed.

    Raises:
        OSError: ``folder`` holds no checkpoint (as ``from_pretrained`` raises it).
    """
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(folder).architectures or []
    kind = next((t for t in TASK_TYPES.values() if any(a.endswith(t.architecture) for a in architectures)),
                TASK_TYPES["sequence_classification"])
    return kind.model_class(None).from_pretrained(folder, **kwargs)
