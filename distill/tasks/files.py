"""Reading a user's tables (CSV, TSV, JSONL, a saved dataset, a hub dataset) for any task type, with errors that name
the file and its line. Imports nothing of the project but the task interface."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets

from distill.tasks.base import DataError


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
