"""Who writes a stage's files under a multi-process launch (``accelerate launch``, ``torchrun``).

Every process of such a job runs the same code. Training is split across the processes (DDP, :mod:`distill.method.trainer`),
and so is augmentation, shard by shard (each process writes its own shards: :func:`distill.job.stage_augment.augment_stage`).
The rest of a stage's work is not: evaluating a given teacher, computing the teacher's logits or outputs once, saving a
trained model, evaluating it and writing the stage's record. That work is done by the main process alone
(:func:`on_main`), and every other process waits for the record it writes (``stage.json``, written last), then reads
what it wrote. So two processes never write one file, and no process reads a file that another is still writing.

Processes wait by reading the folder (:func:`wait_for`), not at a collective barrier: one process's work can take an
hour, longer than a process group's timeout (30 minutes by default). A process that fails in such work
(:func:`failure_marked`) leaves ``failed.json`` in the folder, and those waiting stop with its rank and error. The
marker names its job (the launcher's rendezvous, ``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID``, and its
restart, ``TORCHELASTIC_RESTART_COUNT``) and counts only when newer than the waiting process, so neither an earlier
job's marker nor that of another job sharing a cache folder (general distillation's) stops this one. A failure ends
the job: the processes cannot be kept in step after one of them fails alone (the ``seeds`` command stops at a failing
seed under a multi-process launch).
In a single process, :func:`on_main` just runs the work.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, TypeVar

import psutil

from distill.method.checkpoint import STAGE_FILE, CheckpointError, is_main_process, write_json_atomic

__all__ = ["FAILED_FILE", "ProcessFailedError", "failure_marked", "from_this_launch", "is_main_process",
           "launch_marker", "on_main", "recorded", "several_processes", "wait_for"]

FAILED_FILE = "failed.json"
# A failed.json older than this process was left by an earlier job (a launcher starts a job's processes together,
# before any stage runs), so it does not stop this one.
_PROCESS_STARTED = psutil.Process().create_time()
# Seconds between two looks at the folder while waiting: from the first to the last, doubling.
POLL_SECONDS = (0.05, 2.0)
logger = logging.getLogger(__name__)
T = TypeVar("T")


class ProcessFailedError(CheckpointError):
    """Another process of this launch failed in a stage that this process was waiting for."""


def several_processes() -> bool:
    """Whether this process is one of several of a launch (``WORLD_SIZE`` above 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _job() -> str:
    """What the processes of one launch share and another launch running at the same time does not."""
    return ":".join(os.environ.get(name, "") for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                                          "TORCHELASTIC_RESTART_COUNT"))


def launch_marker(**fields: Any) -> dict:
    """What a process leaves for the others of its launch: ``fields``, this launch (which :func:`from_this_launch`
    matches), this process's rank and pid."""
    return {**fields, "job": _job(), "rank": int(os.environ.get("RANK", "0")), "pid": os.getpid()}


def from_this_launch(path: Path) -> dict | None:
    """The marker at ``path`` (:func:`launch_marker`) when a process of this launch wrote it: its launch matches and
    the file is newer than this process (an earlier launch of the same command may have had the same rendezvous).
    None when there is none, or only an earlier or another launch's; never raises for either."""
    try:
        if Path(path).stat().st_mtime < _PROCESS_STARTED:
            return None
        marker = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("job") == _job() else None


def recorded(folder: Path, run_id: str) -> dict | None:
    """The record in ``<folder>/stage.json`` when the stage finished under ``run_id``; None when there is none yet or
    it is of another run id (a folder the main process is about to replace). Never raises for either."""
    try:
        record = json.loads((Path(folder) / STAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not written yet (stage.json is written whole, by a rename)
        return None
    return record if isinstance(record, dict) and record.get("run_id") == run_id else None


@contextlib.contextmanager
def failure_marked(folder: Path) -> Iterator[None]:
    """Run the block; if it raises (anything, ``KeyboardInterrupt`` included) while several processes run, first
    leave ``<folder>/failed.json`` (the error, this launch, this process's rank) for the processes waiting on the
    folder (:func:`wait_for`), then raise as it is. A marker that cannot be written (a full disk) is logged; the
    block's own error is the one raised."""
    try:
        yield
    except BaseException as error:
        if several_processes():  # the others are waiting for this folder: tell them, or they wait for ever
            try:
                write_json_atomic(Path(folder) / FAILED_FILE, launch_marker(error=f"{type(error).__name__}: {error}"))
            except OSError as failed:
                logger.error("%s: could not leave %s for the other processes (%s); stop them", folder, FAILED_FILE,
                             failed)
        raise


def wait_for(folder: Path, done: Callable[[], T | None]) -> T:
    """Call ``done`` until it returns something other than None (every 0.05 s, backing off to every 2 s) and return
    that; while waiting, a failure another process of this launch marked in ``folder`` (:func:`failure_marked`) ends
    the wait.

    Raises:
        ProcessFailedError: a process of this launch failed in this folder's stage; its rank and error are named.
    """
    delay, longest = POLL_SECONDS
    while (value := done()) is None:
        failure = _failure(Path(folder))
        if failure is not None:
            raise ProcessFailedError(f"{folder}: {failure}; see that process's output, fix the cause and re-run the "
                                     "same command")
        time.sleep(delay)
        delay = min(2 * delay, longest)
    return value


def on_main(folder: Path, run_id: str, make: Callable[[], Any]) -> dict:
    """Run ``make`` in the main process alone; every process returns the stage's record as stored.

    ``make`` must finish the stage: write every file of it, then its record, ``<folder>/stage.json`` under ``run_id``
    (:func:`distill.method.checkpoint.mark_stage_done`); when the stage is finished already, it may just return. The other
    processes wait until that record is there (:func:`wait_for`), or until the main process records that ``make``
    failed.

    Args:
        folder: the stage's folder.
        run_id: the run id its record must have.
        make: the work; called with no arguments, in the main process only. Its return value is not used.

    Returns:
        The record read back from ``stage.json``: the same dict, JSON types, in every process.

    Raises:
        ProcessFailedError: (another process) a process of this launch failed in this folder's stage (the main one
            in ``make``, or one in a shared part before it); its rank and error are in the message.
        RuntimeError: (main process) ``make`` returned without recording the stage under ``run_id``.
        Whatever ``make`` raises (main process); with several processes it first writes ``<folder>/failed.json``.
    """
    folder = Path(folder)
    if not is_main_process():
        return wait_for(folder, lambda: recorded(folder, run_id))
    with failure_marked(folder):
        make()
        record = recorded(folder, run_id)
        if record is None:
            raise RuntimeError(f"{folder}: the stage's work returned without recording it under run id {run_id}")
    (folder / FAILED_FILE).unlink(missing_ok=True)  # an earlier launch's, now out of date
    return record


def _failure(folder: Path) -> str | None:
    """The failure a process of this launch recorded in ``folder`` ("process R stopped in this stage (error)"); None
    when there is none, or only an earlier launch's or another launch's."""
    failure = from_this_launch(folder / FAILED_FILE)
    if failure is None:
        return None
    return f"process {failure.get('rank', '?')} of this launch stopped in this stage ({failure.get('error')})"
