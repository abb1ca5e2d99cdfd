"""Atomic, resumable checkpoints and stage markers.

A checkpoint is a folder ``checkpoints/step-000200`` holding the trainable weights (safetensors), optimizer and
scheduler state, RNG states, the training position and the run id. It is written under a temporary name and renamed
into place, so a folder named ``step-*`` is always complete; older ones are removed only after the new one exists.

A finished stage writes ``stage.json`` (its run id and results) last, atomically; a stage folder with that file is
complete and is skipped on re-run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

STAGE_FILE = "stage.json"
logger = logging.getLogger(__name__)


def is_main_process() -> bool:
    """Whether this process is the job's main process: global rank 0 under a launcher (``RANK``, set by torchrun and
    ``accelerate launch``), and always in a single process. The main process alone writes stage folders' files
    (:mod:`distill.method.processes`)."""
    return int(os.environ.get("RANK", "0")) == 0


class CheckpointError(RuntimeError):
    """A checkpoint or stage output is unreadable, cannot be written, or belongs to another run."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files are truncated or unreadable (an older good checkpoint may still be used)."""


def disk_full_hint(error: OSError) -> str:
    """Words for an OSError while writing: disk full / quota gets its own advice."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full; free space"
    return f"{error.strerror or error}; fix that"


def write_atomic(path: Path, write: Callable[[IO], Any], mode: str = "wb", temporary: Path | None = None) -> None:
    """``write(file)`` into a temporary file beside ``path`` (or ``temporary``), flushed to disk, then renamed to
    ``path``: readers never see half a file, and a crash leaves the old file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if temporary is None:
        handle = tempfile.NamedTemporaryFile(mode, dir=path.parent, suffix=".tmp", delete=False,
                                             **({} if "b" in mode else {"encoding": "utf-8"}))
    else:
        handle = open(temporary, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    with handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename, so readers never see half a file."""
    write_atomic(path, lambda f: json.dump(data, f, indent=2, default=str), mode="w")


def save_checkpoint(
    directory: Path,
    run_id: str,
    trainable: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: Any,
    rng: dict,
    extra: dict | None = None,
    keep: int = 2,
    config: dict | None = None,
) -> Path:
    """Write ``directory/step-{state.step:06d}`` atomically and keep the newest ``keep`` checkpoints.

    Two are kept by default, so that a newest checkpoint found corrupt on resume (a failing disk, a copy cut short)
    still leaves a good one. ``extra`` holds other picklable training state (e.g. a streamed dataset's position);
    ``config`` (the training settings) is written into ``state.json`` for people and tools reading the checkpoint.

    Raises:
        CheckpointError: the files could not be written (disk full, permissions); the partial folder is removed and
            the earlier checkpoints are untouched.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-"))
    try:
        weights = {k: v.detach().contiguous().cpu() for k, v in trainable.state_dict().items()}
        save_file(untie(weights), tmp / "trainable.safetensors")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng,
                    "extra": extra or {}}, tmp / "train.pt")
        (tmp / "state.json").write_text(
            json.dumps({"run_id": run_id, "state": dataclasses.asdict(state), "config": config}, indent=2, default=str),
            encoding="utf-8",
        )
        _fsync_folder(tmp)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(directory)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"cannot write checkpoint {final}: {disk_full_hint(error)} and re-run the same command to resume ({kept})"
        ) from error
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in _by_step(directory.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_folder(folder: Path) -> None:
    """Flush every file of ``folder`` to disk before it is renamed into place (a power cut then leaves either the
    old state or the whole new checkpoint)."""
    for path in folder.iterdir():
        with path.open("rb") as f:
            os.fsync(f.fileno())


def untie(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage (tied embeddings): give every tensor its own copy."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        pointer = tensor.data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def save_file_atomic(weights: dict[str, torch.Tensor], path: Path) -> None:
    """Write safetensors to ``path`` under a temporary name, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    save_file(weights, temporary)
    os.replace(temporary, path)


def latest_checkpoint(directory: Path) -> Path | None:
    """Newest complete checkpoint folder in ``directory``, or None."""
    found = checkpoints(directory)
    return found[-1] if found else None


def checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoint folders in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return _by_step(p for p in directory.glob("step-*") if p.is_dir())


def _by_step(paths) -> list[Path]:
    """``step-*`` checkpoint folders in step order (by number: step-1000000 after step-999000, which names do not
    sort as text once the step outgrows its six digits)."""
    def step(path: Path) -> tuple[int, str]:
        number = path.name.split("-", 1)[1]
        return (int(number), path.name) if number.isdigit() else (-1, path.name)
    return sorted(paths, key=step)


def load_checkpoint(
    path: Path, run_id: str, trainable: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict:
    """Restore a checkpoint into ``trainable``, ``optimizer`` and ``scheduler``; returns {"state", "rng", "extra"}.

    Every file is read and checked before anything is restored, so a failed load leaves the objects untouched.

    Raises:
        CorruptCheckpointError: a file is missing, truncated or unreadable.
        CheckpointError: the checkpoint was written by another run (a different config).
    """
    try:
        meta = json.loads((path / "state.json").read_text(encoding="utf-8"))
        weights = load_file(path / "trainable.safetensors")
        # On the CPU: a checkpoint saved on a GPU resumes on a machine without one (load_state_dict then moves the
        # optimizer's moments to its parameters' device).
        extra = torch.load(path / "train.pt", weights_only=False, map_location="cpu")
        if "run_id" not in meta or not {"optimizer", "scheduler", "rng"} <= extra.keys():
            raise KeyError("state.json or train.pt lacks the training state")
    except Exception as error:  # truncated or corrupt files of any kind
        raise CorruptCheckpointError(f"checkpoint {path} is unreadable ({error.__class__.__name__}: {error})") from error
    if meta["run_id"] != run_id:
        raise CheckpointError(
            f"checkpoint {path} belongs to another run (run id {meta['run_id']}, this run {run_id}): the config "
            f"changed since it was written. Use a new --output-dir, or delete {path.parent} to restart this stage."
        )
    trainable.load_state_dict(weights)
    saved = extra["optimizer"]
    for group, current in zip(saved["param_groups"], optimizer.param_groups):
        # The kernel is this process's choice, not the saving run's: torch places the restored step counts by the
        # saved groups' flags (a fused kernel wants them on the parameters' device), so they must name it first.
        for key in ("fused", "foreach", "capturable"):
            if key in current:
                group[key] = current[key]
    optimizer.load_state_dict(saved)
    scheduler.load_state_dict(extra["scheduler"])
    return {"state": meta["state"], "rng": extra["rng"], "extra": extra.get("extra", {})}


def load_latest_good_checkpoint(
    directory: Path, run_id: str, trainable: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[Path, dict] | None:
    """Restore the newest readable checkpoint in ``directory``; corrupt newer ones are renamed ``corrupt-step-*``
    (kept for inspection, never read again) with a warning that names them.

    Returns:
        (checkpoint folder, what :func:`load_checkpoint` returns), or None when there is no checkpoint.

    Raises:
        CheckpointError: a checkpoint belongs to another run, or every checkpoint is corrupt.
    """
    found = checkpoints(directory)
    for path in reversed(found):
        try:
            return path, load_checkpoint(path, run_id, trainable, optimizer, scheduler)
        except CorruptCheckpointError as error:
            if not is_main_process():  # the main process moves it aside; this one goes on to the previous one
                continue
            aside = path.with_name(f"corrupt-{path.name}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            logger.warning("%s; moved to %s, trying the previous checkpoint", error, aside)
    if found:
        raise CheckpointError(f"every checkpoint in {directory} is unreadable (moved to corrupt-step-*); delete "
                              f"{directory} to restart this stage from the beginning")
    return None


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


STARTED_FILE = "started.json"


def mark_stage_started(directory: Path) -> None:
    """Note when the stage in ``directory`` started running in this process (``started.json``, wall-clock seconds):
    its :func:`mark_stage_done` then records ``seconds``, the wall time from there. A stage that resumes the
    unfinished work of an earlier process counts from its resume and is recorded as ``resumed``; a stage skipped as
    finished does not call this. Under a multi-process launch only the main process writes it (the others' call does
    nothing), so a second process never finds the first one's file and records the stage as resumed."""
    if not is_main_process():
        return
    directory.mkdir(parents=True, exist_ok=True)
    started = directory / STARTED_FILE
    resumed = started.is_file() and not (directory / STAGE_FILE).is_file()
    write_json_atomic(started, {"started_at": time.time(), "resumed": resumed})


def mark_stage_done(directory: Path, run_id: str, results: dict | None = None) -> dict:
    """Record that the stage in ``directory`` finished; written last and atomically.

    With a ``started.json`` (:func:`mark_stage_started`) the record gets ``seconds`` (wall time since then, unless
    the results give it) and ``resumed``. The timing is best-effort: an unreadable ``started.json`` is logged and
    left out, never a reason to lose the finished stage."""
    record = {"run_id": run_id, **(results or {})}
    started = directory / STARTED_FILE
    if "seconds" not in record and started.is_file():
        try:
            start = json.loads(started.read_text(encoding="utf-8"))
            record["seconds"] = round(time.time() - float(start["started_at"]), 1)
            record["resumed"] = bool(start.get("resumed", False))
        except (OSError, ValueError, KeyError, TypeError) as error:
            logger.warning("%s: cannot read %s (%s); the stage's wall time is not recorded", directory, STARTED_FILE,
                           error)
    write_json_atomic(directory / STAGE_FILE, record)
    return record


SUPERSEDED = "superseded"


def folder_run_ids(directory: Path) -> set[str]:
    """Run ids recorded in a stage folder: its ``stage.json``, its training checkpoints, its augmentation shards, the
    ``run.json`` of a stage whose work in progress is files of its own (the pruning stage's importance)."""
    found = set()
    markers = [directory / STAGE_FILE, *directory.glob("checkpoints/step-*/state.json"), directory / "shards" / "run.json",
               directory / "run.json"]
    for marker in markers:
        try:
            found.add(json.loads(marker.read_text(encoding="utf-8"))["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def finished_or_superseded(directory: Path, run_id: str) -> dict | None:
    """The record of a stage finished under ``run_id``, or None when it has to run (or resume).

    A folder that holds the output of another run id, finished or not (its config, or that of a stage before it,
    changed), is moved to ``<parent>/superseded/<name>-<its run id>/`` with a warning, so nothing done is lost and the
    stage runs again in a clean folder; an unfinished folder of the same run id is left to resume. Under a
    multi-process launch only the main process moves it (another could otherwise move the new folder the main process
    has begun in its place); the others answer from what they find, which is None while it is moved as after.
    """
    others = folder_run_ids(directory) - {run_id}
    if others and not is_main_process():
        return None
    if others:
        old = sorted(others)[0]
        target = directory.parent / SUPERSEDED / f"{directory.name}-{old}"
        suffix = 1
        while target.exists():
            target, suffix = target.with_name(f"{directory.name}-{old}-{suffix}"), suffix + 1
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.rename(target)
            logger.warning("%s held the output of another run (run id %s, this run %s): the settings it depends on "
                           "changed. Moved it to %s; running the stage again.", directory, old, run_id, target)
        except FileNotFoundError:  # another process of the job moved it first
            pass
    return stage_done(directory, run_id)


def stage_status(directory: Path, run_id: str) -> str:
    """What running the stage in ``directory`` under ``run_id`` would do, without touching the folder: ``reuse``
    (finished under this run id), ``resume`` (checkpoints or shards of this run id), ``replace`` (it holds another run's
    output, which would be moved to ``superseded/``) or ``run``."""
    found = folder_run_ids(directory)
    if found - {run_id}:
        return "replace"
    marker = directory / STAGE_FILE
    if run_id in found and marker.is_file():
        return "reuse"
    return "resume" if run_id in found else "run"


LOCK_FILE = ".lock"


class FolderInUseError(CheckpointError):
    """Another live process is running a job in the same output folder."""


@contextlib.contextmanager
def output_lock(folder: Path, command: str | None = None):
    """Hold ``folder`` for this process while the block runs: a second run in the same output folder is refused.

    The lock is an exclusive ``flock`` on ``<folder>/.lock``, which the kernel releases on any exit of the process,
    a crash or ``kill -9`` included; the file names its holder (pid, command, start time) for the refusal message.
    A file left by a killed run is therefore not a lock: it is taken over, with a note in the log. Under a
    multi-process launch only the first process (``RANK`` 0) takes it.

    Raises:
        FolderInUseError: a live process holds the folder; the message names it.
    """
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    if not is_main_process():  # under `accelerate launch`, the first process holds it for the job
        yield
        return
    path = folder / LOCK_FILE
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = _lock_holder(handle.read())
        handle.close()
        raise FolderInUseError(
            f"{folder} is in use by process {holder.get('pid', '?')} ({holder.get('command') or 'command unknown'}, "
            f"started {holder.get('started', '?')}): wait for it to finish or stop it, or give this run another "
            "--output-dir") from None
    handle.seek(0)
    stale = _lock_holder(handle.read())
    if stale.get("pid") not in (None, os.getpid()):
        logger.info("%s: the lock of process %s (%s) was left by a run that ended without releasing it; taken over",
                    folder, stale["pid"], stale.get("command"))
    handle.seek(0)
    handle.truncate()
    json.dump({"pid": os.getpid(), "command": command or " ".join(sys.argv),
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}, handle)
    handle.flush()
    try:
        yield
    finally:
        handle.seek(0)
        handle.truncate()  # an empty lock file names no holder
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _lock_holder(text: str) -> dict:
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}
