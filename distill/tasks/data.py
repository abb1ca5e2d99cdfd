"""Task data: GLUE-format TSV folders, the bundled SST-2 sample, or the hub through `datasets`.

Every source yields a ``datasets.DatasetDict`` with splits ``train`` and ``dev`` and columns: the task's text
column(s) and ``label`` (int class id, or float for regression).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from distill.config import TaskConfig

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[1] / "assets"


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
    task_type: str = "sequence_classification"  # a name of distill.tasks.TASK_TYPES: how the task reads, trains, scores
    hub_label_column: str = "label"  # the label column of the hub's copy (GLUE: label; NER data sets: ner_tags)

    @property
    def type(self):
        """The task's :class:`distill.tasks.TaskType`, which the rest of the code asks what the task is."""
        from distill.tasks import get_task_type

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


def _glue(name, text_columns, label_column, label_names, metrics=("accuracy",), **kwargs) -> TaskSpec:
    return TaskSpec(name, tuple(text_columns), label_column, tuple(label_names), tuple(metrics), ("glue", name),
                    **kwargs)


# The GLUE tasks (Wang et al., 2018) with the hub's label order and GLUE's metrics. TSV layouts are those of the GLUE
# download script (CoLA has no header line; MNLI has two dev sets).
TASKS: dict[str, TaskSpec] = {
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

GLUE_TASKS = tuple(TASKS)
SEQUENCE_METRICS = ("accuracy", "f1", "matthews_corrcoef", "pearson", "spearmanr")  # the GLUE tasks' names (TASKS also holds other named tasks)

# Token classification (NER) with the hub's data set names and tag order; local copies are CoNLL files (a word and
# its tag a line, a blank line between sentences). Entity F1 (seqeval, strict IOB2) first: a model that tags every
# word O has a word accuracy of about 0.9 and finds nothing.
from distill.tasks.token_classification import NER_METRICS  # noqa: E402  (after TASKS: no import cycle)
TASKS.update({
    "wnut_17": TaskSpec("wnut_17", ("tokens",), "ner_tags", (
        "O", "B-corporation", "I-corporation", "B-creative-work", "I-creative-work", "B-group", "I-group",
        "B-location", "I-location", "B-person", "I-person", "B-product", "I-product"), NER_METRICS, ("wnut_17",),
        train_file="train.conll", dev_file="dev.conll", task_type="token_classification",
        hub_label_column="ner_tags"),
    "conll2003": TaskSpec("conll2003", ("tokens",), "ner_tags", (
        "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"), NER_METRICS, ("conll2003",),
        train_file="train.conll", dev_file="dev.conll", task_type="token_classification",
        hub_label_column="ner_tags"),
})

# Extractive question answering: SQuAD v1.1 (Rajpurkar et al., 2016) as the hub's ``squad`` or its official JSON
# files. The QA head has two outputs, start and end (its ``label_names``); F1 first, the leaderboard's ranking metric.
from distill.tasks.question_answering import QA_METRICS  # noqa: E402
TASKS["squad"] = TaskSpec("squad", ("question", "context"), "answers", ("start", "end"), QA_METRICS, ("squad",),
                          train_file="train.json", dev_file="dev.json", task_type="question_answering",
                          hub_label_column="answers")


def get_task(name: str) -> TaskSpec:
    """The GLUE :class:`TaskSpec` called ``name``; raises ValueError listing the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}, or a task of your own "
                         "files (task.train_file, task.text_columns, task.label_column)")
    return TASKS[name]


def task_spec(config: TaskConfig) -> TaskSpec:
    """The spec of the configured task: a GLUE task by name, or a user's task described by ``task.train_file``,
    ``text_columns``, ``label_column``, ``label_names`` / ``regression`` and ``metrics``.

    A user's classification task without ``label_names`` takes the distinct labels of its training file, sorted
    (numerically when they are all integers).

    Raises:
        DataError: an unknown task name without ``train_file``, or a user's file without the named columns.
    """
    if config.train_file is None:
        try:
            spec = get_task(config.name)
        except ValueError as error:
            raise DataError(str(error)) from None
        if config.task_type not in (None, spec.task_type):
            raise DataError(f"task.task_type: {config.name} is a {spec.task_type} task, not {config.task_type}; "
                            "leave task_type unset for a named task")
        return spec
    from distill.tasks import get_task_type

    return get_task_type(config.task_type or "sequence_classification").user_spec(config)


def sequence_user_spec(config: TaskConfig) -> TaskSpec:
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


def _label_values(config: TaskConfig) -> list[str]:
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


@dataclass(frozen=True)
class DataSource:
    """Where a run's task data came from and how much of it the run uses (for the report and the model card).

    Attributes:
        kind: "bundled" (the sample shipped in ``distill/assets``), "local" (a GLUE-format folder), "hub"
            (``datasets.load_dataset``) or "files" (a user's own train and dev files).
        location: the folder, the files ("train, dev"), or the hub dataset ("glue/sst2").
        num_examples: {split: examples the run uses}.
        num_available: {split: examples in the source, before ``task.max_train_examples`` / ``max_eval_examples``}.
    """

    kind: str
    location: str
    num_examples: dict[str, int]
    num_available: dict[str, int]

    def split_size(self, split: str) -> str:
        """"872 dev" when the whole split is used, "first 32 of 872 dev" for a subset."""
        used, available = self.num_examples[split], self.num_available[split]
        return f"{used} {split}" if used == available else f"first {used} of {available} {split}"

    def describe(self) -> str:
        """One line, e.g. "bundled sample (.../assets/sst2): 10000 train, first 32 of 872 dev examples"."""
        where = {"bundled": "bundled sample", "local": "local data folder", "hub": "the hub",
                 "files": "your files"}[self.kind]
        return f"{where} ({self.location}): {', '.join(map(self.split_size, self.num_examples))} examples"


def load_task_data(config: TaskConfig, spec: TaskSpec | None = None) -> datasets.DatasetDict:
    """Load the train and dev splits of the configured task (:func:`load_task_data_with_source` without the
    source)."""
    return load_task_data_with_source(config, spec)[0]


def load_task_data_with_source(config: TaskConfig, spec: TaskSpec | None = None
                               ) -> tuple[datasets.DatasetDict, DataSource]:
    """Load the train and dev splits of the configured task, and say where they came from.

    Sources: ``local`` (``config.data_dir``, a GLUE-format folder), ``bundled`` (the SST-2 sample shipped in
    ``distill/assets``), ``hub`` (``datasets.load_dataset``), ``auto`` (local if a data_dir is given, else bundled
    if there is one, else hub); a user's task (``config.train_file``) reads its CSV/TSV/JSONL files.

    Returns:
        A DatasetDict with ``train``, ``dev`` and, for tasks with more dev sets, ``dev_<suffix>`` (MNLI:
        ``dev_mismatched``); columns: the task's text columns and ``label`` (class id, or float score). And its
        :class:`DataSource`.

    Raises:
        DataError: malformed files (see :func:`read_glue_tsv`), a missing data folder or file.
    """
    spec = spec or task_spec(config)
    source = config.source
    if spec.hub is None:
        data, source = _load_user_files(config, spec), "files"
        location = f"{config.train_file}, {config.dev_file}"
    else:
        if source == "auto":
            source = "local" if config.data_dir else ("bundled" if (ASSETS / spec.name).is_dir() else "hub")
        if source == "hub":
            data, location = _load_hub(spec), "/".join(spec.hub)
        else:
            if source == "local" and not config.data_dir:
                raise DataError("task.source is 'local' but task.data_dir is not set; pass --data-dir")
            folder = Path(config.data_dir) if source == "local" else ASSETS / spec.name
            if not folder.is_dir():
                raise DataError(f"data folder {folder} does not exist; give a folder with {spec.train_file} and "
                                f"{spec.dev_file}")
            files = {"train": spec.train_file, "dev": spec.dev_file,
                     **{f"dev_{suffix}": file for suffix, file, _ in spec.extra_dev}}
            data = datasets.DatasetDict({split: spec.type.read_split(folder / file, spec)
                                         for split, file in files.items()})
            location = str(folder)
    available = {split: len(rows) for split, rows in data.items()}
    if config.max_train_examples:
        data["train"] = data["train"].select(range(min(config.max_train_examples, len(data["train"]))))
    if config.max_eval_examples:
        for split in spec.dev_splits:
            data[split] = data[split].select(range(min(config.max_eval_examples, len(data[split]))))
    found = DataSource(source, location, {split: len(rows) for split, rows in data.items()}, available)
    logger.info("task %s: %s", spec.name, found.describe())
    return data, found


def _load_hub(spec: TaskSpec) -> datasets.DatasetDict:
    """The task's splits from the hub (``datasets.load_dataset``); an unreachable hub is a :class:`DataError` at once
    (:mod:`distill.hub`), not after the loader's half a minute of retries."""
    from distill.hub import hub_unreachable, offline_mode

    local = f"no local data (--data-dir DIR with {spec.train_file} and {spec.dev_file})"
    if not offline_mode() and (reason := hub_unreachable()) is not None:
        raise DataError(f"task {spec.name}: {local} and the hub is unreachable ({reason}); pass --data-dir, or set "
                        "HF_HUB_OFFLINE=1 to use a copy in the datasets cache")
    try:
        raw = datasets.load_dataset(*spec.hub)
    except ConnectionError as error:  # offline with nothing cached, or the hub went away
        why = "HF_HUB_OFFLINE is set and the datasets cache holds no copy" if offline_mode() else "the hub gave none"
        raise DataError(f"task {spec.name}: {local}, and {why} ({error}); pass --data-dir") from None
    except (RuntimeError, ValueError, FileNotFoundError) as error:  # e.g. a script data set newer datasets refuse
        raise DataError(f"task {spec.name}: {local}, and datasets could not load {'/'.join(spec.hub)} from the hub "
                        f"({' '.join(str(error).split())[:200]}); download its files and pass --data-dir") from None
    label = spec.hub_label_column
    splits = {"train": "train", "dev": spec.hub_dev_split,
              **{f"dev_{suffix}": split for suffix, _, split in spec.extra_dev}}
    loaded = {ours: raw[theirs].select_columns([*spec.text_columns, label]) for ours, theirs in splits.items()}
    return datasets.DatasetDict({name: split.rename_column(label, "label") if label != "label" else split
                                 for name, split in loaded.items()})


def _load_user_files(config: TaskConfig, spec: TaskSpec) -> datasets.DatasetDict:
    """A user's train and dev files, their label column mapped to ids (classification) or floats (regression)."""
    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    return datasets.DatasetDict({split: spec.type.read_user_split(source, spec, split) for split, source in
                                 (("train", config.train_file), ("dev", config.dev_file))})


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


# A UTF-8 byte-order mark (as in GLUE's MRPC files) is not part of the first column's name.
TABLE_FORMATS = {".csv": ("csv", {"encoding": "utf-8-sig"}),
                 ".tsv": ("csv", {"delimiter": "\t", "quoting": csv.QUOTE_NONE, "encoding": "utf-8-sig"}),
                 ".jsonl": ("json", {}), ".json": ("json", {})}


# The split a dev file names in a saved DatasetDict or a hub dataset: the first of these it has.
DEV_SPLITS = ("validation", "dev")


def read_table(source: str, split: str | tuple[str, ...] = "train",
               text_columns: list[str] | tuple[str, ...] = ()) -> datasets.Dataset:
    """Rows of a user's data set, columns as named in the source.

    CSV/TSV fields are never read as missing values ("", "NA" stay text), and ``text_columns`` are read as text as
    written (a review "0" stays "0", not the number 0.0); other columns keep the loader's type inference.

    Args:
        source: a ``.csv`` file (standard quoting), a ``.tsv`` file (tab-separated, no quoting, as GLUE), a
            ``.jsonl``/``.json`` file (one object a line, or an array), a folder written by ``Dataset.save_to_disk``,
            or a hub dataset ``name`` or ``name:config`` (``glue:sst2``) loaded with ``datasets.load_dataset``.
        split: the split of a saved ``DatasetDict`` or hub dataset (a tuple: the first of them it has).
        text_columns: columns of a CSV/TSV file to read as strings.

    Raises:
        DataError: the file is empty, not UTF-8, or malformed (the line is named), or the split does not exist.
    """
    path = Path(source)
    if path.is_file():
        return _read_file(path, text_columns)
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except FileNotFoundError as error:
            raise DataError(f"{path} is a folder but not a saved dataset (no dataset_info.json / state.json); give a "
                            ".csv/.tsv/.jsonl file, a folder written by save_to_disk, or a GLUE folder with --task") from error
        return _pick_split(loaded, split, source)
    name, _, config = source.partition(":")
    return _pick_split(datasets.load_dataset(name, config or None), split, source)


def _pick_split(loaded, split: str | tuple[str, ...], source: str) -> datasets.Dataset:
    if isinstance(loaded, datasets.Dataset):
        return loaded
    wanted = (split,) if isinstance(split, str) else split
    found = next((name for name in wanted if name in loaded), None)
    if found is None:
        raise DataError(f"{source} has no split {' or '.join(repr(name) for name in wanted)}; splits: "
                        f"{', '.join(loaded)}")
    return loaded[found]


def _read_file(path: Path, text_columns: list[str] | tuple[str, ...] = ()) -> datasets.Dataset:
    if path.suffix not in TABLE_FORMATS:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(TABLE_FORMATS)}")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; it needs a header line (CSV/TSV) or one JSON object a line")
    builder, options = TABLE_FORMATS[path.suffix]
    if builder == "csv":
        options = {**options, "na_filter": False, "converters": {c: str for c in text_columns} or None}
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    except Exception as error:  # the loaders wrap parser errors of several kinds
        if builder == "csv" and len(path.read_bytes().strip().splitlines()) == 1:
            raise DataError(f"{path}: no example (a header line alone)") from None
        raise DataError(f"{path}: cannot read it as {path.suffix[1:].upper()}: {_diagnose(path, error)}") from None


def _diagnose(path: Path, error: BaseException) -> str:
    """The most useful account of a read error: the first undecodable or unparsable line (1-based), else the
    innermost error message."""
    with path.open("rb") as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                return f"line {line_number} is not valid UTF-8; re-save the file as UTF-8"
            if path.suffix == ".jsonl" and line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as bad:
                    return f"line {line_number} is not a JSON object ({bad.msg})"
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return str(error)


def require_columns(dataset: datasets.Dataset, columns: list[str] | tuple[str, ...], source: str) -> None:
    """Raise :class:`DataError` naming the missing columns and listing the present ones."""
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; present: {dataset.column_names}")


def tokenize(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, spec: TaskSpec, max_seq_length: int
) -> datasets.Dataset:
    """Model inputs and ``labels`` of the task's examples, unpadded, as its task type makes them
    (:mod:`distill.tasks`: :func:`tokenize_texts` for sequence classification, word pieces with aligned labels for
    token classification)."""
    return spec.type.tokenize(dataset, tokenizer, spec, max_seq_length)


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


def collator(tokenizer: PreTrainedTokenizerBase, spec: TaskSpec | None = None):
    """Pads a list of tokenized examples to the longest in the batch; returns a dict of tensors. With ``spec``, the
    task type's collator (token classification also pads per-token ``labels`` and ``teacher_logits``); without, the
    inputs alone (and per-example labels)."""
    if spec is not None:
        return spec.type.collator(tokenizer)
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")
