"""One device decision, used by every stage.

CI has no GPU. The run's device is handed to the pipeline as ``cpu:0``: it computes like the CPU but is a different
``torch.device`` object from the plain ``cpu`` that a stage ignoring the decision would use, so spies on the compute
entry points (training, evaluation, the teacher-logit cache, the augmenter's masked LM and word-vector search) can
tell which device each was given. ``is_accelerator`` is patched to call ``cpu:0`` an accelerator where a test needs
the accelerator-only paths (the report's and the benchmark's accelerator timings).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from transformers import BertTokenizer

import augment.augmenter
import augment.vectors
import distill.publish.benchmark
import distill.tasks.evaluate
import distill.job.pipeline
import distill.job.stage_distill
import distill.job.stage_report
from distill.config import ConfigError, TrainConfig, load_config
from distill.tasks import get_task_type
from distill.tasks.evaluate import predict
from distill.method.objective import DistillationObjective, MaskedLMObjective, ModelLossObjective
from distill.method.trainer import train
from tests.conftest import SPECIAL, WORDS, tiny_bert, tiny_job_every_stage

ROOT = Path(__file__).resolve().parents[1]
FAKE = torch.device("cpu", 0)  # computes on the CPU; a different device object from torch.device("cpu")


class Spy:
    """Records the device each compute entry point was given, by name."""

    def __init__(self, monkeypatch):
        self.seen: dict[str, list[torch.device]] = {}
        self.monkeypatch = monkeypatch

    def record(self, name: str, device) -> None:
        self.seen.setdefault(name, []).append(torch.device(device))

    def wrap_function(self, module, attribute: str, name: str) -> None:
        original = getattr(module, attribute)

        def spy(*args, **kwargs):
            self.record(name, kwargs["device"])
            return original(*args, **kwargs)

        self.monkeypatch.setattr(module, attribute, spy)

    def wrap_to(self, cls, name: str) -> None:
        original = cls.to

        def spy(module, *args, **kwargs):
            self.record(name, args[0] if args else kwargs["device"])
            return original(module, *args, **kwargs)

        self.monkeypatch.setattr(cls, "to", spy)

    def wrap_init(self, cls, name: str) -> None:
        original = cls.__init__

        def spy(instance, *args, **kwargs):
            original(instance, *args, **kwargs)
            self.record(name, instance.device)

        self.monkeypatch.setattr(cls, "__init__", spy)


def test_every_pipeline_stage_runs_on_the_device_it_is_given(tmp_path, monkeypatch):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = load_config(tiny_job_every_stage(tmp_path, tokenizer))
    spy = Spy(monkeypatch)
    spy.wrap_function(distill.tasks.evaluate, "predict", "evaluation")  # evaluate / evaluate_task call it
    spy.wrap_function(distill.job.stage_distill, "predict", "teacher-logit cache")
    for cls, name in ((ModelLossObjective, "teacher fine-tuning"), (MaskedLMObjective, "adapt-mlm"),
                      (DistillationObjective, "distillation")):
        spy.wrap_to(cls, name)
    spy.wrap_init(augment.augmenter.CandidateGenerator, "augmentation masked LM")
    spy.wrap_init(augment.vectors.NeighbourCache, "word-vector search")
    # accelerator timings
    monkeypatch.setattr(distill.job.stage_report, "is_accelerator", lambda device: device == FAKE)
    report = distill.job.pipeline.run_pipeline(config, device=FAKE)

    assert set(spy.seen) == {"evaluation", "teacher-logit cache", "teacher fine-tuning", "adapt-mlm", "distillation",
                             "augmentation masked LM", "word-vector search"}
    for name, devices in spy.seen.items():
        assert devices and all(d == FAKE for d in devices), (name, devices)
    out = tmp_path / "run"
    for stage in ("teacher", "mlm", "augmented", "teacher_logits", "student_intermediate", "student"):
        assert json.loads((out / stage / "stage.json").read_text())["device"] == "cpu:0", stage
    # The report times on the CPU and, the run's device being an accelerator, there too.
    assert set(report["models"]["student"]["latency_ms"]) == {"batch_1", "cpu_batch_1"}
    assert "cpu batch 1" in (out / "report.md").read_text()


def test_training_refuses_a_device_of_another_type_than_accelerates(tmp_path):
    objective = ModelLossObjective(tiny_bert())
    with pytest.raises(ConfigError, match=r"asked to train on meta, but accelerate runs this process on cpu"):
        train(objective, datasets.Dataset.from_list([{"input_ids": [5, 6], "labels": 0}]), lambda rows: rows,
              TrainConfig(max_steps=1), tmp_path, "run", device=torch.device("meta"))
    assert not (tmp_path / "checkpoints").exists()


def test_evaluation_never_moves_a_model(tiny_tokenizer):
    model = tiny_bert().to("meta")
    encoded = datasets.Dataset.from_dict({"input_ids": [[2, 7, 3]], "attention_mask": [[1, 1, 1]]})
    with pytest.raises(ValueError, match=r"the model is on meta, the batches were asked on cpu"):
        predict(model, encoded, tiny_tokenizer, task_type=get_task_type("sequence_classification"), device="cpu")
    assert next(model.parameters()).device.type == "meta"
    with pytest.raises(TypeError, match="device"):  # no default: a caller must say where
        predict(tiny_bert(), encoded, tiny_tokenizer, task_type=get_task_type("sequence_classification"))


def test_the_benchmark_adds_accelerator_rows_evaluated_and_timed_there(tmp_path, monkeypatch):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    for name, model in {"teacher": tiny_bert(seed=0, num_hidden_layers=3), "small": tiny_bert(seed=1)}.items():
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    dev = datasets.Dataset.from_dict({"sentence": ["the movie was good", "a bad film"] * 3, "label": [1, 0] * 3})
    config = distill.publish.benchmark.BenchmarkConfig(batch_sizes=[2], seq_lengths=[8], num_warmup=1, min_repeats=2,
                                               max_repeats=2, compress=[], memory=False)
    spy = Spy(monkeypatch)
    spy.wrap_function(distill.publish.benchmark, "predict", "evaluation")
    monkeypatch.setattr(distill.publish.benchmark, "is_accelerator", lambda device: device == FAKE)
    report = distill.publish.benchmark.run_benchmark(tmp_path / "teacher", {"small": (tmp_path / "small", "random")},
                                             distill.tasks.data.get_task("sst2"), dev, config, tmp_path / "out", 16,
                                             device=FAKE)
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["teacher", "teacher (cpu)", "teacher (cpu-fp16)", "small", "small (cpu)", "small (cpu-fp16)"]
    assert spy.seen["evaluation"] == [torch.device("cpu"), FAKE, FAKE] * 2  # CPU rows stay on the CPU
    assert rows["small (cpu)"]["accuracy"] == rows["small"]["accuracy"]  # same weights, same predictions
    assert rows["small (cpu)"]["ratios"]["faster_by"] == pytest.approx(
        rows["teacher (cpu)"]["latency_ms"]["b2_t8"] / rows["small (cpu)"]["latency_ms"]["b2_t8"])
    assert rows["small (cpu-fp16)"]["size_mb"] == pytest.approx(rows["small"]["size_mb"] / 2)
    assert report["setup"]["accelerator"] == "cpu:0"


def test_general_distillation_trains_on_the_device_it_is_given(tmp_path, monkeypatch):
    from distill.config import GeneralConfig, StudentConfig
    from distill.job.general import run_general_distillation

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    encoder = tmp_path / "encoder"
    tiny_bert(seed=0).bert.save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie was good\na bad film\n\nthe plot was fun\n" * 4)
    spy = Spy(monkeypatch)
    spy.wrap_to(DistillationObjective, "distillation")
    config = GeneralConfig(teacher=str(encoder), corpus=[str(corpus)], max_seq_length=16,
                           student=StudentConfig(preset=None, num_hidden_layers=2, hidden_size=16, intermediate_size=32,
                                                 num_attention_heads=2, init="teacher_embeddings"),
                           train=TrainConfig(max_steps=2, batch_size=4))
    record = run_general_distillation(config, tmp_path / "general", device=FAKE)
    assert spy.seen["distillation"] == [FAKE] and record["device"] == "cpu:0"


# A machine whose accelerator is the meta device (what accelerate picks when the CPU is not asked for), in a fresh
# process: accelerate's state is made once per process.
SIMULATED_ACCELERATOR = """
import sys, torch, accelerate.state
accelerate.state.PartialState.default_device = property(lambda self: torch.device("meta"))
from distill.device import run_device
device = run_device()
if sys.argv[1] == "train":
    from accelerate import Accelerator
    Accelerator()  # the training loop's; it refuses a device other than the one the stages were handed
print(device)
"""


def _simulated(*, use_cpu: bool, then: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "ACCELERATE_USE_CPU"}
    env.update({"ACCELERATE_USE_CPU": "1"} if use_cpu else {})
    return subprocess.run([sys.executable, "-c", SIMULATED_ACCELERATOR, then], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_accelerate_use_cpu_hands_every_stage_the_cpu_on_an_accelerator_machine():
    """ACCELERATE_USE_CPU=1 (as `accelerate launch --cpu` sets) on a machine with an accelerator: the stages get the
    CPU, and the training loop's Accelerator agrees; without it, the accelerator."""
    forced = _simulated(use_cpu=True, then="train")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert forced.stdout.split()[-1] == "cpu"
    chosen = _simulated(use_cpu=False, then="stop")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.split()[-1] == "meta"
