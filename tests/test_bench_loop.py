"""bench/loop_overhead.py's parts that only a GPU run would otherwise exercise: the utilisation sampler (run here
against a stand-in ``nvidia-smi`` that prints what the real one prints) and the fixed-length collator."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import loop_overhead  # noqa: E402


def _fake_smi(tmp_path: Path, lines: list[str]) -> Path:
    """An executable that records its arguments and prints ``lines`` as ``nvidia-smi -lms`` would, then waits."""
    script = tmp_path / "nvidia-smi"
    printed = "".join(f"echo '{line}'\n" for line in lines)
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\n{printed}exec sleep 30\n")
    script.chmod(0o755)
    return script


def test_gpu_utilisation_is_the_mean_of_the_samples_read_while_the_block_ran(tmp_path):
    command = _fake_smi(tmp_path, ["37", "[N/A]", "63"])
    started = time.perf_counter()
    with loop_overhead.GpuUtilisation(index=1, period_ms=100, command=str(command)) as gpu:
        while len(gpu.samples) < 2 and time.perf_counter() - started < 10:
            time.sleep(0.05)
    assert gpu.samples == [37.0, 63.0]  # "[N/A]" is not a sample
    assert gpu.percent == pytest.approx(50.0)
    assert (tmp_path / "args").read_text().split() == [
        "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=1", "--loop-ms=100"]
    assert time.perf_counter() - started < 10  # the sampler was stopped, not waited for


def test_gpu_utilisation_is_none_without_nvidia_smi_or_off_cuda(tmp_path):
    with loop_overhead.GpuUtilisation(command=str(tmp_path / "no-such-command")) as gpu:
        pass
    assert gpu.percent is None and gpu.samples == []
    with loop_overhead.utilisation(torch.device("cpu")) as gpu:
        pass
    assert gpu.percent is None


def test_pad_to_max_length_gives_batches_of_that_length():
    from transformers import AutoTokenizer

    from distill.config import TaskConfig
    from distill.tasks.data import task_spec
    from teachers.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    spec = task_spec(TaskConfig(name="sst2", max_seq_length=32))
    rows = [dict(tokenizer(text), label=0) for text in ("a short one", "a somewhat longer sentence than that")]
    fixed = loop_overhead.bench_collator(tokenizer, spec, type("Args", (), {"pad_to_max_length": True,
                                                                             "max_seq_length": 32}))
    longest = loop_overhead.bench_collator(tokenizer, spec, type("Args", (), {"pad_to_max_length": False,
                                                                               "max_seq_length": 32}))
    assert fixed(rows)["input_ids"].shape == (2, 32)
    assert longest(rows)["input_ids"].shape == (2, max(len(row["input_ids"]) for row in rows))


def test_the_loops_utilisation_is_that_of_the_steps_the_long_run_adds():
    short, long = loop_overhead.GpuUtilisation(), loop_overhead.GpuUtilisation()
    short.percent, short.seconds = 50.0, 1.0  # set-up and warm-up: busy 0.5 s
    long.percent, long.seconds = 80.0, 3.0  # the same and 2 s of steps: busy 2.4 s
    assert loop_overhead.busy_percent(short, long) == pytest.approx(95.0)  # (2.4 - 0.5) / 2
    long.percent = None
    assert loop_overhead.busy_percent(short, long) is None


def test_the_cuda_ordinal_is_read_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-abc")
    assert loop_overhead.utilisation(torch.device("cuda", 1)).index == "GPU-abc"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert loop_overhead.utilisation(torch.device("cuda", 1)).index == 1
