"""A task of the user's own files from the files alone: ``pipeline --train-file F --dev-file G`` with no config.

What the files say decides, where it is unambiguous: a file in a task type's own layout (CoNLL word-and-tag lines,
SQuAD JSON) is that type's (:meth:`distill.tasks.TaskType.sniff_file`); a table (CSV, TSV, JSONL) names its label
column (``--label-column``, else a column called ``label`` or ``labels``) and its text column(s) (``--text-columns``,
else the one or two other columns of text), and its label values choose among the types that read tables
(:meth:`distill.tasks.TaskType.sniff_labels`: several labels a row for multi-label classification, numbers with a
fraction for regression, else classes). What cannot be told is one :class:`~distill.tasks.base.DataError` naming the
file and the flag or setting that settles it.
"""

from __future__ import annotations

from pathlib import Path

from distill.tasks.base import TASK_TYPES, DataError
from distill.tasks.files import read_table

LABEL_COLUMNS = ("label", "labels")  # a table's label column when none is named


def task_name(train_file: str) -> str:
    """A name for the user's task: the training file's folder, or its stem when the folder says nothing
    (``data/reviews/train.csv`` -> ``reviews``; ``reviews_train.csv`` in the working folder -> ``reviews_train``)."""
    path = Path(train_file)
    folder = path.resolve().parent.name
    return folder if folder and folder not in ("data", ".", "") else path.stem


def infer_task(train_file: str, text_columns: list[str] | None = None, label_column: str | None = None) -> dict:
    """The ``task.*`` settings of a user's files, read from the training file.

    Args:
        train_file: the training file (the dev file must share its layout).
        text_columns: the text column(s) when given (``--text-columns``).
        label_column: the label column when given (``--label-column``).

    Returns:
        Dotted overrides: ``task.task_type`` and, for a table, ``task.text_columns``, ``task.label_column`` and
        what the type's :meth:`~distill.tasks.TaskType.sniff_labels` adds (``task.regression``).

    Raises:
        DataError: the file is missing or unreadable, two layouts claim it, no label or text column can be told, or
            no type reads its labels; each names the file and what to give.
    """
    path = Path(train_file)
    if not path.exists():
        raise DataError(f"--train-file {train_file} does not exist")
    claims = {name: found for name, kind in TASK_TYPES.items() if (found := kind.sniff_file(path)) is not None}
    if len(claims) > 1:
        raise DataError(f"{train_file} reads as {' and as '.join(claims)}: name the type with "
                        f"--set task.task_type={next(iter(claims))}")
    if claims:
        name, found = next(iter(claims.items()))
        return {"task.task_type": name, **found}
    table = read_table(train_file, text_columns=tuple(text_columns or ()))
    columns = table.column_names
    if label_column is None:
        label_column = next((c for c in LABEL_COLUMNS if c in columns), None)
        if label_column is None:
            raise DataError(f"{train_file}: no column is called {' or '.join(LABEL_COLUMNS)}; name the label column "
                            f"with --label-column (columns: {', '.join(columns)})")
    elif label_column not in columns:
        raise DataError(f"{train_file}: no column {label_column!r} (--label-column); columns: {', '.join(columns)}")
    if not text_columns:
        text_columns = [c for c in columns if c != label_column and table.features[c].dtype in ("string", "large_string")
                        and c.lower() not in ("id", "idx", "guid", "index")]
        if not 1 <= len(text_columns) <= 2:
            raise DataError(f"{train_file}: {len(text_columns)} columns of text besides the label "
                            f"({', '.join(text_columns) or 'none'}); name the one or two the model reads with "
                            "--text-columns A [B]")
    values = table[label_column]
    claims = {name: found for name, kind in TASK_TYPES.items() if (found := kind.sniff_labels(values)) is not None}
    if not claims:
        raise DataError(f"{train_file}: no task type reads the labels of column {label_column!r} (e.g. "
                        f"{values[0]!r}); name the type with --set task.task_type=...")
    if len(claims) > 1:
        raise DataError(f"{train_file}: the labels of column {label_column!r} read as {' and as '.join(claims)}; "
                        f"name the type with --set task.task_type={next(iter(claims))}")
    name = next(iter(claims))
    return {"task.task_type": name, "task.text_columns": list(text_columns), "task.label_column": label_column,
            **claims[name]}
