"""Run ids derived from what each stage reads: a changed field re-runs the stages that read it and the ones after
them, and reuses the rest; a stage cannot read a field it does not declare."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from transformers import BertTokenizer

from distill.config import load_config
from distill.pipeline import run_pipeline
from distill.stages import STAGES, UndeclaredFieldError
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage

STAGE_FOLDERS = ("teacher", "mlm", "augmented", "teacher_logits", "student_intermediate", "student")


def _markers(out) -> dict[str, tuple[str, int]]:
    """Each stage's run id and when its stage.json was written."""
    return {stage: (json.loads((out / stage / "stage.json").read_text())["run_id"],
                    (out / stage / "stage.json").stat().st_mtime_ns) for stage in STAGE_FOLDERS}


def _changed(before: dict, after: dict) -> set[str]:
    return {stage for stage in STAGE_FOLDERS if before[stage] != after[stage]}


@pytest.fixture
def finished_run(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = load_config(tiny_job_every_stage(tmp_path, tokenizer))
    run_pipeline(config)
    return config, tmp_path / "run"


def test_the_teacher_keeps_its_best_scored_weights(finished_run):
    config, out = finished_run
    record = json.loads((out / "teacher" / "stage.json").read_text())
    selection = record["selection"]
    assert selection["metric"] == "accuracy" and [step for step, _ in selection["evaluations"]] == [2]
    assert record["dev"]["accuracy"] == pytest.approx(selection["evaluations"][0][1])
    assert not (out / "teacher" / "best").exists()  # kept until the stage is done, then removed
    # The report says what was kept against what plain fine-tuning (the last step) gives.
    report = (out / "report.md").read_text()
    value = selection["evaluations"][0][1]
    assert f"step 2: {value:.4f}" in report and f"the best, step 2 ({value:.4f}), is kept" in report
    assert json.loads((out / "report.json").read_text())["teacher"]["selection"] == selection


def test_a_new_temperature_reruns_the_prediction_step_only(finished_run):
    config, out = finished_run
    before = _markers(out)
    old_student = before["student"][0]
    run_pipeline(dataclasses.replace(config, distill=dataclasses.replace(config.distill, temperature=2.0)))
    after = _markers(out)
    assert _changed(before, after) == {"student"}
    # The replaced output is kept, not deleted.
    kept = out / "superseded" / f"student-{old_student}"
    assert json.loads((kept / "stage.json").read_text())["run_id"] == old_student
    assert (kept / "model.safetensors").is_file()


def test_new_augmentation_settings_rerun_augmentation_and_what_follows(finished_run):
    config, out = finished_run
    before = _markers(out)
    run_pipeline(dataclasses.replace(config, augment=dataclasses.replace(config.augment, num_copies=3)))
    assert _changed(before, _markers(out)) == {"augmented", "teacher_logits", "student_intermediate", "student"}


def test_speed_only_settings_rerun_nothing(finished_run):
    config, out = finished_run
    before = _markers(out)
    run_pipeline(dataclasses.replace(config, augment=dataclasses.replace(config.augment, batch_size=7)))
    assert _changed(before, _markers(out)) == set()


def test_a_stage_cannot_read_a_field_it_does_not_declare():
    config = load_config(None)
    view = STAGES["student"].view(config)
    assert view.distill.temperature == 1.0  # declared
    assert view.distill.prediction.learning_rate == config.distill.prediction.learning_rate  # inside a declared section
    assert view.distill.weights.get("prediction", 1.0) == 1.0
    for read in (lambda: view.distill.layer_map, lambda: view.teacher, lambda: view.distill.weights.get("hidden")):
        with pytest.raises(UndeclaredFieldError, match=r"stage 'student' read config field 'distill\.|'teacher'"):
            read()


def test_run_ids_follow_the_declared_fields_and_inputs():
    config = load_config(None)
    spec = STAGES["student_intermediate"]
    inputs = {"teacher": "t", "augmented": "a", "general": "g"}
    base = spec.run_id(config, inputs)
    assert spec.run_id(dataclasses.replace(config, distill=dataclasses.replace(config.distill, temperature=3.0)),
                       inputs) == base
    assert spec.run_id(dataclasses.replace(config, distill=dataclasses.replace(config.distill, layer_map="last")),
                       inputs) != base
    assert spec.run_id(config, {**inputs, "teacher": "t2"}) != base
    assert spec.run_id(config, {**inputs, "general": "g2"}) != base


def test_the_general_stage_is_made_once_and_reused_by_another_output_folder(finished_run):
    """The general-distilled student lives in the cache, keyed by teacher, student shape, corpus and settings: a second
    output folder of the same job (or another task) starts from it without making it again."""
    config, out = finished_run
    general = json.loads((out / "general.json").read_text())
    marker = json.loads((out / "student_intermediate" / "stage.json").read_text())
    assert marker["start"] == general["folder"] and general["steps"] == 2
    made = (Path(general["folder"]) / "stage.json").stat().st_mtime_ns
    other = dataclasses.replace(config, output_dir=str(out.parent / "other"))
    run_pipeline(other)
    assert json.loads((out.parent / "other" / "general.json").read_text())["run_id"] == general["run_id"]
    assert (Path(general["folder"]) / "stage.json").stat().st_mtime_ns == made
    # A new student shape is another general stage.
    shape = dataclasses.replace(config.student, hidden_size=8, intermediate_size=16)
    run_pipeline(dataclasses.replace(other, student=shape))
    assert json.loads((out.parent / "other" / "general.json").read_text())["run_id"] != general["run_id"]
