"""Task data for any task type: the task of a config (a named task, or a task of the user's own files), its splits
from a local folder, the bundled SST-2 sample, the hub through `datasets` or the user's files, tokenised and padded
as its type does (:mod:`distill.tasks`).

Every source yields a ``datasets.DatasetDict`` with splits ``train`` and ``dev`` and columns: the task's text
column(s) and ``label`` (what the type makes of it: a class id, a score, a tag list, an answer).
"""

from __future__ import annotations

import logging
import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path

import datasets
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from distill.tasks import get_task, get_task_type
from distill.tasks.base import DEFAULT_TYPE, DataError, TaskSpec

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def task_spec(config) -> TaskSpec:
    """The spec of the configured task: a named task (GLUE, ...; ``task.options`` set over its own options), or a
    user's task described by ``task.train_file``, ``text_columns``, ``label_column``, ``label_names`` /
    ``regression`` and ``metrics``.

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
        # task.options set over the named task's own (a sentence-embedding task's pooling, teacher_space)
        return replace(spec, options={**spec.options, **config.options}) if config.options else spec
    return get_task_type(config.task_type or DEFAULT_TYPE).user_spec(config)


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

    @property
    def public_location(self) -> str:
        """The location without this machine's paths, for what a run ships (card, report): a hub dataset's name, a
        folder's or file's own name ("MRPC", "train.csv, dev.csv")."""
        if self.kind == "hub":
            return self.location
        return ", ".join(Path(part.strip()).name or part.strip() for part in self.location.split(","))

    def public(self) -> dict:
        """The record as a dict with :attr:`public_location` for ``location`` and :meth:`describe` as "description"."""
        return {**dataclasses.asdict(self), "location": self.public_location, "description": self.describe()}

    def describe(self, public: bool = True) -> str:
        """One line, e.g. "bundled sample (sst2): 10000 train, first 32 of 872 dev examples"; ``public`` False: with
        the full location (a folder's path on this machine), for logs."""
        where = {"bundled": "bundled sample", "local": "local data folder", "hub": "the hub",
                 "files": "your files"}[self.kind]
        location = self.public_location if public else self.location
        return f"{where} ({location}): {', '.join(map(self.split_size, self.num_examples))} examples"


def load_task_data(config, spec: TaskSpec | None = None) -> datasets.DatasetDict:
    """Load the train and dev splits of the configured task (:func:`load_task_data_with_source` without the
    source)."""
    return load_task_data_with_source(config, spec)[0]


def data_source_kind(task, spec: TaskSpec) -> str:
    """Where ``task.source`` "auto" reads a named task from: "local" (a data folder), "bundled" or "hub"."""
    if task.source != "auto":
        return task.source
    return "local" if task.data_dir else "bundled" if (ASSETS / spec.name).is_dir() else "hub"


def load_task_data_with_source(config, spec: TaskSpec | None = None
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
    logger.info("task %s: %s", spec.name, found.describe(public=False))
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


def _load_user_files(config, spec: TaskSpec) -> datasets.DatasetDict:
    """A user's train and dev files, their label column mapped to ids (classification) or floats (regression)."""
    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    return datasets.DatasetDict({split: spec.type.read_user_split(source, spec, split) for split, source in
                                 (("train", config.train_file), ("dev", config.dev_file))})


def tokenize(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, spec: TaskSpec, max_seq_length: int
) -> datasets.Dataset:
    """Model inputs and ``labels`` of the task's examples, unpadded, as its task type makes them
    (:mod:`distill.tasks`: text pieces for sequence classification, word pieces with aligned labels for token
    classification, overlapping windows for question answering)."""
    return spec.type.tokenize(dataset, tokenizer, spec, max_seq_length)


def collator(tokenizer: PreTrainedTokenizerBase, spec: TaskSpec | None = None):
    """Pads a list of tokenized examples to the longest in the batch; returns a dict of tensors. With ``spec``, the
    task type's collator (token classification also pads per-token ``labels`` and ``teacher_logits``); without, the
    inputs alone (and per-example labels)."""
    if spec is not None:
        return spec.type.collator(tokenizer)
    return DataCollatorWithPadding(tokenizer, return_tensors="pt")
