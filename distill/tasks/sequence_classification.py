"""Sequence classification and regression: one label (or one score) per text or text pair. The GLUE tasks and a
user's CSV/TSV/JSONL files; the teacher and student are ``...ForSequenceClassification`` models, the prediction loss
is TinyBERT's soft cross-entropy (Eq. 10; MSE to the teacher's score for regression), the metrics GLUE's.

Everything this type knows is here: the GLUE table (registered as named tasks), reading GLUE TSV folders and a user's
tables, tokenising, metrics, chance and the head's config.
"""

from __future__ import annotations

import csv
import logging
import math
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from distill.method.losses import prediction_loss, score_loss
from distill.tasks.base import DataError, TaskSpec, TaskType, deep, register_task, register_task_type
from distill.tasks.files import DEV_SPLITS, _diagnose, read_table, require_columns

logger = logging.getLogger(__name__)


def _glue(name, text_columns, label_column, label_names, metrics=("accuracy",), **kwargs) -> TaskSpec:
    return TaskSpec(name, tuple(text_columns), label_column, tuple(label_names), tuple(metrics), ("glue", name),
                    **kwargs)


# The GLUE tasks (Wang et al., 2018) with the hub's label order and GLUE's metrics. TSV layouts are those of the GLUE
# download script (CoLA has no header line; MNLI has two dev sets).
GLUE: dict[str, TaskSpec] = {
    "cola": _glue("cola", ["sentence"], "label", ["unacceptable", "acceptable"], ["matthews_corrcoef"],
                  header=("source", "label", "label_notes", "sentence")),
    "sst2": _glue("sst2", ["sentence"], "label", ["negative", "positive"]),
    "mrpc": _glue("mrpc", ["sentence1", "sentence2"], "Quality", ["not_equivalent", "equivalent"],
                  ["accuracy", "f1"], tsv_columns={"#1 String": "sentence1", "#2 String": "sentence2"}),
    "stsb": _glue("stsb", ["sentence1", "sentence2"], "score", [], ["pearson", "spearmanr"]),
    "qqp": _glue("qqp", ["question1", "question2"], "is_duplicate", ["not_duplicate", "duplicate"],
                 ["accuracy", "f1"]),
    "mnli": _glue("mnli", ["premise", "hypothesis"], "gold_label", ["entailment", "neutral", "contradiction"],
                  tsv_columns={"sentence1": "premise", "sentence2": "hypothesis"}, dev_file="dev_matched.tsv",
                  hub_dev_split="validation_matched",
                  extra_dev=(("mismatched", "dev_mismatched.tsv", "validation_mismatched"),)),
    "qnli": _glue("qnli", ["question", "sentence"], "label", ["entailment", "not_entailment"]),
    "rte": _glue("rte", ["sentence1", "sentence2"], "label", ["entailment", "not_entailment"]),
    "wnli": _glue("wnli", ["sentence1", "sentence2"], "label", ["not_entailment", "entailment"]),
}

GLUE_TASKS = tuple(GLUE)
SEQUENCE_METRICS = ("accuracy", "f1", "matthews_corrcoef", "pearson", "spearmanr")  # the GLUE tasks' metrics


def sequence_user_spec(config) -> TaskSpec:
    """The spec of a user's sequence classification or regression files (see :func:`task_spec`)."""
    if not config.text_columns:
        raise DataError("task.text_columns: name the text column(s) of task.train_file, e.g. [sentence] or "
                        "[question, passage]")
    label_names: tuple[str, ...] = ()
    if not config.regression:
        label_names = tuple(config.label_names or _label_values(config))
    metrics = tuple(config.metrics or (("pearson", "spearmanr") if config.regression else
                                       ("accuracy", "f1") if len(label_names) == 2 else ("accuracy",)))
    other = [m for m in metrics if m not in SEQUENCE_METRICS]
    if other:
        raise DataError(f"task.metrics: {other} score other task types (token classification, question "
                        f"answering); a sequence task takes {', '.join(SEQUENCE_METRICS)}")
    if "f1" in metrics and len(label_names) != 2:
        raise DataError(f"task.metrics: f1 scores the positive class of a two-class task; this one has "
                        f"{len(label_names) or 'no'} classes ({', '.join(label_names) or 'regression'}): use accuracy "
                        "or matthews_corrcoef")
    if "f1" in metrics:
        logger.info("task %s: f1 scores class %r (the second label) as the positive class", config.name,
                    label_names[1])
    return TaskSpec(config.name, tuple(config.text_columns), config.label_column, label_names, metrics, hub=None,
                    dev_file=config.dev_file or "", train_file=config.train_file)


# A class with fewer than this share of the training examples is named in a warning (a typo is the usual cause).
RARE_CLASS_SHARE = 0.01


def _label_values(config) -> list[str]:
    """The classes of a user's task without ``label_names``: the distinct labels of its training file, sorted.

    Raises:
        DataError: fewer than two classes, or labels in the dev file that the training file does not have (a typo
            would otherwise be a class of its own, or the run would fail later on one line of the dev file).
    """
    train = read_table(config.train_file)
    require_columns(train, [config.label_column], config.train_file)
    # As labels are matched (:func:`_parse_label`): stripped, any case; two spellings of one label are refused.
    # An empty label is no class: _parse_label names its line.
    counts = Counter(str(v).strip() for v in train[config.label_column] if v is not None and str(v).strip())
    spellings: dict[str, list[str]] = {}
    for value in counts:
        spellings.setdefault(value.lower(), []).append(value)
    clashing = sorted(sorted(group) for group in spellings.values() if len(group) > 1)
    if clashing:
        raise DataError(f"{config.train_file}: labels {clashing[0]} differ only in case, which is read as one label; "
                        "write each label one way, or set task.label_names")
    values = sorted(counts)
    if all(v.lstrip("-").isdigit() for v in values):
        values.sort(key=int)
    if len(values) < 2:
        raise DataError(f"{config.train_file}: column {config.label_column!r} has {len(values)} distinct label(s) "
                        f"({values}); a classification task needs two or more, or set task.regression: true")
    if config.dev_file:
        dev = read_table(config.dev_file, split=DEV_SPLITS)
        require_columns(dev, [config.label_column], config.dev_file)
        known = {v.lower() for v in values}
        unseen = sorted({str(v).strip() for v in dev[config.label_column]
                         if v is not None and str(v).strip() and str(v).strip().lower() not in known})
        if unseen:
            raise DataError(f"{config.dev_file}: label(s) {unseen} are in the dev set but not in the training set "
                            f"{config.train_file} (labels there: {values}); fix them, or set task.label_names to every "
                            "class")
    total = sum(counts.values())
    for value in values:
        if counts[value] < RARE_CLASS_SHARE * total:
            logger.warning("task %s: label %r is on %d of %d training examples (under %.0f%%): a typo? fix it, or "
                           "set task.label_names", config.name, value, counts[value], total, 100 * RARE_CLASS_SHARE)
    logger.info("task %s: labels %s (from %s; set task.label_names to fix their order)", config.name, values,
                config.train_file)
    return values


def read_glue_tsv(path: Path, spec: TaskSpec) -> datasets.Dataset:
    """Read one GLUE-format TSV file (header line, tab-separated, no quoting) into a Dataset.

    Raises:
        DataError: the file is empty, a needed column is missing (present ones listed), a line has the wrong number
            of fields (line number given), or a label is outside the task's label set.
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist; a GLUE folder for {spec.name} holds {spec.train_file} and "
                        f"{', '.join([spec.dev_file, *(f for _, f, _ in spec.extra_dev)])}")
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path}: {_diagnose(path, error)}") from None
    while rows and not rows[-1]:  # blank lines at the end of the file
        rows.pop()
    if not rows:
        raise DataError(f"{path} is empty; a GLUE TSV file starts with a header line")
    if spec.header is not None:  # headerless format (CoLA)
        rows.insert(0, list(spec.header))
        first_line = 1
    else:
        first_line = 2
    header = [spec.tsv_columns.get(name, name) for name in rows[0]]
    needed = [*spec.text_columns, spec.label_column]
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; present: {rows[0]}")
    positions = {c: header.index(c) for c in needed}
    columns: dict[str, list] = {c: [] for c in (*spec.text_columns, "label")}
    for line_number, row in enumerate(rows[1:], start=first_line):
        if len(row) != len(header):
            raise DataError(
                f"{path}, line {line_number}: expected {len(header)} tab-separated fields, found {len(row)}; "
                "fix or remove that line (a stray tab or newline inside a text field is the usual cause)"
            )
        for c in spec.text_columns:
            columns[c].append(row[positions[c]])
        columns["label"].append(_parse_label(row[positions[spec.label_column]], spec, path, line_number))
    if not columns["label"]:
        raise DataError(f"{path} has a header line but no example")
    return datasets.Dataset.from_dict(columns)


def _parse_label(value, spec: TaskSpec, path: Path | str, line_number: int) -> int | float:
    """A label as written (class id, class name, or score) -> class id or float score."""
    text = str(value).strip()
    if not text:
        raise DataError(f"{path}, line {line_number}: no label (an empty field, or a row short of fields)")
    if spec.is_regression:
        try:
            score = float(text)
        except ValueError:
            raise DataError(f"{path}, line {line_number}: score {value!r} is not a number") from None
        if not math.isfinite(score):
            raise DataError(f"{path}, line {line_number}: score {value!r} is not a finite number")
        return score
    names = [n.lower() for n in spec.label_names]
    if text.lower() in names:
        return names.index(text.lower())
    label = int(text) if text.lstrip("-").isdigit() else -1
    if not 0 <= label < spec.num_labels:
        raise DataError(
            f"{path}, line {line_number}: label {value!r} is not one of the {spec.name} labels "
            f"0..{spec.num_labels - 1} ({', '.join(spec.label_names)})"
        )
    return label


def read_user_table(source: str, spec: TaskSpec, split: str | tuple[str, ...] = "train") -> datasets.Dataset:
    """One split of a user's CSV/TSV/JSONL file for a sequence task: the text column(s) and ``label`` (class id, or
    float score).

    Args:
        source: a file, a saved dataset folder or a hub dataset (:func:`read_table`).
        split: the split read from a saved ``DatasetDict`` or a hub dataset (a tuple: the first present, e.g.
            :data:`DEV_SPLITS`); a file holds one.

    Raises:
        DataError: no example, a missing column, a row without its text, a label not in the label set (naming the
            file and line).
    """
    table = read_table(source, split=split, text_columns=spec.text_columns)
    require_columns(table, [*spec.text_columns, spec.label_column], source)
    if len(table) == 0:
        raise DataError(f"{source}: no example (a header line alone)")
    # Row i of the table is line i + 2 of a CSV/TSV file (after the header), line i + 1 of a JSONL file.
    offset = 1 if Path(source).suffix in (".jsonl", ".json") else 2
    labels = [_parse_label(value, spec, source, i + offset) for i, value in enumerate(table[spec.label_column])]
    for column in spec.text_columns:
        missing = next((i for i, text in enumerate(table[column]) if text is None), None)
        if missing is not None:
            raise DataError(f"{source}, line {missing + offset}: no {column!r} (a short row, or a null); every example "
                            "needs its text")
    texts = {c: [str(t) for t in table[c]] for c in spec.text_columns}
    return datasets.Dataset.from_dict({**texts, "label": labels})


def tokenize_texts(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, spec: TaskSpec, max_seq_length: int
) -> datasets.Dataset:
    """Tokenize the task's text column(s); keeps ``label`` as ``labels``, drops the text.

    Examples longer than ``max_seq_length`` tokens are truncated (pairs: the longer text first), and how many were is
    logged, so a too-small ``task.max_seq_length`` is seen rather than silently costing accuracy.

    Returns:
        A Dataset with ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for BERT) and ``labels``,
        unpadded (padding happens per batch in :func:`collator`).
    """

    def encode(batch: dict) -> dict:
        texts = [batch[c] for c in spec.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length)
        # Only rows that came out at the limit can have been cut: tokenize those again in full to tell.
        full = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) == max_seq_length]
        cut = set()
        if full:
            lengths = tokenizer(*[[t[i] for i in full] for t in texts], truncation=False)["input_ids"]
            cut = {i for i, ids in zip(full, lengths) if len(ids) > max_seq_length}
        encoded["truncated"] = [i in cut for i in range(len(encoded["input_ids"]))]
        return encoded

    drop = [c for c in dataset.column_names if c not in ("label", "teacher_logits")]
    encoded = dataset.map(encode, batched=True, remove_columns=drop, desc="tokenize")
    num_truncated = int(sum(encoded["truncated"])) if len(encoded) else 0
    if num_truncated:
        logger.warning("%d of %d examples are longer than max_seq_length = %d tokens and were truncated; raise "
                       "task.max_seq_length to keep more of them", num_truncated, len(encoded), max_seq_length)
    encoded = encoded.remove_columns("truncated")
    if "label" in encoded.column_names:
        encoded = encoded.rename_column("label", "labels")
    return encoded


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to the labels, in [0, 1] (scikit-learn's ``accuracy_score``)."""
    from sklearn import metrics  # here, not at the top: the command line starts without scikit-learn's second

    return float(metrics.accuracy_score(labels, predictions))


def f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC/QQP convention), in [0, 1]; 0 when there are no true positives
    (scikit-learn's ``f1_score``, binary average)."""
    from sklearn import metrics

    return float(metrics.f1_score(labels, predictions, pos_label=positive, average="binary", zero_division=0.0))


def matthews_corrcoef(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient (CoLA), in [-1, 1]; 0 when undefined (scikit-learn's ``matthews_corrcoef``)."""
    from sklearn import metrics

    return float(metrics.matthews_corrcoef(labels, predictions))


def correlation(function, predictions: np.ndarray, labels: np.ndarray) -> float:
    """Pearson or Spearman correlation (STS-B), in [-1, 1]; 0 when undefined (constant predictions or labels)."""
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(function(predictions, labels)[0])


def sequence_metrics(spec: TaskSpec, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Sequence classification and regression metrics (accuracy, F1, Matthews correlation; Pearson, Spearman).

    Args:
        outputs: (N, C) logits, or (N, 1) / (N,) predictions for regression.
        labels: (N,) gold class ids or scores.
    """
    if spec.is_regression:
        from scipy import stats  # here, not at the top: the command line starts without SciPy's half second

        predictions = outputs.reshape(-1)
        table = {
            "pearson": lambda: correlation(stats.pearsonr, predictions, labels),
            "spearmanr": lambda: correlation(stats.spearmanr, predictions, labels),
        }
    else:
        predictions = outputs.argmax(axis=-1)
        table = {
            "accuracy": lambda: accuracy(predictions, labels),
            "f1": lambda: f1(predictions, labels),
            "matthews_corrcoef": lambda: matthews_corrcoef(predictions, labels),
        }
    return {name: table[name]() for name in spec.metrics}


def chance(spec: TaskSpec, dev_labels=None) -> dict:
    """What a model that has learnt nothing scores on the task's primary metric (``spec.metrics[0]``): the best
    constant guess on this dev set.

    - accuracy: the majority-class rate of the dev labels (a collapsed MRPC teacher that always says "equivalent"
      scores 279 / 408 = 0.684 on the GLUE dev set, not 1/C = 0.5);
    - F1 (of the positive class): always "positive", 2p / (1 + p) for a positive rate p in the dev labels;
    - Matthews correlation, Pearson, Spearman: 0 (any constant guess is uncorrelated with the labels).

    Args:
        spec: the task.
        dev_labels: (N,) the main dev set's label ids; needed for accuracy and F1.

    Returns:
        {"metric": the primary metric, "value": chance on it, "basis": how it is reached, in words (e.g.
        "majority class 'equivalent'")}.

    Raises:
        ValueError: accuracy or F1 without dev labels (or with none in them): chance depends on their class balance.
    """
    metric = spec.metrics[0]
    if metric in ("matthews_corrcoef", "pearson", "spearmanr") or spec.is_regression:
        return {"metric": metric, "value": 0.0, "basis": "constant guess"}
    labels = None if dev_labels is None else np.asarray(dev_labels, dtype=np.int64)
    if labels is None or labels.size == 0:
        raise ValueError(f"chance on {metric} is the best constant guess on the dev set, so it needs the dev labels "
                         "(pass dev_labels)")
    counts = np.bincount(labels, minlength=spec.num_labels)
    if metric == "f1":
        positive = float(counts[1] / labels.size)
        return {"metric": metric, "value": 2 * positive / (1 + positive), "basis": "always the positive class"}
    majority = int(np.argmax(counts))
    name = spec.label_names[majority] if majority < len(spec.label_names) else str(majority)
    return {"metric": metric, "value": float(counts[majority] / labels.size), "basis": f"majority class {name!r}"}


class SequenceClassification(TaskType):
    """One label (or one score, for regression) per text or text pair: GLUE tasks and a user's CSV/TSV/JSONL."""

    name = "sequence_classification"
    metric_names = SEQUENCE_METRICS
    pipeline_tag = "text-classification"
    architecture = "ForSequenceClassification"
    description = "sequence classifier"

    def model_class(self, spec):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification

    def read_split(self, path, spec):
        return read_glue_tsv(path, spec)

    def user_spec(self, config):
        return sequence_user_spec(config)

    def sniff_labels(self, values):
        """One class or score a row: no list and no comma-separated set (multi-label's); numbers with a fraction
        are scores (regression), anything else classes."""
        if any(isinstance(v, (list, tuple)) or (isinstance(v, str) and "," in v) for v in values):
            return None
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        fractional = len(numbers) == len(values) and any(float(v) != int(v) for v in numbers)
        return {"task.regression": True} if fractional else {}

    def read_user_split(self, path, spec, split="train"):
        return read_user_table(path, spec, "train" if split == "train" else DEV_SPLITS)

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        return tokenize_texts(dataset, tokenizer, spec, max_seq_length)

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def compute_metrics(self, spec, outputs, labels, context=None):
        return sequence_metrics(spec, np.asarray(outputs), np.asarray(labels))

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        if spec.is_regression:  # one score: MSE to the teacher's (no temperature)
            return score_loss(student_logits, teacher_logits, batch.get("labels"), hard_label_weight)
        return prediction_loss(student_logits, teacher_logits, temperature, temperature_squared, batch.get("labels"),
                               hard_label_weight)

    def chance(self, spec, dev_labels=None):
        return chance(spec, dev_labels)

    def head_config(self, spec):
        # regression: one output and no sigmoid in pipeline(); else a softmax over the classes
        return {**super().head_config(spec),
                "problem_type": "regression" if spec.is_regression else "single_label_classification"}

    def uses_temperature(self, spec):
        return not spec.is_regression  # MSE to the teacher's score has no temperature

    def describe_labels(self, spec):
        return "a score (regression)" if spec.is_regression else super().describe_labels(spec)

    def recipe(self, spec, teacher_layers=None):
        pair = len(spec.text_columns) == 2 or spec.is_regression
        if deep(teacher_layers):
            return (("pair_12layer.yaml", "the recipe for pair and regression tasks from a 12-layer teacher") if pair
                    else ("sst2_12layer.yaml", "the recipe for single-text tasks from a 12-layer teacher"))
        if pair:
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


SEQUENCE_CLASSIFICATION = register_task_type(SequenceClassification())
for _spec in GLUE.values():
    register_task(_spec)
