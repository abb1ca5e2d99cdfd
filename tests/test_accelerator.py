"""The pipeline and the fp16 loop on a real GPU; skipped on a machine without CUDA (CI has none).

The rest of the suite is pinned to the CPU (see conftest.py). These tests run child processes with
TINYDISTILL_TEST_ACCELERATOR=1 and without ACCELERATE_USE_CPU, so accelerate picks the GPU as it does for a user.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import BertTokenizer

from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FP16 = ["teacher.train", "mlm.train", "general.train", "distill.intermediate", "distill.prediction"]


def _on_the_gpu(command: list[str]) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "ACCELERATE_USE_CPU"}
    env["TINYDISTILL_TEST_ACCELERATOR"] = "1"
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_every_stage_of_the_job_runs_on_the_gpu_in_fp16(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    job = tiny_job_every_stage(tmp_path, tokenizer)
    sets = [arg for section in FP16 for arg in ("--set", f"{section}.mixed_precision=fp16")]
    result = _on_the_gpu([sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--config", job, *sets])
    assert result.returncode == 0, result.stderr[-4000:]

    out = tmp_path / "run"
    for stage in ("teacher", "mlm", "augmented", "teacher_logits", "student_intermediate", "student"):
        assert json.loads((out / stage / "stage.json").read_text())["device"].startswith("cuda"), stage
    general = Path(json.loads((out / "general.json").read_text())["folder"])
    assert json.loads((general / "stage.json").read_text())["device"].startswith("cuda")
    for stage in ("teacher", "mlm", "student_intermediate", "student"):
        losses = [row[key] for row in map(json.loads, (out / stage / "log.jsonl").read_text().splitlines())
                  for key in row if key.startswith("loss")]
        assert losses and all(math.isfinite(value) for value in losses), stage
    report = json.loads((out / "report.json").read_text())
    assert any(key.startswith("cuda_") for key in report["student"]["latency_ms"])
    export = json.loads((out / "student" / "onnx" / "export.json").read_text())
    assert set(export["files"]) == {"model.onnx", "model_quantized.onnx"}


def test_the_fp16_loss_scaling_test_passes_with_the_gpus_own_scaler():
    """tests/test_trainer.py's fp16 test forces the scaler on a CPU; here accelerate sets it up on the GPU itself."""
    result = _on_the_gpu([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_trainer.py::test_fp16_loss_scaling_skips_a_step_whose_gradients_overflowed"])
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-4000:]
