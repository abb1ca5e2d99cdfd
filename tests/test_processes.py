"""Who writes a stage's files under a multi-process launch (distill/method/processes.py), with the ranks simulated in
one process through the launcher's environment (RANK, WORLD_SIZE); tests/test_distributed.py runs real processes."""

import json
import os
import threading
import time

import pytest

from distill.method.checkpoint import (
    STAGE_FILE,
    STARTED_FILE,
    finished_or_superseded,
    mark_stage_done,
    mark_stage_started,
)
from distill.method import processes
from distill.method.processes import FAILED_FILE, ProcessFailedError, launch_marker, on_main, recorded


def _as_rank(monkeypatch, rank: int, world_size: int = 2) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def test_one_process_runs_the_work_and_returns_the_record_as_stored(tmp_path):
    calls = []

    def make():
        calls.append(1)
        mark_stage_done(tmp_path, "abc", {"dev": {"accuracy": 0.5}, "pair": (1, 2)})

    record = on_main(tmp_path, "abc", make)
    assert calls == [1]
    assert record == {"run_id": "abc", "dev": {"accuracy": 0.5}, "pair": [1, 2]}  # read back: JSON types
    assert not (tmp_path / FAILED_FILE).exists()  # one process: nobody waits, no marker


def test_work_that_does_not_record_the_stage_is_an_error(tmp_path):
    mark_stage_done(tmp_path, "old")
    with pytest.raises(RuntimeError, match="without recording it under run id new"):
        on_main(tmp_path, "new", lambda: None)


def test_another_process_waits_for_the_record_and_never_runs_the_work(tmp_path, monkeypatch):
    _as_rank(monkeypatch, 1)
    mark_stage_done(tmp_path, "old")  # the folder the main process is about to replace: not this stage's record
    writer = threading.Timer(0.3, lambda: mark_stage_done(tmp_path, "new", {"num_rows": 7}))
    writer.start()
    start = time.perf_counter()
    record = on_main(tmp_path, "new", lambda: pytest.fail("only the main process runs the work"))
    writer.join()
    assert record == {"run_id": "new", "num_rows": 7}
    assert time.perf_counter() - start >= 0.3


def test_the_main_process_failing_stops_the_others_with_its_error(tmp_path, monkeypatch):
    _as_rank(monkeypatch, 0)

    def make():
        raise ValueError("teacher at chance")

    with pytest.raises(ValueError, match="teacher at chance"):
        on_main(tmp_path, "abc", make)
    assert json.loads((tmp_path / FAILED_FILE).read_text())["error"] == "ValueError: teacher at chance"
    _as_rank(monkeypatch, 1)
    with pytest.raises(ProcessFailedError,
                       match=r"process 0 of this launch stopped in this stage \(ValueError: teacher at chance\)"):
        on_main(tmp_path, "abc", lambda: None)


def test_an_earlier_jobs_failure_is_not_this_jobs(tmp_path, monkeypatch):
    """An earlier launch of the same command (the same rendezvous, so the same job in the marker) left its marker:
    older than this process, it does not stop it; the same marker written now does."""
    _as_rank(monkeypatch, 1)
    (tmp_path / FAILED_FILE).write_text(json.dumps(launch_marker(error="ValueError: an earlier run")))
    with pytest.raises(ProcessFailedError, match="an earlier run"):  # the control: written during this process
        on_main(tmp_path, "abc", lambda: None)
    before_this_process = processes._PROCESS_STARTED - 10
    os.utime(tmp_path / FAILED_FILE, (before_this_process, before_this_process))
    threading.Timer(0.2, lambda: mark_stage_done(tmp_path, "abc")).start()
    assert on_main(tmp_path, "abc", lambda: None)["run_id"] == "abc"  # waited for the record instead of stopping
    _as_rank(monkeypatch, 0)
    on_main(tmp_path, "abc", lambda: None)  # finished already: the main process's work may just return
    assert not (tmp_path / FAILED_FILE).exists()  # and the earlier job's marker is cleared


def test_recorded_reads_only_a_record_of_the_run_id(tmp_path):
    assert recorded(tmp_path, "abc") is None
    mark_stage_done(tmp_path, "other")
    assert recorded(tmp_path, "abc") is None
    mark_stage_done(tmp_path, "abc")
    assert recorded(tmp_path, "abc")["run_id"] == "abc"


def test_only_the_main_process_notes_a_start_or_moves_a_folder_aside(tmp_path, monkeypatch):
    stage = tmp_path / "teacher"
    mark_stage_done(stage, "old")
    _as_rank(monkeypatch, 1)
    mark_stage_started(stage)
    assert not (stage / STARTED_FILE).exists()
    assert finished_or_superseded(stage, "new") is None
    assert (stage / STAGE_FILE).is_file()  # left where it was: the main process moves it
    _as_rank(monkeypatch, 0)
    assert finished_or_superseded(stage, "new") is None
    assert not stage.exists() and (tmp_path / "superseded" / "teacher-old" / STAGE_FILE).is_file()
    mark_stage_started(stage)
    assert json.loads((stage / STARTED_FILE).read_text())["resumed"] is False


def test_another_jobs_failure_in_a_shared_folder_does_not_stop_this_one(tmp_path, monkeypatch):
    """Two launches may share a folder (general distillation's cache): a failure the other one recorded there, even
    while this one runs, is not this job's."""
    _as_rank(monkeypatch, 0)
    monkeypatch.setenv("MASTER_PORT", "29501")

    def make():
        raise KeyboardInterrupt("SIGINT")

    with pytest.raises(KeyboardInterrupt):
        on_main(tmp_path, "abc", make)
    assert (tmp_path / FAILED_FILE).is_file()
    _as_rank(monkeypatch, 1)
    monkeypatch.setenv("MASTER_PORT", "29502")  # this job's rendezvous
    threading.Timer(0.3, lambda: mark_stage_done(tmp_path, "abc")).start()
    assert on_main(tmp_path, "abc", lambda: None)["run_id"] == "abc"


def test_a_marker_that_cannot_be_written_leaves_the_stages_own_error(tmp_path, monkeypatch):
    import errno

    import distill.method.processes

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    _as_rank(monkeypatch, 0)
    monkeypatch.setattr(distill.method.processes, "write_json_atomic", full_disk)

    def make():
        raise ValueError("the stage's own error")

    with pytest.raises(ValueError, match="the stage's own error"):
        on_main(tmp_path, "abc", make)


def test_a_process_failing_in_shared_work_stops_the_main_one_waiting_for_it(tmp_path, monkeypatch):
    """Work every process does its share of (augmentation): the main process waits for the others' shares, and one
    that fails in its share ends that wait with its rank and error."""
    from distill.method.processes import failure_marked, wait_for

    _as_rank(monkeypatch, 1)
    with pytest.raises(OSError, match="masked LM out of memory"):
        with failure_marked(tmp_path):
            raise OSError("masked LM out of memory")
    _as_rank(monkeypatch, 0)
    with pytest.raises(ProcessFailedError, match=r"process 1 of this launch stopped in this stage \(OSError: masked LM"):
        wait_for(tmp_path, lambda: None)
    (tmp_path / FAILED_FILE).unlink()
    threading.Timer(0.2, lambda: (tmp_path / "shard-00001").mkdir()).start()
    assert wait_for(tmp_path, lambda: True if (tmp_path / "shard-00001").is_dir() else None) is True
