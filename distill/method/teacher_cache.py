"""The teacher-output cache of the intermediate step: what the loss terms read from the teacher, computed once per
training set and read back in the step's own batches.

The intermediate step (TinyBERT §3.4, Eq. 7-9) runs the frozen teacher, dropout off, over the same examples every
epoch: the same numbers, paid again each time. With a 12-layer teacher and the 4-layer/312 student most of a step is
the teacher's forward pass. With ``distill.teacher_cache`` set to a storage dtype, the pipeline runs the teacher over
the training set once (a stage of its own, ``teacher_outputs/``) and every epoch reads its outputs from disk instead.

What is stored, per training example and unpadded (its ``T_i`` real tokens), are the buffers the step's loss terms
declare (:attr:`distill.method.terms.LossTerm.teacher_reads`): hidden states ``(T_i, H)`` of the embedding output and of
the mapped layers, pre-softmax attention scores ``(A, T_i, T_i)`` of the mapped layers, and the query, key and value
projections ``(T_i, H)`` each of the layer the relation term reads; in the chosen dtype. The head's logits come out
of the same forward pass: when the build is given the task type's logit reader, each shard keeps them too, in float32
(``(C,)`` per example, ``(T_i, C)`` per token), and the prediction step's teacher-logit stage takes them from there
(:func:`cached_logits`) instead of running the teacher over the training set a second time.

Layout on disk: ``shards/run.json`` (run id, layout, dtype, the shard plan: written first, so a stopped build is
recognised and resumed), ``shards/shard-NNNNN.bin`` (the shard's examples one after the other, each its buffers in
layout order, flattened, raw values of the storage dtype) and ``shards/shard-NNNNN.npy`` (int64 offsets into it, in
values, one per example plus the end), and with logits ``shards/shard-NNNNN.logits.npz`` (``values``: the shard's logits
in example order, ``(n, C)`` or per token ``(sum T_i, C)``; ``lengths``: each example's T_i, per token only). A shard is
written to a temporary name and renamed, its offsets ``.npy`` last, so a shard is complete exactly when its ``.npy``
exists: a build stopped at any point resumes at its first missing shard. Shards are cut at about :data:`SHARD_BYTES`, so
the build holds one shard in memory, never the whole cache.

Exactness. ``float32`` stores the values the teacher computes for the example: the cached step's losses equal the
uncached step's to float rounding (the teacher runs each example padded with other examples than in the step's
batch, and the kernels round the real positions' values of a differently padded batch differently, about 1e-7
relative). ``float16`` and ``bfloat16`` round each value to 11 and 8 significant bits (half the space): the losses
move by the tolerances measured in ``tests/test_teacher_cache.py``. Padding side: the tokenizer's, as the batches.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from distill.method.capture import ModelOutputs, run_model
from distill.method.checkpoint import (folder_run_ids, mark_stage_done, mark_stage_started, stage_done, write_atomic,
                               write_json_atomic)
from distill.config import ConfigError

logger = logging.getLogger(__name__)

# Storage dtypes by their config name (``distill.teacher_cache``).
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# numpy's type for the raw values of each storage dtype (numpy has no bfloat16: its 16 bits are kept as int16).
_RAW = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}
_RAW_TORCH = {torch.float32: torch.float32, torch.float16: torch.float16, torch.bfloat16: torch.int16}
# Column added to the training set: the example's position in the cache.
INDEX_COLUMN = "teacher_cache_index"
# Batch entries holding cached teacher buffers: ``teacher.<kind>.<layer>`` (``teacher.qkv.<layer>.<0|1|2>``).
BATCH_PREFIX = "teacher."
SHARD_BYTES = 256 * 2**20  # a shard's size on disk (and the build's memory for it)
FREE_MARGIN = 0.05  # the build refuses to fill more than 95% of the free disk space
KINDS = ("hidden_states", "attentions", "qkv")


@dataclass(frozen=True)
class CacheLayout:
    """Which teacher buffers a cache holds, in the order each example stores them, and their sizes.

    Attributes:
        reads: (kind, layer) pairs, sorted: kind "hidden_states" (layer 0 the embedding output), "attentions" or
            "qkv" (layers 1-based, as the layer map).
        hidden_size: the teacher's H.
        num_heads: the teacher's A.
    """

    reads: tuple[tuple[str, int], ...]
    hidden_size: int
    num_heads: int

    @classmethod
    def of(cls, reads, teacher_config) -> "CacheLayout":
        """The layout for a step's teacher reads (a Counter or list of (kind, layer)).

        Raises:
            ValueError: a read the cache does not hold (the logits: the prediction step caches those).
        """
        unique = tuple(sorted({(str(kind), int(layer)) for kind, layer in reads}))
        other = [read for read in unique if read[0] not in KINDS]
        if other:
            raise ValueError(f"the teacher-output cache holds {', '.join(KINDS)}, not {other}")
        return cls(unique, teacher_config.hidden_size, teacher_config.num_attention_heads)

    def shapes(self, length: int) -> list[tuple[int, ...]]:
        """Each stored buffer's shape for an example of ``length`` tokens, in storage order (qkv: three buffers)."""
        shapes = []
        for kind, _ in self.reads:
            if kind == "attentions":
                shapes.append((self.num_heads, length, length))
            else:
                shapes.extend([(length, self.hidden_size)] * (3 if kind == "qkv" else 1))
        return shapes

    def values(self, length: int) -> int:
        """Stored values for an example of ``length`` tokens."""
        return sum(int(np.prod(shape)) for shape in self.shapes(length))

    def to_json(self) -> dict:
        return {"reads": [list(read) for read in self.reads], "hidden_size": self.hidden_size,
                "num_heads": self.num_heads}


def storage_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``distill.teacher_cache`` setting.

    Raises:
        ConfigError: not one of float32, float16, bfloat16.
    """
    if name not in STORAGE_DTYPES:
        raise ConfigError(f"distill.teacher_cache: must be one of {', '.join(STORAGE_DTYPES)} or null (off), "
                          f"got {name!r}")
    return STORAGE_DTYPES[name]


def cache_bytes(layout: CacheLayout, lengths: list[int], dtype: torch.dtype) -> int:
    """The cache's size on disk in bytes for examples of ``lengths`` tokens (the index files aside)."""
    item = torch.empty((), dtype=dtype).element_size()
    counts = np.bincount(np.asarray(lengths, dtype=np.int64)) if len(lengths) else np.zeros(0, dtype=np.int64)
    return int(sum(int(count) * layout.values(length) for length, count in enumerate(counts) if count)) * item


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def plan_shards(layout: CacheLayout, lengths: list[int], dtype: torch.dtype,
                shard_bytes: int = SHARD_BYTES) -> list[list[int]]:
    """Consecutive example ranges [start, end) of about ``shard_bytes`` each (at least one example per shard)."""
    item = torch.empty((), dtype=dtype).element_size()
    shards, start, size = [], 0, 0
    for index, length in enumerate(lengths):
        example = layout.values(length) * item
        if index > start and size + example > shard_bytes:
            shards.append([start, index])
            start, size = index, 0
        size += example
    if start < len(lengths):
        shards.append([start, len(lengths)])
    return shards


def _shard_paths(folder: Path, index: int) -> tuple[Path, Path]:
    base = folder / "shards" / f"shard-{index:05d}"
    return base.with_suffix(".bin"), base.with_suffix(".npy")


def _logits_path(folder: Path, index: int) -> Path:
    return folder / "shards" / f"shard-{index:05d}.logits.npz"


def cached_logits(folder: Path, run_id: str) -> np.ndarray | list[np.ndarray] | None:
    """The teacher's logits a finished cache stored beside its buffers, in the dataset's order: (N, C) float32, or
    for a per-token head a list of N (T_i, C) float32 arrays (the layout of :func:`distill.tasks.evaluate.predict`).

    Args:
        folder: the stage folder (``teacher_outputs/``).
        run_id: the run id the cache must be finished under (the intermediate step's record names it).

    Returns:
        None when the folder holds no cache finished under ``run_id``, or one built without logits (by a build not
        given a logit reader, or by an earlier version): the caller then runs the teacher itself.
    """
    marker = folder / "shards" / "run.json"
    if not marker.is_file():
        return None
    meta = json.loads(marker.read_text(encoding="utf-8"))
    if meta.get("run_id") != run_id or not meta.get("logits") or stage_done(folder, run_id) is None:
        return None
    paths = [_logits_path(folder, i) for i in range(len(meta["shards"]))]
    if not all(path.is_file() for path in paths):
        return None  # a build resumed from shards written without them
    parts = [np.load(path) for path in paths]
    if "lengths" not in parts[0]:
        return np.concatenate([part["values"] for part in parts]).astype(np.float32, copy=False)
    rows = []
    for part in parts:
        rows.extend(np.split(part["values"].astype(np.float32, copy=False), np.cumsum(part["lengths"])[:-1]))
    return rows


def _example_lengths(dataset) -> list[int]:
    from distill.method.trainer import example_lengths  # tokens per example, read from the Arrow column

    return example_lengths(dataset)


def build_teacher_cache(teacher: torch.nn.Module, dataset, collate_fn: Callable[[list], dict], layout: CacheLayout,
                        folder: Path, run_id: str, dtype: torch.dtype, *, device: torch.device,
                        batch_size: int = 64, shard_bytes: int = SHARD_BYTES,
                        logits: Callable[[object], torch.Tensor | None] | None = None, per_token: bool = False) -> dict:
    """Run ``teacher`` over ``dataset`` once and store the buffers of ``layout`` per example in ``folder``.

    Resumable: shards already written under ``run_id`` are kept; a folder holding another run id's cache is deleted
    first (a cache is derived data, and can be many GiB). Within a shard, examples run in batches of similar length
    (less padding); the stored values are each example's own, unpadded.

    Args:
        teacher: the frozen teacher with score capture enabled at the layers ``layout`` reads (the
            :class:`~distill.method.objective.DistillationObjective` enables it), on ``device``.
        dataset: the tokenized training set (``input_ids`` per example), in the step's order.
        collate_fn: the step's collator (pads a list of examples into model inputs).
        layout: what to store.
        folder: the stage folder (``teacher_outputs/``).
        run_id: the cache's run id (teacher, training set, layout, dtype).
        dtype: storage dtype (float32, float16 or bfloat16).
        device: where the teacher runs.
        batch_size: examples per teacher forward.
        shard_bytes: about this many bytes per shard file.
        logits: the task type's logit reader (:meth:`distill.tasks.TaskType.logits`): each shard also keeps the
            teacher's float32 logits of its examples, for :func:`cached_logits`. None: buffers only.
        per_token: the head gives one row of logits per real token (:attr:`distill.tasks.TaskType.per_token`).

    Returns:
        The stage record: ``run_id``, ``num_rows``, ``bytes``, ``dtype``, ``layout``, ``seconds``.

    Raises:
        ConfigError: the disk under ``folder`` has not room for the cache (its size and the free space are named;
            nothing is written).
    """
    if folder_run_ids(folder) - {run_id}:
        logger.warning("%s holds a teacher-output cache of other settings: deleted (a cache is recomputed, not "
                       "kept)", folder)
        shutil.rmtree(folder)
    record = stage_done(folder, run_id)
    if record is not None:
        return record
    marker = folder / "shards" / "run.json"
    previous = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None
    lengths = _example_lengths(dataset)
    total = cache_bytes(layout, lengths, dtype)
    name = next(key for key, value in STORAGE_DTYPES.items() if value == dtype)
    written = 0
    if previous is not None and previous.get("run_id") == run_id:
        shards = previous["shards"]
        written = sum(_shard_paths(folder, i)[0].stat().st_size for i in range(len(shards))
                      if _shard_paths(folder, i)[1].is_file())
    else:
        shards = plan_shards(layout, lengths, dtype, shard_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if total - written > free * (1 - FREE_MARGIN):
        smaller = "" if name != "float32" else "store it at half the size (distill.teacher_cache: float16), "
        raise ConfigError(
            f"distill.teacher_cache: the teacher-output cache of {len(lengths)} examples needs {_gib(total - written)}"
            f" more in {folder}, over {100 * (1 - FREE_MARGIN):.0f}% of the {_gib(free)} the disk has free (the rest "
            f"is left for the run); free space, move output_dir, {smaller}or turn the cache off "
            "(distill.teacher_cache: null)")
    logger.info("teacher-output cache: %d examples, %s in %s (%s; %s); %d shards", len(lengths), _gib(total), name,
                ", ".join(f"{kind}[{layer}]" for kind, layer in layout.reads), folder, len(shards))
    mark_stage_started(folder)
    write_json_atomic(marker, {"run_id": run_id, "dtype": name, "layout": layout.to_json(), "shards": shards,
                               "bytes": total, "num_rows": len(lengths), "logits": logits is not None})
    todo = [i for i in range(len(shards)) if not _shard_paths(folder, i)[1].is_file()]
    attentions = any(kind == "attentions" for kind, _ in layout.reads)
    was_training = teacher.training
    teacher.eval()
    with tqdm(total=sum(shards[i][1] - shards[i][0] for i in todo), desc="teacher outputs (cached)",
              unit="ex") as progress:
        for index in todo:
            start, end = shards[index]
            _write_shard(teacher, dataset, collate_fn, layout, lengths, range(start, end), dtype, folder, index,
                         device, batch_size, attentions, progress, logits, per_token)
    teacher.train(was_training)
    return mark_stage_done(folder, run_id, {"num_rows": len(lengths), "bytes": total, "dtype": name,
                                            "layout": layout.to_json(), "device": str(device)})


@torch.no_grad()
def _write_shard(teacher, dataset, collate_fn, layout: CacheLayout, lengths: list[int], examples: range,
                 dtype: torch.dtype, folder: Path, index: int, device: torch.device, batch_size: int,
                 attentions: bool, progress, logits=None, per_token: bool = False) -> None:
    """One shard: the teacher over ``examples`` (batched by length), each example's buffers flattened in place, and
    with ``logits`` (a logit reader) each example's float32 logits beside them."""
    offsets = np.zeros(len(examples) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([layout.values(lengths[i]) for i in examples])
    values = torch.empty(int(offsets[-1]), dtype=dtype)
    order = sorted(examples, key=lambda i: lengths[i])
    heads: list = [None] * len(examples)  # each example's logits, (C,) or (T_i, C)
    for first in range(0, len(order), batch_size):
        chunk = order[first:first + batch_size]
        batch = collate_fn([_without_index(dataset[i]) for i in chunk])
        left = _left_padded(batch)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        outputs = run_model(teacher, batch, hidden_states=True, attentions=attentions,
                            **({"logits": logits} if logits is not None else {}))
        width = batch["attention_mask"].shape[1]
        buffers = [tensor.to("cpu", dtype) for tensor in _buffers(outputs, layout)]  # one copy per buffer and batch
        head = outputs.logits.float().cpu() if logits is not None and outputs.logits is not None else None
        del outputs
        for row, example in enumerate(chunk):
            length = lengths[example]
            tokens = slice(width - length, width) if left else slice(0, length)
            at = int(offsets[example - examples.start])
            for tensor in buffers:
                part = tensor[row][..., tokens, :][..., tokens] if tensor.dim() == 4 else tensor[row][tokens]
                values[at:at + part.numel()] = part.reshape(-1)
                at += part.numel()
            if head is not None:
                heads[example - examples.start] = (head[row][tokens] if per_token else head[row]).numpy()
        progress.update(len(chunk))
    data_path, offsets_path = _shard_paths(folder, index)
    write_atomic(data_path, _raw(values).numpy().tofile, temporary=data_path.with_suffix(".bin.tmp"))
    if logits is not None and all(row is not None for row in heads):
        arrays = {"values": np.concatenate(heads) if per_token else np.stack(heads)}
        if per_token:
            arrays["lengths"] = np.asarray([len(row) for row in heads], dtype=np.int64)
        path = _logits_path(folder, index)
        write_atomic(path, lambda handle: np.savez(handle, **arrays), temporary=path.with_suffix(".tmp.npz"))
    write_atomic(offsets_path, lambda handle: np.save(handle, offsets), temporary=offsets_path.with_suffix(".tmp.npy"))
    # the offsets last: the shard is complete when they exist


def _raw(values: torch.Tensor) -> torch.Tensor:
    """The values reinterpreted as the integer or float type numpy stores them as (bfloat16 as int16 bits)."""
    return values.view(_RAW_TORCH[values.dtype])


def _buffers(outputs: ModelOutputs, layout: CacheLayout) -> list[torch.Tensor]:
    """A batch's buffers in layout order: (B, T, H) hidden states / q / k / v, (B, A, T, T) scores."""
    found = []
    for kind, layer in layout.reads:
        if kind == "hidden_states":
            found.append(outputs.hidden_states[layer])
        elif kind == "attentions":
            found.append(outputs.attentions[layer - 1])
        else:
            found.extend(outputs.qkv[layer - 1])
    return found


def _without_index(example: dict) -> dict:
    return {k: v for k, v in example.items() if k != INDEX_COLUMN}


def _left_padded(batch: dict) -> bool:
    """Whether a collated batch is padded on the left (its first column holds padding and its last does not)."""
    mask = batch["attention_mask"]
    return bool((mask[:, 0] == 0).any()) and bool((mask[:, -1] == 1).all())


class TeacherCache:
    """A finished teacher-output cache, read back per example (memory-mapped, so the page cache serves re-reads).

    Args:
        folder: the stage folder :func:`build_teacher_cache` wrote.

    Raises:
        FileNotFoundError: the folder holds no finished cache.
    """

    def __init__(self, folder: Path):
        marker = Path(folder) / "shards" / "run.json"
        if stage_done(Path(folder), json.loads(marker.read_text(encoding="utf-8"))["run_id"]) is None:
            raise FileNotFoundError(f"{folder}: the teacher-output cache is not finished")
        meta = json.loads(marker.read_text(encoding="utf-8"))
        self.dtype = STORAGE_DTYPES[meta["dtype"]]
        saved = meta["layout"]
        self.layout = CacheLayout(tuple((kind, int(layer)) for kind, layer in saved["reads"]), saved["hidden_size"],
                                  saved["num_heads"])
        self.shards = meta["shards"]
        self.num_rows = int(meta["num_rows"])
        self._starts = np.asarray([start for start, _ in self.shards], dtype=np.int64)
        self._offsets = [np.load(_shard_paths(Path(folder), i)[1]) for i in range(len(self.shards))]
        self._paths = [_shard_paths(Path(folder), i)[0] for i in range(len(self.shards))]
        self._maps: list[np.memmap | None] = [None] * len(self.shards)

    def __len__(self) -> int:
        return self.num_rows

    def example(self, index: int) -> list[torch.Tensor]:
        """Example ``index``'s buffers in layout order, unpadded, in the storage dtype (views of the mapped file)."""
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        if self._maps[shard] is None:
            # copy-on-write: torch takes it without a copy (it refuses read-only arrays); nothing writes to it
            self._maps[shard] = np.memmap(self._paths[shard], dtype=_RAW[self.dtype], mode="c")
        offsets = self._offsets[shard]
        local = index - int(self._starts[shard])
        start, end = int(offsets[local]), int(offsets[local + 1])
        flat = torch.from_numpy(np.asarray(self._maps[shard][start:end])).view(self.dtype)
        length = _length_of(self.layout, end - start)
        parts, at = [], 0
        for shape in self.layout.shapes(length):
            size = int(np.prod(shape))
            parts.append(flat[at:at + size].view(shape))
            at += size
        return parts

    def collator(self, collate_fn: Callable[[list], dict]) -> "CachedCollator":
        """``collate_fn`` plus the cached teacher buffers of the batch's examples (see :class:`CachedCollator`)."""
        return CachedCollator(self, collate_fn)


def _length_of(layout: CacheLayout, values: int) -> int:
    """The token count T of an example that stores ``values`` values (the layout's sizes grow with T)."""
    quadratic = sum(layout.num_heads for kind, _ in layout.reads if kind == "attentions")
    linear = sum(layout.hidden_size * (3 if kind == "qkv" else 1) for kind, _ in layout.reads if kind != "attentions")
    if quadratic == 0:
        return values // linear
    length = int((-linear + (linear * linear + 4 * quadratic * values) ** 0.5) / (2 * quadratic) + 0.5)
    if quadratic * length * length + linear * length != values:
        raise ValueError(f"a cached example of {values} values fits no token count of this layout")
    return length


class CachedCollator:
    """Pads examples with ``collate_fn`` and adds their cached teacher buffers, padded the same way with zeros.

    Each example must carry :data:`INDEX_COLUMN` (its row in the cache; :func:`with_cache_index`). The batch gets
    ``teacher.hidden_states.<l>`` (B, T, H), ``teacher.attentions.<l>`` (B, A, T, T) and ``teacher.qkv.<l>.<0|1|2>``
    (B, T, H), in the storage dtype; :func:`cached_outputs` turns them back into the teacher's outputs. Runs in the
    loop's prefetch thread, off the training step.
    """

    def __init__(self, cache: TeacherCache, collate_fn: Callable[[list], dict]):
        self.cache, self.collate_fn = cache, collate_fn

    def __call__(self, examples: list[dict]) -> dict:
        indices = [int(example[INDEX_COLUMN]) for example in examples]
        batch = self.collate_fn([_without_index(example) for example in examples])
        width = batch["attention_mask"].shape[1]
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        left = _left_padded(batch)
        layout = self.cache.layout
        names = []
        for kind, layer in layout.reads:
            names.extend([f"{BATCH_PREFIX}qkv.{layer}.{i}" for i in range(3)] if kind == "qkv"
                         else [f"{BATCH_PREFIX}{kind}.{layer}"])
        buffers = [self.cache.example(index) for index in indices]
        for position, name in enumerate(names):
            rows = [parts[position] for parts in buffers]
            quadratic = rows[0].dim() == 3
            shape = (len(rows), rows[0].shape[0], width, width) if quadratic else (len(rows), width, rows[0].shape[-1])
            padded = torch.zeros(shape, dtype=self.cache.dtype)
            for row, values in enumerate(rows):
                length = values.shape[-2]
                if length != lengths[row]:
                    raise ValueError(f"teacher-output cache row {indices[row]} holds {length} tokens, the example "
                                     f"{lengths[row]}: the cache was made for other data; delete its folder")
                tokens = slice(width - length, width) if left else slice(0, length)
                if quadratic:
                    padded[row, :, tokens, tokens] = values
                else:
                    padded[row, tokens] = values
            batch[name] = padded
        return batch


def with_cache_index(dataset):
    """``dataset`` with :data:`INDEX_COLUMN`, each example's row (the cache is written in the dataset's order)."""
    if INDEX_COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(INDEX_COLUMN)
    return dataset.add_column(INDEX_COLUMN, np.arange(len(dataset), dtype=np.int64))


def cached_outputs(batch: dict, num_layers: int) -> ModelOutputs | None:
    """The teacher's outputs carried by a batch of :class:`CachedCollator` (taken out of the batch, in float32, the
    dtype the cache was computed in; under mixed precision the uncached teacher's matmuls run in half precision, so
    its targets are rounded more than the cached ones), or None for a batch without them.

    Args:
        batch: a batch on the step's device.
        num_layers: the teacher's L (the outputs hold L + 1 hidden states and L score entries; the layers the cache
            does not hold are None).
    """
    names = [name for name in batch if name.startswith(BATCH_PREFIX)]
    if not names:
        return None
    hidden: list[torch.Tensor | None] = [None] * (num_layers + 1)
    scores: list[torch.Tensor | None] = [None] * num_layers
    qkv: dict[int, list] = {}
    for name in names:
        tensor = batch.pop(name).float()
        _, kind, layer, *part = name.split(".")
        if kind == "hidden_states":
            hidden[int(layer)] = tensor
        elif kind == "attentions":
            scores[int(layer) - 1] = tensor
        else:
            qkv.setdefault(int(layer) - 1, [None] * 3)[int(part[0])] = tensor
    return ModelOutputs(logits=None, hidden_states=tuple(hidden), attentions=tuple(scores),
                        attention_mask=batch["attention_mask"], qkv={k: tuple(v) for k, v in qkv.items()})
