"""The one table of stages (distill/job/table.py): the run, the dry run and the sweep walk it, so a step added to it is
run and planned in its place by each; the report's stage times list the folders its steps name."""

from __future__ import annotations

import json

import yaml
from transformers import BertTokenizer

import distill.job.table as table
from distill.config import load_config
from distill.job.pipeline import plan_pipeline, plan_sweep, run_pipeline
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage


def _with_fake_step(monkeypatch, ran: list) -> None:
    """:data:`distill.job.table.TABLE` with a step "fake" after the student's prediction step: its run writes
    ``fake.json`` beside the student (the student's run id, which the steps before it left on the job) and its plan one
    row."""

    def run(job):
        ran.append(job.student_dir)
        (job.student_dir / "fake.json").write_text(json.dumps({"student": job.student["run_id"]}))

    def plan(job, rows):
        rows.add("fake", job.student_dir / "fake.json", None if rows.ids["student"] is None else "fake-id")

    steps = list(table.TABLE)
    where = next(index for index, step in enumerate(steps) if step.name == "student") + 1
    steps.insert(where, table.Step("fake", table.STUDENT, run, plan, lambda config: ["fake"]))
    monkeypatch.setattr(table, "TABLE", steps)


def test_a_step_added_to_the_table_is_planned_and_run_in_its_place(tmp_path, monkeypatch):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job_every_stage(tmp_path, tokenizer)
    job = yaml.safe_load(open(path))
    job["export"] = {"onnx": False}
    job["sweep"] = [{"name": "one", "student": {"preset": None, "num_hidden_layers": 1, "hidden_size": 16,
                                                 "intermediate_size": 32, "num_attention_heads": 2}},
                    {"name": "two", "student": {"preset": None, "num_hidden_layers": 1, "hidden_size": 16,
                                                 "intermediate_size": 32, "num_attention_heads": 2, "init": "random"}}]
    yaml.safe_dump(job, open(path, "w"))
    config = load_config(path)
    ran: list = []
    _with_fake_step(monkeypatch, ran)

    stages = [row["stage"] for row in plan_pipeline(config)]
    assert stages[stages.index("student") + 1] == "fake" and stages[-2:] == ["report", "export"]
    sweep = [row["stage"] for row in plan_sweep(config)]
    assert [stage for stage in sweep if stage.endswith("fake")] == ["one: fake", "two: fake"]
    assert sweep.index("one: fake") == sweep.index("one: student") + 1

    report = run_pipeline(config)
    out = tmp_path / "run"
    assert ran == [out]  # once, after the student, before the report
    student = json.loads((out / "student" / "stage.json").read_text())
    assert json.loads((out / "fake.json").read_text()) == {"student": student["run_id"]}
    assert report["models"]["student"]["dev"]  # the report, after it, still ran
    assert "fake" in table.stage_folders(config)


def test_the_reports_stage_folders_follow_the_skip_rules():
    config = load_config("smoke.yaml")
    assert table.stage_folders(config)[:3] == ["teacher", "mlm", "augmented"]
    from distill.config import with_overrides

    given = with_overrides(config, {"mlm.model": "minilm"})  # a masked LM given: none adapted, no mlm folder
    assert "mlm" not in table.stage_folders(given) and "augmented" in table.stage_folders(given)
    off = with_overrides(config, {"augment.enabled": False})
    assert table.stage_folders(off)[:2] == ["teacher", "general"]
    cached = with_overrides(config, {"distill.teacher_cache": "float16", "student.init": "pruned"})
    folders = table.stage_folders(cached)
    assert folders.index("pruned") < folders.index("teacher_outputs") < folders.index("student_intermediate")
