"""What ships with a student: a model card the hub reads, ONNX files that reproduce the PyTorch predictions, the upload."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizer

import run_distill
from distill.config import load_config
from distill.export import OnnxClassifier
from distill.pipeline import run_pipeline
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("card")
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = load_config(tiny_job_every_stage(tmp_path, tokenizer))
    run_pipeline(config, command="python run_distill.py pipeline --config job.yaml")
    return config, tmp_path / "run"


def test_the_student_folder_has_a_card_the_hub_reads_back_with_its_metrics(finished):
    config, out = finished
    card = ModelCard.load(out / "student" / "README.md")
    record = json.loads((out / "student" / "stage.json").read_text())
    (result,) = card.data.eval_results
    assert result.metric_type == "accuracy" and result.metric_value == round(record["dev"]["accuracy"], 4)
    assert result.dataset_type == "nyu-mll/glue" and result.dataset_config == "sst2"
    assert {"distillation", "tinybert"} <= set(card.data.tags) and card.data.license == "apache-2.0"
    assert card.data.base_model is None  # a local teacher has no hub id
    text = card.text
    assert "| teacher (" in text and "| student |" in text  # the report table
    assert "layer map (student 0..M -> teacher): [0, 1, 2]" in text and "general distillation start" in text
    assert "python run_distill.py pipeline --config job.yaml" in text
    assert "`onnx/model.onnx`" in text and "`onnx/model_quantized.onnx`" in text


def test_the_onnx_files_reproduce_the_pytorch_predictions(finished):
    config, out = finished
    folder = out / "student"
    record = json.loads((folder / "onnx" / "export.json").read_text())
    fp32 = record["files"]["model.onnx"]
    assert fp32["max_abs_logit_difference"] < 1e-4 and fp32["same_prediction"] == 1.0
    assert fp32["dev"] == record["pytorch"]["dev"] == json.loads((folder / "stage.json").read_text())["dev"]
    assert record["files"]["model_quantized.onnx"]["size_mb"] < fp32["size_mb"]
    # The folder is deployable as it is: tokenizer and config beside the graphs.
    tokenizer = AutoTokenizer.from_pretrained(folder / "onnx")
    batch = tokenizer(["the movie was good", "a bad film"], padding=True, return_tensors="pt")
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model(**batch).logits.numpy()
    got = OnnxClassifier(folder / "onnx" / "model.onnx")(**batch).logits.numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_the_general_distilled_encoder_has_its_card(finished):
    config, out = finished
    general = json.loads((out / "general.json").read_text())
    card = ModelCard.load(f"{general['folder']}/README.md")
    assert "general distillation" in card.text and "distillation" in card.data.tags


def test_push_to_hub_uploads_the_folder_with_its_card_and_not_the_working_files(finished, monkeypatch):
    import huggingface_hub

    calls = []

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, exist_ok=False):
            calls.append(("create_repo", repo_id, exist_ok))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    config, out = finished
    run_pipeline(dataclasses.replace(config, export=dataclasses.replace(config.export, push_to_hub="me/student")))
    assert calls[0] == ("create_repo", "me/student", True)
    upload = calls[1][1]
    assert upload["repo_id"] == "me/student" and upload["folder_path"] == str(out / "student")
    assert {"checkpoints/*", "stage.json", "log.jsonl"} <= set(upload["ignore_patterns"])


def test_the_export_command_writes_the_files_and_the_benchmark_times_them(finished, tmp_path):
    import shutil

    from distill.benchmark import run_benchmark
    from distill.config import BenchmarkConfig
    from distill.data import get_task, load_task_data

    config, out = finished
    student = tmp_path / "student"
    shutil.copytree(out / "student", student, ignore=shutil.ignore_patterns("onnx", "README.md"))
    args = ["export", "--student", str(student), "--int8", "--task", "sst2", "--data-dir", config.task.data_dir,
            "--output-dir", str(tmp_path / "log")]
    assert run_distill.main(args) == 0
    assert (student / "onnx" / "model_quantized.onnx").is_file()
    assert "## Deployable files" in ModelCard.load(student / "README.md").text
    dev = load_task_data(config.task)["dev"]
    report = run_benchmark(out / "teacher", {"student": (student, "")}, get_task("sst2"), dev,
                           BenchmarkConfig(batch_sizes=[1], seq_lengths=[8], num_warmup=1, min_repeats=1,
                                           max_repeats=1, compress=["onnx", "onnx-int8"], memory=False),
                           tmp_path / "bench", 16)
    paths = {row["name"]: row["path"] for row in report["rows"]}
    assert paths["student (onnx)"] == str(student / "onnx" / "model.onnx")  # the student's own file, not a new one
    assert paths["student (onnx-int8)"] == str(student / "onnx" / "model_quantized.onnx")
