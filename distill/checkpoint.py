"""Atomic, resumable checkpoints and stage markers.

A checkpoint is a folder ``checkpoints/step-000200`` holding the trainable weights (safetensors), optimizer and
scheduler state, RNG states, the training position and the run id. It is written under a temporary name and renamed
into place, so a folder named ``step-*`` is always complete; older ones are removed only after the new one exists.

A finished stage writes ``stage.json`` (its run id and results) last, atomically; a stage folder with that file is
complete and is skipped on re-run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

STAGE_FILE = "stage.json"


class CheckpointError(RuntimeError):
    """A checkpoint or stage output is unreadable or belongs to another run."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, path)


def save_checkpoint(
    directory: Path,
    run_id: str,
    trainable: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: Any,
    rng: dict,
    extra: dict | None = None,
    keep: int = 1,
    config: dict | None = None,
) -> Path:
    """Write ``directory/step-{state.step:06d}`` atomically and keep the newest ``keep`` checkpoints.

    ``extra`` holds other picklable training state (e.g. a streamed dataset's position); ``config`` (the training
    settings) is written into ``state.json`` for people and tools reading the checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-"))
    weights = {k: v.detach().contiguous().cpu() for k, v in trainable.state_dict().items()}
    save_file(_untie(weights), tmp / "trainable.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng, "extra": extra or {}},
               tmp / "train.pt")
    (tmp / "state.json").write_text(
        json.dumps({"run_id": run_id, "state": dataclasses.asdict(state), "config": config}, indent=2, default=str),
        encoding="utf-8",
    )
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(directory.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _untie(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage (tied embeddings): give every tensor its own copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        pointer = tensor.data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def latest_checkpoint(directory: Path) -> Path | None:
    """Newest complete checkpoint folder in ``directory``, or None."""
    if not directory.is_dir():
        return None
    found = sorted(p for p in directory.glob("step-*") if p.is_dir())
    return found[-1] if found else None


def load_checkpoint(
    path: Path, run_id: str, trainable: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict:
    """Restore a checkpoint into ``trainable``, ``optimizer`` and ``scheduler``; returns {"state", "rng", "extra"}.

    Raises:
        CheckpointError: the checkpoint is unreadable or was written by another run (a different config).
    """
    try:
        meta = json.loads((path / "state.json").read_text(encoding="utf-8"))
        weights = load_file(path / "trainable.safetensors")
        extra = torch.load(path / "train.pt", weights_only=False)
    except Exception as error:  # truncated or corrupt files of any kind
        raise CheckpointError(f"checkpoint {path} is unreadable ({error}); delete it to restart that stage") from error
    if meta["run_id"] != run_id:
        raise CheckpointError(
            f"checkpoint {path} belongs to another run (run id {meta['run_id']}, this run {run_id}): the config "
            f"changed since it was written. Use a new --output-dir, or delete {path.parent} to restart this stage."
        )
    trainable.load_state_dict(weights)
    optimizer.load_state_dict(extra["optimizer"])
    scheduler.load_state_dict(extra["scheduler"])
    return {"state": meta["state"], "rng": extra["rng"], "extra": extra.get("extra", {})}


def stage_done(directory: Path, run_id: str) -> dict | None:
    """The recorded results of a finished stage, or None when it has not finished.

    Raises:
        CheckpointError: the stage finished under another run id (the config changed).
    """
    marker = directory / STAGE_FILE
    if not marker.exists():
        return None
    record = json.loads(marker.read_text(encoding="utf-8"))
    if record.get("run_id") != run_id:
        raise CheckpointError(
            f"{directory} holds the output of another run (run id {record.get('run_id')}, this run {run_id}): "
            f"the config of this stage changed. Use a new --output-dir, or delete {directory} to redo the stage."
        )
    return record


def mark_stage_done(directory: Path, run_id: str, results: dict | None = None) -> dict:
    """Record that the stage in ``directory`` finished; written last and atomically."""
    record = {"run_id": run_id, **(results or {})}
    write_json_atomic(directory / STAGE_FILE, record)
    return record
