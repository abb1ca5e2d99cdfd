"""Kill every stage at a moment inside it, re-run the same command, and get what an uninterrupted run gets, bit for
bit (CPU, same seed). Real CLI in subprocesses, tiny models saved to disk."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import BertModel

from conftest import tiny_bert_config
from glue_fixtures import SENTENCES

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
STEPS = {"max_steps": 60, "batch_size": 8, "learning_rate": 1.0e-3, "save_steps": 4, "log_steps": 4}


def _command(*args) -> list[str]:
    return [sys.executable, str(ROOT / "run_distill.py"), *args]


def _run(*args) -> subprocess.CompletedProcess:
    result = subprocess.run(_command(*args), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _interrupt_when(marker: str, args: list[str], out: Path, how: int = signal.SIGKILL) -> subprocess.CompletedProcess:
    """Start the command, wait until ``out/marker`` (a glob) exists, then send ``how``; returns the finished process."""
    process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob(marker)):
        assert process.poll() is None, f"ended before {marker} appeared: {process.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{marker} never appeared"
        time.sleep(0.005)
    process.send_signal(how)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def assets(tmp_path_factory, ) -> Path:
    from transformers import BertTokenizer

    from conftest import SPECIAL, WORDS

    root = tmp_path_factory.mktemp("assets")
    torch.manual_seed(0)
    BertModel(tiny_bert_config(hidden_size=64, intermediate_size=128)).save_pretrained(root / "base")
    BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}).save_pretrained(root / "base")
    (root / "sst2").mkdir()
    rows = [f"{SENTENCES[i % len(SENTENCES)]} {SENTENCES[(7 * i) % len(SENTENCES)]}\t{i % 2}" for i in range(160)]
    (root / "sst2" / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (root / "sst2" / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:16]) + "\n")
    (root / "corpus.txt").write_text("\n".join(SENTENCES * 20) + "\n")
    (root / "vectors.txt").write_text("movie 1 0 0\nfilm 0.9 0.1 0\nstory 0 1 0\nplot 0.1 0.9 0\nwonderful 0 0 1\n"
                                      "great 0.1 0 0.9\n")
    config = {
        "task": {"name": "sst2", "data_dir": str(root / "sst2"), "max_seq_length": 32},
        "teacher": {"base_model": str(root / "base"), "min_dev_metric": -1.0, "train": STEPS},
        "mlm": {"base_model": str(root / "base"), "corpus": [str(root / "corpus.txt")], "max_seq_length": 16,
                "train": STEPS},
        "augment": {"num_copies": 4, "num_candidates": 3, "max_examples": 96, "shard_size": 8, "batch_size": 8,
                    "word_vectors": str(root / "vectors.txt")},
        "student": {"preset": None, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
                    "num_attention_heads": 2},
        "distill": {"intermediate": STEPS, "prediction": STEPS},
        "report": {"batch_sizes": [1], "seq_length": 16, "num_warmup": 1, "num_repeats": 1},
        "general": {"teacher": str(root / "base"), "corpus": [str(root / "corpus.txt")], "max_seq_length": 16,
                    "cache_dir": str(root / "general_cache"),
                    "student": {"preset": None, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
                                "num_attention_heads": 2},
                    "train": STEPS},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(config))
    return root


def _same_weights(a: Path, b: Path) -> None:
    first, second = load_file(a), load_file(b)
    assert first.keys() == second.keys(), a
    for name in first:
        assert torch.equal(first[name], second[name]), f"{a}: {name}"


def test_pipeline_killed_in_every_stage_ends_as_an_uninterrupted_run(assets, tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    _run("pipeline", "--config", str(assets / "job.yaml"), "--output-dir", str(reference))
    args = ["pipeline", "--config", str(assets / "job.yaml"), "--output-dir", str(killed)]
    # One kill inside each stage, in pipeline order; the last is a SIGTERM, which checkpoints and exits cleanly.
    for marker, stage, how in [("teacher/checkpoints/step-*", "teacher", signal.SIGKILL),
                               ("mlm/checkpoints/step-*", "mlm", signal.SIGKILL),
                               ("augmented/shards/shard-00000", "augmented", signal.SIGKILL),
                               ("student_intermediate/checkpoints/step-*", "student_intermediate", signal.SIGKILL),
                               ("student/checkpoints/step-*", "student", signal.SIGTERM)]:
        result = _interrupt_when(marker, args, killed, how)
        assert not (killed / stage / "stage.json").exists(), f"{stage} finished before the kill landed"
        if how == signal.SIGTERM:
            assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
            assert "interrupted: distill (prediction step): stopped by SIGTERM after step" in result.stderr
            assert "Re-run the same command to resume" in result.stderr
        else:
            assert result.returncode == -signal.SIGKILL
    _run(*args)
    for stage in ("teacher", "mlm", "student_intermediate", "student"):
        _same_weights(reference / stage / "model.safetensors", killed / stage / "model.safetensors")
    _same_weights(reference / "student_intermediate" / "projections.safetensors",
                  killed / "student_intermediate" / "projections.safetensors")
    rows = lambda out: datasets.concatenate_datasets(
        [datasets.load_from_disk(str(p)) for p in sorted((out / "augmented" / "shards").glob("shard-*"))]).to_list()
    assert rows(killed) == rows(reference)
    dev = lambda out: json.loads((out / "student" / "stage.json").read_text())["dev"]
    assert dev(killed) == dev(reference)
    # Each stage's record says whether the process that finished it resumed another's work (its time counts from there).
    resumed = lambda out: {stage: json.loads((out / stage / "stage.json").read_text())["resumed"]
                           for stage in ("teacher", "mlm", "augmented", "student_intermediate", "teacher_logits", "student")}
    assert not any(resumed(reference).values())
    assert resumed(killed) == {"teacher": True, "mlm": True, "augmented": True, "student_intermediate": True,
                               "teacher_logits": False, "student": True}


def test_general_distillation_killed_resumes_to_the_same_student(assets, tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    _run("distill", "--stage", "general", "--config", str(assets / "job.yaml"), "--output-dir", str(reference))
    args = ["distill", "--stage", "general", "--config", str(assets / "job.yaml"), "--output-dir", str(killed)]
    result = _interrupt_when("general/checkpoints/step-*", args, killed)
    assert result.returncode == -signal.SIGKILL and not (killed / "general" / "stage.json").exists()
    _run(*args)
    _same_weights(reference / "general" / "model.safetensors", killed / "general" / "model.safetensors")
    _same_weights(reference / "general" / "projections.safetensors", killed / "general" / "projections.safetensors")
