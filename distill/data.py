"""Task data: GLUE-format TSV folders, the bundled SST-2 sample, or the hub through `datasets`.

Every source yields a ``datasets.DatasetDict`` with splits ``train`` and ``dev`` and columns: the task's text
column(s) and ``label`` (int class id, or float for regression).
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from distill.config import TaskConfig

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"


class DataError(ValueError):
    """Input data is malformed: the message names the file, the line and what to fix."""


@dataclass(frozen=True)
class TaskSpec:
    """What a task's data looks like and how it is scored."""

    name: str
    text_columns: tuple[str, ...]  # one column (single sentence) or two (pairs)
    label_column: str  # column of the label in the GLUE TSV files
    label_names: tuple[str, ...] = ()  # class names in id order; empty for regression
    metrics: tuple[str, ...] = ("accuracy",)
    hub: tuple[str, str] = ("glue", "")  # datasets.load_dataset(*hub)
    tsv_columns: dict = field(default_factory=dict)  # TSV header name -> our column name, where they differ
    dev_file: str = "dev.tsv"
    hub_dev_split: str = "validation"

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1


TASKS: dict[str, TaskSpec] = {
    "sst2": TaskSpec("sst2", ("sentence",), "label", ("negative", "positive"), ("accuracy",), ("glue", "sst2")),
    "mrpc": TaskSpec(
        "mrpc",
        ("sentence1", "sentence2"),
        "Quality",
        ("not_equivalent", "equivalent"),
        ("accuracy", "f1"),
        ("glue", "mrpc"),
        {"#1 String": "sentence1", "#2 String": "sentence2"},
    ),
    "stsb": TaskSpec(
        "stsb", ("sentence1", "sentence2"), "score", (), ("pearson", "spearmanr"), ("glue", "stsb")
    ),
}


def get_task(name: str) -> TaskSpec:
    """The :class:`TaskSpec` called ``name``; raises ValueError listing the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def read_glue_tsv(path: Path, spec: TaskSpec) -> datasets.Dataset:
    """Read one GLUE-format TSV file (header line, tab-separated, no quoting) into a Dataset.

    Raises:
        DataError: the file is empty, a needed column is missing (present ones listed), a line has the wrong number
            of fields (line number given), or a label is outside the task's label set.
    """
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise DataError(f"{path} is empty; a GLUE TSV file starts with a header line")
    header = [spec.tsv_columns.get(name, name) for name in rows[0]]
    needed = [*spec.text_columns, spec.label_column]
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; present: {rows[0]}")
    positions = {c: header.index(c) for c in needed}
    columns: dict[str, list] = {c: [] for c in (*spec.text_columns, "label")}
    for line_number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataError(
                f"{path}, line {line_number}: expected {len(header)} tab-separated fields, found {len(row)}; "
                "fix or remove that line (a stray tab or newline inside a text field is the usual cause)"
            )
        for c in spec.text_columns:
            columns[c].append(row[positions[c]])
        columns["label"].append(_parse_label(row[positions[spec.label_column]], spec, path, line_number))
    return datasets.Dataset.from_dict(columns)


def _parse_label(value: str, spec: TaskSpec, path: Path, line_number: int) -> int | float:
    try:
        if spec.is_regression:
            return float(value)
        label = int(value)
    except ValueError:
        label = -1
    if not 0 <= label < spec.num_labels:
        raise DataError(
            f"{path}, line {line_number}: label {value!r} is not one of the {spec.name} labels "
            f"0..{spec.num_labels - 1} ({', '.join(spec.label_names)})"
        )
    return label


def load_task_data(config: TaskConfig) -> datasets.DatasetDict:
    """Load train and dev splits for ``config.name`` from the configured source.

    Sources: ``local`` (``config.data_dir`` with ``train.tsv`` and the task's dev file), ``bundled`` (the SST-2
    sample shipped in ``distill/assets``), ``hub`` (``datasets.load_dataset``), ``auto`` (local if a data_dir is
    given, else bundled if there is one, else hub).

    Raises:
        DataError: malformed files (see :func:`read_glue_tsv`) or a missing data folder.
    """
    spec = get_task(config.name)
    source = config.source
    if source == "auto":
        source = "local" if config.data_dir else ("bundled" if (ASSETS / spec.name).is_dir() else "hub")
    if source == "hub":
        data = _load_hub(spec)
    else:
        folder = Path(config.data_dir) if source == "local" else ASSETS / spec.name
        if source == "local" and not config.data_dir:
            raise DataError("task.source is 'local' but task.data_dir is not set; pass --data-dir")
        if not folder.is_dir():
            raise DataError(f"data folder {folder} does not exist; give a GLUE-format folder with train.tsv and dev.tsv")
        data = datasets.DatasetDict(
            train=read_glue_tsv(folder / "train.tsv", spec), dev=read_glue_tsv(folder / spec.dev_file, spec)
        )
    if config.max_train_examples:
        data["train"] = data["train"].select(range(min(config.max_train_examples, len(data["train"]))))
    if config.max_eval_examples:
        data["dev"] = data["dev"].select(range(min(config.max_eval_examples, len(data["dev"]))))
    logger.info("task %s (%s): %d train, %d dev examples", spec.name, source, len(data["train"]), len(data["dev"]))
    return data


def _load_hub(spec: TaskSpec) -> datasets.DatasetDict:
    raw = datasets.load_dataset(*spec.hub)
    keep = [*spec.text_columns, "label"]
    return datasets.DatasetDict(
        train=raw["train"].select_columns(keep), dev=raw[spec.hub_dev_split].select_columns(keep)
    )


# A UTF-8 byte-order mark (as in GLUE's MRPC files) is not part of the first column's name.
TABLE_FORMATS = {".csv": ("csv", {"encoding": "utf-8-sig"}),
                 ".tsv": ("csv", {"delimiter": "\t", "quoting": csv.QUOTE_NONE, "encoding": "utf-8-sig"}),
                 ".jsonl": ("json", {}), ".json": ("json", {})}


def read_table(source: str, split: str = "train") -> datasets.Dataset:
    """Rows of a user's data set, columns as named in the source.

    Args:
        source: a ``.csv`` file (standard quoting), a ``.tsv`` file (tab-separated, no quoting, as GLUE), a
            ``.jsonl``/``.json`` file (one object a line, or an array), a folder written by ``Dataset.save_to_disk``,
            or a hub dataset ``name`` or ``name:config`` (``glue:sst2``) loaded with ``datasets.load_dataset``.
        split: the split of a saved ``DatasetDict`` or hub dataset.

    Raises:
        DataError: the file is empty, not UTF-8, or malformed (the line is named), or the split does not exist.
    """
    path = Path(source)
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except FileNotFoundError as error:
            raise DataError(f"{path} is a folder but not a saved dataset (no dataset_info.json / state.json); give a "
                            ".csv/.tsv/.jsonl file, a folder written by save_to_disk, or a GLUE folder with --task") from error
        return _pick_split(loaded, split, source)
    name, _, config = source.partition(":")
    return _pick_split(datasets.load_dataset(name, config or None), split, source)


def _pick_split(loaded, split: str, source: str) -> datasets.Dataset:
    if isinstance(loaded, datasets.Dataset):
        return loaded
    if split not in loaded:
        raise DataError(f"{source} has no split {split!r}; splits: {', '.join(loaded)}")
    return loaded[split]


def _read_file(path: Path) -> datasets.Dataset:
    if path.suffix not in TABLE_FORMATS:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(TABLE_FORMATS)}")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; it needs a header line (CSV/TSV) or one JSON object a line")
    builder, options = TABLE_FORMATS[path.suffix]
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    except Exception as error:  # the loaders wrap parser errors of several kinds
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
    """Tokenize the task's text column(s); keeps ``label`` as ``labels``, drops the text.

    Returns:
        A Dataset with ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for BERT) and ``labels``,
        unpadded (padding happens per batch in :func:`collator`).
    """

    def encode(batch: dict) -> dict:
        texts = [batch[c] for c in spec.text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_seq_length)

    drop = [c for c in dataset.column_names if c not in ("label", "teacher_logits")]
    encoded = dataset.map(encode, batched=True, remove_columns=drop, desc="tokenize")
    if "label" in encoded.column_names:
        encoded = encoded.rename_column("label", "labels")
    return encoded


def collator(tokenizer: PreTrainedTokenizerBase) -> DataCollatorWithPadding:
    """Pads a list of tokenized examples to the longest in the batch; returns a dict of tensors."""
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")
