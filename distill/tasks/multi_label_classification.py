"""Multi-label classification: any number of labels per text (emotions, topics, toxicity types, intents), a sigmoid per
label. GoEmotions (Demszky et al., 2020, "GoEmotions: A Dataset of Fine-Grained Emotions", ACL) as a named task and a
user's CSV/TSV/JSONL files; the teacher and the student are ``...ForSequenceClassification`` models with
``problem_type="multi_label_classification"``, so ``from_pretrained`` and ``pipeline("text-classification",
top_k=None)`` read them with no code of ours.

Shapes: N examples, B batch, C labels. A row's ``label`` is its list of label ids; tokenised, ``labels`` is its
multi-hot (C,) float vector.

- **Prediction loss**: binary cross-entropy of the student's sigmoid(z_S / T) against the teacher's sigmoid(z_T / T),
  per label, averaged over labels and examples (× T² with ``distill.temperature_squared``); the gold labels beside
  them at ``distill.hard_label_weight`` (binary cross-entropy to the multi-hot labels, the teacher's own fine-tuning
  loss). This is the sigmoid counterpart of TinyBERT's Eq. 10: each label a two-class softmax.
- **Metrics**: micro and macro F1 over labels at a decision threshold on the sigmoid, the threshold chosen on the dev
  set for each model alike (the one of :data:`THRESHOLDS` that gives the highest micro F1; ``threshold`` is reported
  beside the scores), and each label's F1 at that threshold in the report.
- **Chance**: the best constant guess on the dev set: no label for any text (F1 0), or the most frequent label sets
  (the same set for every text), whichever scores higher on the primary metric.
- **Your own files**: a text column (or two) and a label column holding label names or ids, separated by
  ``task.options.label_separator`` (default ","; a JSONL list needs none); ``task.label_names`` gives the labels in id
  order (default: the distinct names of the training file, sorted); ``task.options.allow_empty`` (default true) whether a
  text may have no label.
"""

from __future__ import annotations

import csv
import logging
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from transformers import DataCollatorWithPadding

from distill.tasks.base import (DataError, TaskSpec, TaskType, deep, markdown_table, register_task,
                                 register_task_type)
from distill.tasks.files import DEV_SPLITS, read_table, require_columns
from distill.tasks.sequence_classification import tokenize_texts

logger = logging.getLogger(__name__)

MULTI_LABEL_METRICS = ("micro_f1", "macro_f1", "threshold")  # micro F1 first: the primary metric
THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 20))  # 0.05, 0.10, ..., 0.95: where a label is predicted
# The config.json entry of a multi-label model's decision threshold, chosen on the dev set's tuning half: a label is
# predicted where its sigmoid is at least this (the card's usage code and ONNX export read it).
THRESHOLD_KEY = "decision_threshold"
LABEL_FILE = "labels.txt"  # the label names of a GoEmotions-layout folder, one a line, in id order
CANDIDATE_SETS = 20  # the most frequent dev label sets tried as a constant guess

# GoEmotions' 28 labels in id order (its emotions.txt): 27 emotions and neutral.
GOEMOTIONS_LABELS = (
    "admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion", "curiosity", "desire",
    "disappointment", "disapproval", "disgust", "embarrassment", "excitement", "fear", "gratitude", "grief", "joy",
    "love", "nervousness", "optimism", "pride", "realization", "relief", "remorse", "sadness", "surprise", "neutral")


def label_ids(value, spec: TaskSpec, where: str) -> list[int]:
    """One row's label list as sorted ids: a list (JSONL), or names or ids separated by the task's label separator.

    Raises:
        DataError: a label outside the label list, or no label where the task forbids it (naming ``where``).
    """
    separator = spec.options.get("label_separator", ",")
    if isinstance(value, (list, tuple)):
        items = [str(item).strip() for item in value]
    else:
        items = [] if value is None else [item.strip() for item in str(value).split(separator)]
    items = [item for item in items if item]
    names = {name.lower(): i for i, name in enumerate(spec.label_names)}
    ids = set()
    for item in items:
        if item.lower() in names:
            ids.add(names[item.lower()])
        elif item.lstrip("-").isdigit() and 0 <= int(item) < len(spec.label_names):
            ids.add(int(item))
        else:
            raise DataError(f"{where}: label {item!r} is not one of the {len(spec.label_names)} labels of {spec.name} "
                            f"(ids 0..{len(spec.label_names) - 1}: {', '.join(spec.label_names[:6])}, ...); fix it, or "
                            "set task.label_names to every label")
    if not ids and not spec.options.get("allow_empty", True):
        raise DataError(f"{where}: no label, and every text of {spec.name} has at least one; fix the line, or set "
                        "task.options.allow_empty: true")
    return sorted(ids)


def read_goemotions(path: str | Path, spec: TaskSpec) -> datasets.Dataset:
    """One split of GoEmotions' layout: a TSV file with no header, ``text<TAB>label ids<TAB>comment id`` a line (ids
    separated by commas), beside ``labels.txt`` (the label names, one a line, in id order), which must name the task's
    labels.

    Raises:
        DataError: a missing file, a line without three fields, a label id outside the labels, a ``labels.txt`` that
            does not match the task's labels (each names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; a GoEmotions folder holds {spec.train_file}, {spec.dev_file} and "
                        f"{LABEL_FILE}")
    check_label_file(path.parent / LABEL_FILE, spec)
    texts, labels = [], []
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row:
                continue
            if len(row) != 3:
                raise DataError(f"{path}, line {number}: expected 3 tab-separated fields (text, label ids, comment id), "
                                f"found {len(row)}; fix or remove that line")
            texts.append(row[0])
            labels.append(label_ids(row[1], spec, f"{path}, line {number}"))
    if not texts:
        raise DataError(f"{path} holds no example")
    return datasets.Dataset.from_dict({spec.text_columns[0]: texts, "label": labels})


def check_label_file(path: Path, spec: TaskSpec) -> None:
    """A folder's ``labels.txt``, when there is one, names the task's labels in its order.

    Raises:
        DataError: another number of labels, or another name at a line (naming the file and the line).
    """
    if not path.is_file():
        return
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != len(spec.label_names):
        raise DataError(f"{path}: {len(names)} labels, and {spec.name} has {len(spec.label_names)} "
                        f"({', '.join(spec.label_names[:4])}, ...); give the label file of this data set")
    for number, (found, expected) in enumerate(zip(names, spec.label_names), start=1):
        if found.lower() != expected.lower():
            raise DataError(f"{path}, line {number}: label {found!r} where {spec.name} has {expected!r} (label id "
                            f"{number - 1}); the ids of the data files would name other labels")


def read_labelled_table(source: str, spec: TaskSpec, split: str | tuple[str, ...] = "train") -> datasets.Dataset:
    """One split of a user's CSV/TSV/JSONL file: the text column(s) and ``label``, the row's label ids.

    Raises:
        DataError: no example, a missing column, a row without its text, a label outside the label list (the line).
    """
    table = read_table(source, split=split, text_columns=(*spec.text_columns, spec.label_column))
    require_columns(table, [*spec.text_columns, spec.label_column], source)
    if len(table) == 0:
        raise DataError(f"{source}: no example (a header line alone)")
    offset = 1 if Path(source).suffix in (".jsonl", ".json") else 2  # row i is line i + offset
    labels = [label_ids(value, spec, f"{source}, line {i + offset}") for i, value in
              enumerate(table[spec.label_column])]
    for column in spec.text_columns:
        missing = next((i for i, text in enumerate(table[column]) if text is None), None)
        if missing is not None:
            raise DataError(f"{source}, line {missing + offset}: no {column!r}; every example needs its text")
    return datasets.Dataset.from_dict({**{c: [str(t) for t in table[c]] for c in spec.text_columns}, "label": labels})


def user_spec(config) -> TaskSpec:
    """The spec of a user's multi-label files (``task.train_file``, ``dev_file``, ``text_columns``, ``label_column``,
    ``label_names``, ``metrics``, ``options``).

    Raises:
        DataError: no text column, no dev file, metrics this type does not score, fewer than two labels.
    """
    if not config.text_columns:
        raise DataError("task.text_columns: name the text column(s) of task.train_file, e.g. [text]")
    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    metrics = tuple(config.metrics or MULTI_LABEL_METRICS)
    if not set(metrics) <= set(MULTI_LABEL_METRICS) or metrics[0] == "threshold":
        raise DataError(f"task.metrics: multi-label classification scores {', '.join(MULTI_LABEL_METRICS)}, an F1 "
                        f"first; got {list(metrics)}")
    options = dict(getattr(config, "options", None) or {})
    probe = TaskSpec(config.name, tuple(config.text_columns), config.label_column, (), metrics, hub=None,
                     options=options, task_type=MultiLabelClassification.name)
    names = tuple(config.label_names or _label_names(config.train_file, probe))
    if len(names) < 2:
        raise DataError(f"{config.train_file}: {len(names)} distinct label(s) ({list(names)}); a multi-label task needs "
                        "two or more")
    return TaskSpec(config.name, tuple(config.text_columns), config.label_column, names, metrics, hub=None,
                    dev_file=config.dev_file, train_file=config.train_file, options=options,
                    task_type=MultiLabelClassification.name)


def _label_names(source: str, spec: TaskSpec) -> list[str]:
    """The distinct label names of a training file (split at the separator), sorted (numerically when all are ids)."""
    table = read_table(source, text_columns=(spec.label_column,))
    require_columns(table, [spec.label_column], source)
    separator = spec.options.get("label_separator", ",")
    counts: Counter = Counter()
    for value in table[spec.label_column]:
        items = value if isinstance(value, (list, tuple)) else ([] if value is None else str(value).split(separator))
        counts.update(str(item).strip() for item in items if str(item).strip())
    names = sorted(counts)
    if all(name.lstrip("-").isdigit() for name in names):
        names.sort(key=int)
    logger.info("task %s: labels %s (from %s; set task.label_names to fix their order)", spec.name, names, source)
    return names


def output_layer(model: torch.nn.Module, num_labels: int) -> torch.nn.Linear:
    """The classifier's output layer: the last linear layer with one output per label (BERT's ``classifier``,
    RoBERTa's ``classifier.out_proj``, DistilBERT's ``classifier``...).

    Raises:
        ValueError: the model has no linear layer with ``num_labels`` outputs and a bias.
    """
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == num_labels
              and m.bias is not None]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no linear output layer of {num_labels} labels with a bias")
    return layers[-1]


def multi_hot(ids_per_row, num_labels: int) -> np.ndarray:
    """(N, C) float32: 1 where a row has the label."""
    hot = np.zeros((len(ids_per_row), num_labels), dtype=np.float32)
    for row, ids in enumerate(ids_per_row):
        hot[row, list(ids)] = 1.0
    return hot


def f1_scores(predicted: np.ndarray, gold: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Micro F1, macro F1 and each label's F1 of (N, C) 0/1 predictions against (N, C) 0/1 gold labels; a label with
    neither a gold nor a predicted positive has F1 0 (scikit-learn's ``zero_division=0``)."""
    from sklearn.metrics import f1_score

    gold, predicted = gold.astype(int), predicted.astype(int)
    per_label = f1_score(gold, predicted, average=None, zero_division=0)
    return (float(f1_score(gold, predicted, average="micro", zero_division=0)),
            float(f1_score(gold, predicted, average="macro", zero_division=0)), per_label)


def multi_label_metrics(outputs: np.ndarray, labels, label_names: tuple[str, ...], threshold: float | None = None
                        ) -> dict[str, float]:
    """Micro and macro F1 at a decision threshold on the sigmoid, the threshold, each label's F1 there
    (``f1/<label>``), and micro and macro F1 at the fixed 0.5 (``at_0.5/micro_f1``, ``at_0.5/macro_f1``: what a user
    who keeps labels with ``score > 0.5`` gets).

    Args:
        outputs: (N, C) logits. labels: (N, C) multi-hot gold labels.
        label_names: C names.
        threshold: the threshold to score at (one chosen on other data: the dev set's tuning half); None: the one of
            :data:`THRESHOLDS` that gives these outputs the highest micro F1.
    """
    probabilities = 1 / (1 + np.exp(-np.asarray(outputs, dtype=np.float64)))
    gold = np.asarray(labels, dtype=np.float32)
    best = None
    for candidate in THRESHOLDS if threshold is None else (threshold,):
        scores = f1_scores(probabilities >= candidate, gold)
        if best is None or scores[0] > best[1][0]:
            best = (candidate, scores)
    threshold, (micro, macro, per_label) = best
    half_micro, half_macro, _ = f1_scores(probabilities > 0.5, gold)
    return {"micro_f1": micro, "macro_f1": macro, "threshold": threshold,
            **{f"f1/{name}": float(value) for name, value in zip(label_names, per_label)},
            "at_0.5/micro_f1": half_micro, "at_0.5/macro_f1": half_macro}


def constant_guess(spec: TaskSpec, dev_labels=None) -> dict:
    """Chance: the best constant guess on the dev labels on the primary metric: no label at all (F1 0), or one of the
    :data:`CANDIDATE_SETS` most frequent label sets for every text.

    Args:
        spec: the task. dev_labels: per dev text its label ids; None: 0 (no label).
    """
    metric = spec.metrics[0]
    best = {"metric": metric, "value": 0.0, "basis": "no label for any text"}
    rows = [tuple(sorted(ids)) for ids in (dev_labels or [])]
    if not rows:
        return best
    gold = multi_hot(rows, spec.num_labels)
    for label_set, _ in Counter(rows).most_common(CANDIDATE_SETS):
        if not label_set:
            continue
        micro, macro, _ = f1_scores(np.broadcast_to(multi_hot([label_set], spec.num_labels), gold.shape), gold)
        value = micro if metric == "micro_f1" else macro
        if value > best["value"]:
            names = ", ".join(spec.label_names[i] for i in label_set)
            best = {"metric": metric, "value": value, "basis": f"every text labelled {{{names}}}"}
    return best


def bce_soft_targets(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
                     ) -> torch.Tensor:
    """Binary cross-entropy of sigmoid(z_S / T) against sigmoid(z_T / T), averaged over the (B, C) labels; float32."""
    targets = torch.sigmoid(teacher_logits.float() / temperature)
    return F.binary_cross_entropy_with_logits(student_logits.float() / temperature, targets)


class MultiLabelClassification(TaskType):
    """Any number of labels per text, a sigmoid per label (see the module's docstring)."""

    name = "multi_label_classification"
    metric_names = MULTI_LABEL_METRICS
    pipeline_tag = "text-classification"
    architecture = "ForSequenceClassification"
    description = "multi-label classifier"

    def model_class(self, spec):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification

    def head_config(self, spec):
        return {**super().head_config(spec), "problem_type": "multi_label_classification"}

    def read_split(self, path, spec):
        return read_goemotions(path, spec)

    def user_spec(self, config):
        return user_spec(config)

    def read_user_split(self, path, spec, split="train"):
        return read_labelled_table(path, spec, "train" if split == "train" else DEV_SPLITS)

    def sniff_labels(self, values):
        """Several labels a row: a JSON list, or names joined by the default separator "," (``a,b``)."""
        sets = any(isinstance(v, (list, tuple)) or (isinstance(v, str) and "," in v) for v in values)
        return {} if sets else None

    def init_head(self, spec, model, train_data):
        """Each label's output bias starts at the log-odds of its frequency in ``train_data``, log(p / (1 - p)), so
        the new head predicts the label priors before its first step (Lin et al., 2017, "Focal Loss for Dense Object
        Detection", §3.3: "prior" initialisation for rare classes). With the bias drawn near 0 every label starts at
        probability 0.5, and the first updates go to learning how rare each label is: at GoEmotions' 28 labels the
        teacher's loss then stayed at the priors' (0.149 nats a label) for a whole epoch at 5e-5. p is clipped to
        [1e-4, 1 - 1e-4] so a label absent from the training set starts low, not at -inf."""
        prior = np.clip(multi_hot(train_data["label"], spec.num_labels).mean(axis=0), 1e-4, 1 - 1e-4)
        output = output_layer(model, spec.num_labels)
        with torch.no_grad():
            output.bias.copy_(torch.as_tensor(np.log(prior / (1 - prior)), dtype=output.bias.dtype))

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        encoded = tokenize_texts(dataset, tokenizer, spec, max_seq_length)
        if "labels" not in encoded.column_names:
            return encoded
        hot = multi_hot(encoded["labels"], spec.num_labels)
        return encoded.remove_columns("labels").add_column("labels", hot.tolist())

    def collator(self, tokenizer):
        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    def compute_metrics(self, spec, outputs, labels, context=None):
        return self.compute_metrics_with(spec, outputs, labels, context, {})

    def compute_metrics_with(self, spec, outputs, labels, context, settings):
        metrics = multi_label_metrics(np.asarray(outputs), np.asarray(labels), spec.label_names,
                                      settings.get(THRESHOLD_KEY))
        return {name: value for name, value in metrics.items()
                if name in spec.metrics or name.startswith(("f1/", "at_0.5/"))}

    def recipe(self, spec, teacher_layers=None):
        if deep(teacher_layers):
            return "sst2_12layer.yaml", "the recipe for single-text tasks from a 12-layer teacher"
        return None

    def tuned_settings(self, spec, metrics):
        return {THRESHOLD_KEY: metrics["threshold"]} if "threshold" in metrics else {}

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        loss = bce_soft_targets(student_logits, teacher_logits, temperature)
        if temperature_squared:
            loss = loss * temperature**2
        if hard_label_weight > 0:
            if batch.get("labels") is None:
                raise ValueError("hard_label_weight > 0 needs the batch's multi-hot labels")
            loss = loss + hard_label_weight * F.binary_cross_entropy_with_logits(student_logits.float(),
                                                                                 batch["labels"].float())
        return loss

    def chance(self, spec, dev_labels=None):
        return constant_guess(spec, dev_labels)

    def same_prediction(self, outputs, reference, spec, labels=None):
        """The same label set at the sigmoid's 0.5 (logit 0) for each example."""
        return np.all((np.asarray(outputs) > 0) == (np.asarray(reference) > 0), axis=-1)

    def describe_labels(self, spec):
        return f"any number of {', '.join(spec.label_names)}"

    def usage(self, model, spec=None):
        return (f'from transformers import AutoConfig, pipeline\n\n'
                f'# the decision threshold chosen on the dev set\'s tuning half, saved with the model (0.5 if none)\n'
                f'threshold = getattr(AutoConfig.from_pretrained("{model}"), "{THRESHOLD_KEY}", 0.5)\n'
                f'classify = pipeline("text-classification", model="{model}", top_k=None)  # every label, its sigmoid\n'
                'print([label for label in classify("Thank you so much, this made my day!")[0] '
                'if label["score"] >= threshold])')

    def unlabelled_rows(self, spec, texts):
        if len(spec.text_columns) != 1:
            raise ValueError(f"{spec.name} classifies text pairs; unlabelled text gives one sentence a row")
        return {spec.text_columns[0]: list(texts), "label": [[] for _ in texts]}

    def report_sections(self, spec, metrics):
        rows = [name for name in spec.label_names if all(f"f1/{name}" in m for m in metrics.values())]
        if not rows:
            return []
        models = list(metrics)
        thresholds = ", ".join(f"{model} {metrics[model].get('threshold', float('nan')):.2f}" for model in models)
        zero = [name for name in rows if all(metrics[m][f"f1/{name}"] == 0 for m in models)]
        lines = [f"Per-label F1 on dev, each model at its own threshold, chosen on dev for the best micro F1 "
                 f"({thresholds})"
                 + (f"; {len(zero)} of the {len(rows)} labels score F1 0 for every model ({', '.join(zero)}): the "
                    "macro F1 averages them in" if zero else "") + ":", ""]
        lines += markdown_table("label", models, [(name, [f"{metrics[m][f'f1/{name}']:.3f}" for m in models])
                                                  for name in rows])
        return ["\n".join(lines)]


GOEMOTIONS = TaskSpec("goemotions", ("text",), "labels", GOEMOTIONS_LABELS, MULTI_LABEL_METRICS,
                      ("go_emotions", "simplified"), train_file="train.tsv", dev_file="dev.tsv",
                      task_type=MultiLabelClassification.name, hub_label_column="labels",
                      options={"allow_empty": False})

MULTI_LABEL_CLASSIFICATION = register_task_type(MultiLabelClassification())
register_task(GOEMOTIONS)
