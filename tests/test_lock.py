"""One run per output folder: a second run on a folder another live process is writing is refused with a message that
names that process; the lock goes with the process, however it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from distill.method.checkpoint import FolderInUseError, output_lock

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from distill.method.checkpoint import output_lock
    with output_lock(Path(sys.argv[1]), "python run_distill.py pipeline --output-dir held"):
        print("locked", flush=True)
        time.sleep(120)
""")


def _hold(folder):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True,
                               cwd=os.getcwd())
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_second_run_on_a_busy_folder_is_refused_naming_the_process(tmp_path):
    process = _hold(tmp_path / "run")
    try:
        with pytest.raises(FolderInUseError, match=rf"in use by process {process.pid} \(python run_distill.py "
                                                   r"pipeline --output-dir held, started "):
            with output_lock(tmp_path / "run"):
                pass
        with output_lock(tmp_path / "other"):  # another folder is free
            pass
    finally:
        process.kill()
        process.wait()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
    process = _hold(tmp_path / "run")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert json.loads((tmp_path / "run" / ".lock").read_text())["pid"] == process.pid  # left behind by the kill
    with caplog.at_level("INFO"), output_lock(tmp_path / "run", "second"):
        assert json.loads((tmp_path / "run" / ".lock").read_text())["command"] == "second"
    assert f"lock of process {process.pid}" in caplog.text
    assert (tmp_path / "run" / ".lock").read_text() == ""  # released: it names no holder
    with output_lock(tmp_path / "run"):  # and free again
        pass


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    with pytest.raises(RuntimeError), output_lock(tmp_path / "run"):
        raise RuntimeError("a stage failed")
    with output_lock(tmp_path / "run"):
        pass


# `distill --stage general`, the longest command, holds its folder as the pipeline does: two runs there would write
# the same checkpoints.
@pytest.mark.parametrize("argv", [["pipeline", "--config", "configs/smoke.yaml"], ["distill", "--stage", "general"]],
                         ids=["pipeline", "general"])
def test_the_command_line_refuses_a_busy_folder_with_one_error_line(tmp_path, capsys, argv):
    import run_distill

    folder = tmp_path / "run"
    process = _hold(folder)
    try:
        code = run_distill.main([*argv, "--output-dir", str(folder)])
    finally:
        process.kill()
        process.wait()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and f"in use by process {process.pid}" in errors[0]
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "run.log"]  # nothing else was written


def test_a_dry_run_prints_the_config_and_the_plan_and_writes_nothing(tmp_path, capsys):
    import run_distill

    folder = tmp_path / "run"
    assert run_distill.main(["pipeline", "--config", "configs/smoke.yaml", "--output-dir", str(folder),
                             "--dry-run", "--show-config"]) == 0
    printed = capsys.readouterr().out
    assert f"output_dir: {folder}" in printed  # the resolved config
    for stage in ("teacher", "mlm", "augmented", "student_intermediate", "teacher_logits", "student"):
        assert any(line.split()[:2] == [stage, "run"] for line in printed.splitlines()), stage
    # The general stage lives in the session's cache, which an earlier test may have filled.
    assert any(line.split()[:1] == ["general"] and line.split()[1] in ("run", "reuse") for line in printed.splitlines())
    assert not folder.exists()
