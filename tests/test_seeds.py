"""One job over several seeds: each run seeded throughout, general distillation made once, and the summary's means,
spreads and retained shares computed from the runs' own records."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import yaml
from safetensors.torch import load_file
from transformers import BertTokenizer

import run_distill
from distill.config import load_config
from distill.seeds import SEEDED_SECTIONS, run_seeds, summarize
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage


def _report(teacher: float, student: float, seconds: dict) -> dict:
    return {"models": {"teacher": {"dev": {"accuracy": teacher}}, "student": {"dev": {"accuracy": student}}},
            "timing": {"stage_seconds": seconds}}


def test_summary_by_hand():
    summary = summarize({1: _report(0.8, 0.76, {"teacher": 60, "general": 600, "student": 120}),
                         2: _report(0.9, 0.81, {"teacher": 120, "student": 180})})
    assert summary["runs"][1]["retained"]["accuracy"] == pytest.approx(0.95)
    assert summary["runs"][2]["retained"]["accuracy"] == pytest.approx(0.9)
    retained = summary["over_seeds"]["retained"]["accuracy"]
    assert retained["mean"] == pytest.approx(0.925) and retained["std"] == pytest.approx(0.05 / math.sqrt(2))
    assert (retained["min"], retained["max"]) == (pytest.approx(0.9), pytest.approx(0.95))
    assert summary["over_seeds"]["student"]["accuracy"]["mean"] == pytest.approx(0.785)
    # General distillation (made once, reused) is not part of a run's task time.
    assert [run["task_minutes"] for run in summary["runs"].values()] == [3.0, 5.0]
    assert summary["over_seeds"]["task_minutes"]["mean"] == 4.0


def test_every_run_is_seeded_throughout_and_shares_one_general_stage(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job_every_stage(tmp_path, tokenizer)
    job = yaml.safe_load(open(path))
    job["export"] = {"onnx": False}
    yaml.safe_dump(job, open(path, "w"))
    config = load_config(path)
    summary = run_seeds(config, [7, 8])
    out = tmp_path / "run"
    records = {}
    for seed in (7, 8):
        run = out / f"seed-{seed}"
        saved = json.loads((run / "config.json").read_text())
        for section in SEEDED_SECTIONS:
            node = saved
            for part in section.split("."):
                node = node[part]
            assert node["seed"] == seed, section
        assert saved["general"]["train"]["seed"] == config.general.train.seed
        records[seed] = {name: json.loads((run / name / "stage.json").read_text()) for name in ("teacher", "student")}
        records[seed]["general"] = json.loads((run / "general.json").read_text())["folder"]
    assert records[7]["general"] == records[8]["general"]  # one general stage, reused
    assert len(list((tmp_path / "cache").glob("*/stage.json"))) == 1
    weights = [load_file(out / f"seed-{seed}" / "student" / "model.safetensors") for seed in (7, 8)]
    assert any(not (weights[0][k] == weights[1][k]).all() for k in weights[0])  # other seeds, other students
    # The summary is made of the runs' own records.
    for seed in (7, 8):
        teacher, student = records[seed]["teacher"]["dev"], records[seed]["student"]["dev"]
        assert summary["runs"][seed]["retained"]["accuracy"] == pytest.approx(student["accuracy"] / teacher["accuracy"])
    mean = statistics.fmean(records[s]["student"]["dev"]["accuracy"] for s in (7, 8))
    assert summary["over_seeds"]["student"]["accuracy"]["mean"] == pytest.approx(mean)
    assert json.loads((out / "seeds.json").read_text())["over_seeds"] == json.loads(json.dumps(summary["over_seeds"]))
    table = (out / "seeds.md").read_text()
    assert table.count("\n| 7 |") == 1 and f"| mean ± sd | {summary['over_seeds']['teacher']['accuracy']['mean']:.4f}" in table


def test_a_seed_given_twice_is_refused_before_anything_runs(tmp_path, capsys):
    code = run_distill.main(["seeds", "--config", "configs/smoke.yaml", "--output-dir", str(tmp_path / "x"),
                             "--seeds", "1", "1"])
    assert code == 2 and "distinct seeds" in capsys.readouterr().err
    assert not (tmp_path / "x" / "seed-1").exists()
