"""What ships with a student: a model card the hub reads, ONNX files that reproduce the PyTorch predictions, the upload."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizer

import run_distill
from distill.config import load_config
from distill.publish.export import OnnxClassifier
from distill.job.pipeline import run_pipeline
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
    # The fixture's dev set is a local folder of made-up sentences: the card does not claim GLUE's validation split.
    assert result.dataset_type == "sst2" and result.dataset_split == "dev" and card.data.datasets is None
    assert {"distillation", "tinybert"} <= set(card.data.tags) and card.data.license == "apache-2.0"
    assert card.data.base_model is None  # a local teacher has no hub id
    text = card.text
    assert "| teacher (" in text and "| student |" in text  # the report table
    assert "layer map (student 0..M -> teacher): [0, 1, 2]" in text and "general distillation start" in text
    assert "Data: local data folder (" in text and "): 12 train, 6 dev examples." in text
    assert "python run_distill.py pipeline --config job.yaml" in text
    assert "`onnx/model.onnx`" in text and "`onnx/model_quantized.onnx`" in text


def test_no_card_or_report_names_a_path_of_the_machine_that_made_it(finished):
    config, out = finished
    data_folder = str(Path(config.task.data_dir).resolve())
    for name in ("student/README.md", "report.md", "report.json"):
        text = (out / name).read_text()
        assert str(out.parent) not in text and data_folder not in text, name
    report = json.loads((out / "report.json").read_text())
    assert report["student"]["path"] == "student" and report["student"]["run"]["data"]["location"] == \
        Path(config.task.data_dir).name
    assert "Data: local data folder (" + Path(config.task.data_dir).name + "): 12 train, 6 dev examples." in \
        (out / "student" / "README.md").read_text()


def test_the_onnx_files_reproduce_the_pytorch_predictions(finished):
    config, out = finished
    folder = out / "student"
    record = json.loads((folder / "onnx" / "export.json").read_text())
    fp32 = record["files"]["model.onnx"]
    assert fp32["max_abs_logit_difference"] < 1e-4 and fp32["same_prediction"] == 1.0
    whole = {key: value for key, value in json.loads((folder / "stage.json").read_text())["dev"].items()
             if not key.startswith(("tuning/", "report/"))}  # the export scores the whole dev set
    assert fp32["dev"] == record["pytorch"]["dev"] == whole
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

    from distill.publish.benchmark import run_benchmark
    from distill.config import BenchmarkConfig
    from distill.tasks import get_task
    from distill.tasks.data import load_task_data

    config, out = finished
    student = tmp_path / "student"
    shutil.copytree(out / "student", student, ignore=shutil.ignore_patterns("onnx", "README.md"))
    args = ["export", "--student", str(student), "--int8", "--task", "sst2", "--data-dir", config.task.data_dir]
    assert run_distill.main(args) == 0
    assert (student / "onnx" / "model_quantized.onnx").is_file()
    assert "## Deployable files" in ModelCard.load(student / "README.md").text
    dev = load_task_data(config.task)["dev"]
    report = run_benchmark(out / "teacher", {"student": (student, "")}, get_task("sst2"), dev,
                           BenchmarkConfig(batch_sizes=[1], seq_lengths=[8], num_warmup=1, min_repeats=1,
                                           max_repeats=1, compress=["onnx", "onnx-int8"], memory=False),
                           tmp_path / "bench", 16)
    paths = {row["name"]: (tmp_path / "bench" / row["path"]).resolve() for row in report["rows"]}
    assert not any(Path(row["path"]).is_absolute() for row in report["rows"])  # no path of the machine that made it
    assert paths["student (onnx)"] == (student / "onnx" / "model.onnx").resolve()  # the student's own file
    assert paths["student (onnx-int8)"] == (student / "onnx" / "model_quantized.onnx").resolve()
    # New weights exported without int8: the int8 file of the old weights goes, it is not left to ship beside them.
    from safetensors.torch import load_file, save_file

    weights = load_file(student / "model.safetensors")
    name = next(iter(weights))
    save_file({**weights, name: weights[name] + 0.01}, student / "model.safetensors", metadata={"format": "pt"})
    assert run_distill.main(args[:3] + ["--no-int8"] + args[4:]) == 0
    assert (student / "onnx" / "model.onnx").is_file() and not (student / "onnx" / "model_quantized.onnx").exists()
    assert "model_quantized.onnx" not in ModelCard.load(student / "README.md").text


def test_the_card_lists_the_loss_weights_that_ran_and_not_the_relation_term(finished):
    """Finding 5 of issue 27: the relation term (weight 0, never run) was listed as 1.0."""
    config, out = finished
    text = ModelCard.load(out / "student" / "README.md").text
    assert ("loss weights (the terms that ran): {'embedding': 1.0, 'hidden': 1.0, 'attention': 1.0, "
            "'prediction': 1.0}; temperature 1.0") in text
    assert "relation" not in text
    assert json.loads((out / "student_intermediate" / "stage.json").read_text())["weights"] == {
        "embedding": 1.0, "hidden": 1.0, "attention": 1.0}


def test_the_card_gives_each_latency_with_its_spread_and_when_it_was_timed(finished):
    config, out = finished
    text = ModelCard.load(out / "student" / "README.md").text
    report = json.loads((out / "report.json").read_text())
    timing = report["student"]["latency"]["batch_1"]
    assert f"{timing['median']:.1f} ({timing['p10']:.1f}-{timing['p90']:.1f})" in text
    low, high = report["student"]["ratios"]["faster_by_range"]
    assert f"{report['student']['ratios']['faster_by']:.2f}x ({low:.2f}-{high:.2f}x)" in text
    assert "median (p10-p90) of 1 interleaved runs at sequence length 16" in text
    assert f"timed {report['student']['timing']['timed_at']}" in text


def _card(data=None, chance=None, teacher_dev=0.9, student_dev=0.85):
    from distill.publish.card import student_card
    from distill.tasks import get_task

    rows = [{"name": "teacher", "dev": {"accuracy": teacher_dev}, "retained": 1.0},
            {"name": "student", "dev": {"accuracy": student_dev}, "retained": student_dev / teacher_dev}]
    return student_card(name="s", spec=get_task("sst2"), teacher="t", rows=rows, recipe=["r"], command="c",
                        data=data, chance=chance)


def _source(kind, used=32, available=872):
    return {"kind": kind, "location": "somewhere", "num_examples": {"train": 100, "dev": used},
            "num_available": {"train": 100, "dev": available}, "description": f"{kind} data"}


def test_the_card_names_the_hub_split_only_for_the_data_that_was_used():
    """A subset of the hub's dev set is named as such ("validation[:32]", "first 32 of 872"); the bundled copy of
    GLUE's dev set is GLUE's; a local folder or no record does not claim the hub dataset."""
    (subset,) = ModelCard(str(_card(_source("hub")))).data.eval_results
    assert (subset.dataset_type, subset.dataset_split) == ("nyu-mll/glue", "validation[:32]")
    assert subset.dataset_name == "sst2 (dev, first 32 of 872 examples)"
    whole = ModelCard(str(_card(_source("bundled", 872)))).data
    assert whole.eval_results[0].dataset_split == "validation" and whole.datasets == ["nyu-mll/glue"]
    for data in (_source("local", 872), None):
        card = ModelCard(str(_card(data))).data
        assert card.datasets is None and card.eval_results[0].dataset_type == "sst2"
        assert card.eval_results[0].dataset_split == "dev"


def test_each_mnli_metric_is_filed_under_its_own_dev_set():
    from distill.publish.card import _eval_results
    from distill.tasks import get_task

    data = {"kind": "hub", "location": "glue/mnli", "num_examples": {"train": 100, "dev": 100, "dev_mismatched": 9832},
            "num_available": {"train": 392702, "dev": 9815, "dev_mismatched": 9832}}
    results = {r.metric_type: r for r in _eval_results(get_task("mnli"), {"accuracy": 0.8, "accuracy_mismatched": 0.81},
                                                       data)}
    assert results["accuracy"].dataset_split == "validation_matched[:100]"
    assert results["accuracy"].dataset_name == "mnli (dev, first 100 of 9815 examples)"
    assert results["accuracy_mismatched"].dataset_split == "validation_mismatched"
    assert results["accuracy_mismatched"].dataset_name == "mnli (dev, mismatched)"
    local = _eval_results(get_task("mnli"), {"accuracy_mismatched": 0.81}, {**data, "kind": "local"})
    assert (local[0].dataset_split, local[0].dataset_name) == ("dev_mismatched", "mnli (dev, mismatched, 9832 "
                                                                                 "examples)")


def test_a_teacher_or_student_at_chance_gets_no_retained_share_on_the_card():
    """Finding 2 of issue 27: "93.3% retained" was printed for a teacher at chance."""
    chance = {"metric": "accuracy", "value": 0.684, "basis": "majority class 'equivalent'"}
    text = _card(chance=chance, teacher_dev=0.684, student_dev=0.638).text
    assert text.count("n/a — teacher at chance (0.684 = majority class 'equivalent')") == 2 and "93.3%" not in text
    text = _card(chance=chance, teacher_dev=0.86, student_dev=0.70).text
    assert "| 100.0% |" in text
    assert "n/a — student within 0.05 of chance (0.700; chance 0.684 = majority class 'equivalent')" in text
    assert "| 94.2% |" in _card(chance=chance, teacher_dev=0.86, student_dev=0.81).text


def test_a_record_without_the_gold_label_entry_still_lists_the_term_its_run_id_says_ran(finished):
    """A prediction step recorded before its record named the hard-label term: the config (bound to the run id) says
    it ran, so the card lists it; without it, the card lists the soft term alone."""
    from distill.publish.card import ran_weights
    from distill.config import with_overrides

    config, _ = finished
    step1, step2 = {"weights": {"hidden": 1.0}}, {"weights": {"prediction": 1.0}}
    assert ran_weights(config, step1, step2) == {"hidden": 1.0, "prediction": 1.0}
    gold = with_overrides(config, {"distill.hard_label_weight": 0.5})
    assert ran_weights(gold, step1, step2) == {"hidden": 1.0, "prediction": 1.0, "hard_label": 0.5}
    assert ran_weights(gold, step1, {"weights": {"prediction": 1.0, "hard_label": 0.25}})["hard_label"] == 0.25


def test_the_gold_label_term_is_weighted_with_the_prediction_term_it_is_added_to():
    """The objective weights the whole prediction term, gold-label loss included: its effective weight is the
    product, and with the prediction term off it does not run."""
    from distill.method.objective import prediction_terms

    assert prediction_terms({}, 0.0) == {"prediction": 1.0}
    assert prediction_terms({"prediction": 0.5}, 1.0) == {"prediction": 0.5, "hard_label": 0.5}
    assert prediction_terms({"prediction": 0.0}, 1.0) == {"prediction": 0.0}


def test_the_card_says_how_many_examples_the_teacher_saw_and_whether_copies_were_made(finished):
    """The recipe lines read the stage records: the teacher's count (a task cap below its CPU share), the copies
    actually made (none when the training set fills the row budget), not the configured numbers alone."""
    from distill.publish.card import recipe_lines
    from distill.config import with_overrides

    config, out = finished
    record = json.loads((out / "teacher" / "stage.json").read_text())
    general = json.loads((out / "general.json").read_text())
    step1 = json.loads((out / "student_intermediate" / "stage.json").read_text())
    capped = with_overrides(config, {"teacher.max_train_examples_cpu": 8000})
    lines = recipe_lines(capped, {**record, "num_examples": 5000}, general, step1, 120, num_augmented=0)
    assert "the first 5,000 training examples" in lines[0] and "8,000" not in lines[0]
    assert lines[1] == ("no augmented copy made (the training set leaves no room under the augmentation budget); "
                        "120 training rows")
    lines = recipe_lines(config, {**record, "num_examples": 87599}, general, step1, 120, num_augmented=96)
    assert ", 87,599 training examples" in lines[0] and "the first" not in lines[0]
    augment = config.augment
    assert lines[1] == (f"augmentation (TinyBERT §3.3): N={augment.num_copies}, p={augment.replace_prob}, "
                        f"K={augment.num_candidates}; 120 training rows, 96 of them augmented copies")
    card = (out / "student" / "README.md").read_text()
    made = json.loads((out / "augmented" / "stage.json").read_text())["num_augmented"]
    assert f"{made} of them augmented copies" in card


def test_an_onnx_graph_that_ignores_padding_is_refused(tmp_path, monkeypatch):
    """The export's own check runs a padded probe too: a graph that computed as if every token were real (the trace
    of an all-ones mask can drop the masking) would give other logits there, and is refused."""
    import distill.publish.export as export
    from distill.tasks import get_task_type
    from tests.conftest import tiny_bert

    model = tiny_bert(seed=1, initializer_range=0.5)  # weights large enough for padding to move the logits
    kind = get_task_type("sequence_classification")
    assert export.export_onnx(model, tmp_path / "model.onnx", max_length=32, task_type=kind) < 1e-4
    real = export.OnnxClassifier

    class MaskBlind(real):
        def __call__(self, **inputs):
            return super().__call__(**{**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])})

    monkeypatch.setattr(export, "OnnxClassifier", MaskBlind)
    with pytest.raises(RuntimeError, match=r"model.onnx differs from the PyTorch model by"):
        export.export_onnx(model, tmp_path / "model.onnx", max_length=32, task_type=kind)


def test_the_card_gives_the_temperature_as_it_ran_and_none_for_regression(finished):
    from distill.publish.card import recipe_lines
    from distill.config import with_overrides

    config, out = finished
    record = json.loads((out / "teacher" / "stage.json").read_text())
    general = json.loads((out / "general.json").read_text())
    step1 = json.loads((out / "student_intermediate" / "stage.json").read_text())
    step2 = {"weights": {"prediction": 1.0}}
    squared = with_overrides(config, {"distill.temperature": 2.0, "distill.temperature_squared": True})
    assert recipe_lines(squared, record, general, step1, 10, step2)[-2].endswith(
        "'prediction': 1.0}; temperature 2.0 (loss × T²)")
    assert recipe_lines(config, record, general, step1, 10, step2)[-2].endswith("; temperature 1.0")
    assert "temperature" not in recipe_lines(squared, record, general, step1, 10, step2, temperature=False)[-2]


def test_the_benchmark_command_reads_the_config_the_teacher_was_made_with(finished, tmp_path, capsys):
    """Without --config, a pipeline folder's teacher is scored on that run's task and dev set, not on SST-2's."""
    config, out = finished
    sets = ["benchmark.batch_sizes=[1]", "benchmark.seq_lengths=[8]", "benchmark.num_warmup=1",
            "benchmark.min_repeats=1", "benchmark.max_repeats=1", "benchmark.memory=false"]
    args = ["benchmark", "--teacher", str(out), "--student", str(out), "--student", str(out / "student"),
            "--no-compress", "--output-dir", str(tmp_path / "bench")] + [a for s in sets for a in ("--set", s)]
    assert run_distill.main(args) == 0
    assert f"config: {out / 'config.json'}, the config the teacher was made with" in capsys.readouterr().err
    rows = {row["name"]: row for row in json.loads((tmp_path / "bench" / "benchmark.json").read_text())["rows"]}
    assert list(rows) == ["teacher", "run", "student"]
    student = json.loads((out / "student" / "stage.json").read_text())["dev"]["accuracy"]
    assert rows["run"]["accuracy"] == rows["student"]["accuracy"] == pytest.approx(student)  # the run's 6 dev examples


def test_a_benchmark_row_name_that_is_taken_gets_a_number():
    from distill.publish.benchmark import unique_name

    assert unique_name("student", {"teacher"}) == "student"
    assert unique_name("student", {"teacher", "student", "student_2"}) == "student_3"
    assert unique_name("teacher", {"teacher"}) == "teacher_2"


def test_the_benchmark_command_reads_the_runs_config_from_its_stage_folders(finished, tmp_path, capsys):
    """The folders a user names, RUN/teacher and RUN/student, lead to the run's config.json as the run folder does:
    the rows are scored on the run's 6 dev examples, not on the default job's 872."""
    config, out = finished
    sets = ["benchmark.batch_sizes=[1]", "benchmark.seq_lengths=[8]", "benchmark.num_warmup=1",
            "benchmark.min_repeats=1", "benchmark.max_repeats=1", "benchmark.memory=false"]
    args = ["benchmark", "--teacher", str(out / "teacher"), "--student", str(out / "student"), "--no-compress",
            "--output-dir", str(tmp_path / "bench")] + [a for s in sets for a in ("--set", s)]
    assert run_distill.main(args) == 0
    assert f"config: {out / 'config.json'}, the config the teacher was made with" in capsys.readouterr().err
    rows = {row["name"]: row for row in json.loads((tmp_path / "bench" / "benchmark.json").read_text())["rows"]}
    for stage in ("teacher", "student"):
        dev = json.loads((out / stage / "stage.json").read_text())["dev"]["accuracy"]
        assert rows[stage]["accuracy"] == pytest.approx(dev), stage
    # A teacher from elsewhere: the student's run still gives the config.
    shutil.copytree(out / "teacher", tmp_path / "teacher_copy")
    args[2] = str(tmp_path / "teacher_copy")
    assert run_distill.main(args) == 0
    assert f"config: {out / 'config.json'}, the config the student was made with" in capsys.readouterr().err


def test_the_run_folder_of_each_stage_folder_is_found(tmp_path, monkeypatch):
    from distill.publish.export import pipeline_folder_of

    run = tmp_path / "run"
    for stage in ("teacher", "student", "student_intermediate", "mlm"):
        (run / stage).mkdir(parents=True)
        (run / stage / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (run / "config.json").write_text(json.dumps({"task": {"name": "wnut_17"}, "teacher": {}, "student": {}}))
    for given in (run, run / "teacher", run / "student", run / "student_intermediate"):
        assert pipeline_folder_of(given) == run, given
    assert pipeline_folder_of(run / "mlm") is None  # not a model of the task
    assert pipeline_folder_of(tmp_path) is None
    monkeypatch.chdir(run / "student")
    assert pipeline_folder_of(Path(".")) == run


def test_a_sweep_students_folder_leads_to_the_sweeps_config(tmp_path):
    from distill.publish.export import pipeline_folder_of

    run = tmp_path / "sweep"
    (run / "students" / "4l-312" / "student").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": {"name": "mrpc"}, "teacher": {}, "student": {},
                                                 "sweep": [{"name": "4l-312"}]}))
    assert pipeline_folder_of(run / "students" / "4l-312") == run
    assert pipeline_folder_of(run / "students" / "4l-312" / "student") == run
    (run / "students" / "other" / "student").mkdir(parents=True)  # not an entry of this sweep
    assert pipeline_folder_of(run / "students" / "other") is None
