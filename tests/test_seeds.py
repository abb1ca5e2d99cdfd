"""One job over several seeds: each run seeded throughout, general distillation made once, and the summary's means,
spreads and retained shares computed from the runs' own records."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from transformers import BertTokenizer

import run_distill
from distill.config import load_config
from distill.publish.report import CHANCE_MARGIN
from distill.job.seeds import SEEDED_SECTIONS, plan_seeds, run_seeds, seeds_markdown, summarize
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage

ROOT = Path(__file__).resolve().parents[1]


def _report(teacher: dict, student: dict, seconds: dict, resumed: tuple = ()) -> dict:
    stages = {name: {"seconds": value, "resumed": name in resumed} for name, value in seconds.items()}
    return {"models": {"teacher": {"dev": teacher}, "student": {"dev": student}}, "timing": {"stage_seconds": stages}}


def test_summary_by_hand():
    summary = summarize({1: _report({"accuracy": 0.8}, {"accuracy": 0.76}, {"teacher": 60, "general": 600, "student": 120}),
                         2: _report({"accuracy": 0.9}, {"accuracy": 0.81}, {"teacher": 120, "student": 180}, ("student",))})
    runs = summary["runs"]
    assert [run["seed"] for run in runs] == [1, 2] and [run["resumed"] for run in runs] == [False, True]
    assert [run["retained"]["accuracy"] for run in runs] == [pytest.approx(0.95), pytest.approx(0.9)]
    retained = summary["over_seeds"]["retained"]["accuracy"]
    assert retained["mean"] == pytest.approx(0.925) and retained["std"] == pytest.approx(0.05 / math.sqrt(2))
    assert (retained["min"], retained["max"], retained["n"]) == (pytest.approx(0.9), pytest.approx(0.95), 2)
    assert summary["over_seeds"]["student"]["accuracy"]["mean"] == pytest.approx(0.785)
    # General distillation (made once, reused) is not part of a run's task time.
    assert [run["task_minutes"] for run in runs] == [3.0, 5.0]
    assert summary["over_seeds"]["task_minutes"]["mean"] == 4.0
    table = seeds_markdown(summary)
    assert "| mean ± sd | 0.8500 ± 0.0707 | 0.7850 ± 0.0354 | 92.5% ± 3.5% | 4.0 ± 1.4 |" in table
    assert "| range | 0.8000-0.9000 | 0.7600-0.8100 | 90.0%-95.0% | 3.0-5.0 |" in table
    assert "| 2 | 0.9000 | 0.8100 | 90.0% | 5.0 (resumed) |" in table


def test_retained_is_left_out_where_the_teacher_metric_is_not_positive():
    """A correlation can be 0 or negative: no ratio there, and the mean is over the runs that have one."""
    summary = summarize({1: _report({"pearson": 0.8}, {"pearson": 0.6}, {}),
                         2: _report({"pearson": -0.1}, {"pearson": 0.2}, {})})
    assert summary["runs"][1]["retained"]["pearson"] is None
    assert summary["over_seeds"]["retained"]["pearson"] == pytest.approx(
        {"mean": 0.75, "std": 0.0, "min": 0.75, "max": 0.75, "n": 1})
    assert summary["over_seeds"]["teacher"]["pearson"]["n"] == 2
    table = seeds_markdown(summary)
    assert "| 2 | -0.1000 | 0.2000 | - |" in table and "| 75.0% (n=1) |" in table


def test_a_run_whose_report_gives_no_share_at_chance_gives_none_to_the_mean_either():
    at_chance = _report({"accuracy": 0.684}, {"accuracy": 0.640}, {})
    at_chance["models"]["student"]["retained_note"] = "n/a — teacher at chance (0.684 = majority class 'equivalent')"
    summary = summarize({1: _report({"accuracy": 0.8}, {"accuracy": 0.76}, {}), 2: at_chance})
    assert summary["runs"][1]["retained"] == {"accuracy": None}
    assert summary["over_seeds"]["retained"]["accuracy"]["n"] == 1
    assert summary["over_seeds"]["retained"]["accuracy"]["mean"] == pytest.approx(0.95)
    table = seeds_markdown(summary)
    assert "| 2 | 0.6840 | 0.6400 | n/a |" in table and "| 95.0% (n=1) |" in table
    assert "Seed 2: retained n/a — teacher at chance" in table


def test_the_summary_shows_the_metrics_a_type_names_for_it_and_no_other_extra_key():
    """NER's F1 on unseen entities is averaged over seeds beside the headline metrics; a key no type names for the
    summary (the mention counts, a surface-form precision) stays in the reports only."""
    teacher = {"f1": 0.5, "f1_strict": 0.52, "unseen/f1": 0.4, "unseen/entities": 300.0, "surface/precision": 0.5}
    student = {"f1": 0.45, "f1_strict": 0.46, "unseen/f1": 0.3, "unseen/entities": 300.0, "surface/precision": 0.4}
    summary = summarize({1: _report(teacher, student, {}), 2: _report(teacher, {**student, "unseen/f1": 0.34}, {})})
    assert summary["metrics"] == ["f1", "f1_strict", "unseen/f1"]
    assert summary["over_seeds"]["retained"]["unseen/f1"]["mean"] == pytest.approx(0.8)
    assert "retained unseen/f1" in seeds_markdown(summary)


def test_one_seed_has_no_spread_rows():
    """One run has no standard deviation: the summary shows its row and says so, not "± 0"."""
    table = seeds_markdown(summarize({44: _report({"f1": 0.6571}, {"f1": 0.6382}, {"teacher": 600})}))
    assert "| 44 | 0.6571 | 0.6382 | 97.1% | 10.0 |" in table
    assert "±" not in table and "mean" not in table and "| range |" not in table
    assert "1 run of the same job" in table and "one run has no spread over seeds" in table


def test_every_run_is_seeded_throughout_and_shares_one_general_stage(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job_every_stage(tmp_path, tokenizer)
    job = yaml.safe_load(open(path))
    job["export"] = {"onnx": False}
    yaml.safe_dump(job, open(path, "w"))
    config = load_config(path)
    out = tmp_path / "run"
    # The dry run: every stage of both seeds to run, the general stage made by the first seed and reused by the second.
    plan = {row["stage"]: row for row in plan_seeds(config, [7, 8])}
    assert plan["seed 7: general"]["action"] == "run" and plan["seed 8: general"]["action"] == "reuse"
    assert plan["seed 8: general"]["note"] == "made by seed 7's run"
    assert plan["seed 7: general"]["run_id"] == plan["seed 8: general"]["run_id"]
    assert plan["seed 7: teacher"]["run_id"] != plan["seed 8: teacher"]["run_id"]  # seeded: another teacher
    assert plan["summary"]["folder"] == str(out / "seeds.md") and not out.exists()  # nothing written
    summary = run_seeds(config, [7, 8])
    # Afterwards the dry run finds both seeds finished (under the run ids it planned) and a third seed to run.
    again = {row["stage"]: row for row in plan_seeds(config, [7, 8, 9])}
    for stage, row in plan.items():
        if row["run_id"] is not None and row["action"] != "skip":
            assert again[stage]["action"] == "reuse" and again[stage]["run_id"] == row["run_id"], stage
    assert again["seed 9: teacher"]["action"] == "run" and again["seed 9: general"]["action"] == "reuse"
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
    # The summary is made of the runs' own records, and seeds.json holds it as returned.
    saved = json.loads((out / "seeds.json").read_text())
    assert saved == summary and [run["seed"] for run in saved["runs"]] == [7, 8]
    # Chance, from the dev labels themselves: the share of the most common one.
    labels = [line.split("\t")[-1] for line in (tmp_path / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    majority = max(labels.count(label) for label in set(labels)) / len(labels)
    for run in saved["runs"]:
        teacher, student = records[run["seed"]]["teacher"]["dev"], records[run["seed"]]["student"]["dev"]
        # A tiny model may be at chance: then the run's report gives no share, and neither does the summary.
        at_chance = min(teacher["accuracy"], student["accuracy"]) < majority + CHANCE_MARGIN
        note = json.loads((out / f"seed-{run['seed']}" / "report.json").read_text())["student"]["retained_note"]
        assert (note is not None) == at_chance, (note, teacher, student, majority)
        assert run["student"] == student and run["retained_note"] == note
        retained = None if at_chance else pytest.approx(student["accuracy"] / teacher["accuracy"])
        assert run["retained"]["accuracy"] == retained
    for role in ("teacher", "student"):
        mean = statistics.fmean(records[s][role]["dev"]["accuracy"] for s in (7, 8))
        assert saved["over_seeds"][role]["accuracy"]["mean"] == pytest.approx(mean)
    table = (out / "seeds.md").read_text()
    # the first column is the teacher's metric on the dev set's report half, then the whole dev set's
    teacher_means = [statistics.fmean(records[s]["teacher"]["dev"][m] for s in (7, 8))
                     for m in ("report/accuracy", "accuracy")]
    assert table.count("\n| 7 |") == 1 and "| mean ± sd | {:.4f} ± ".format(teacher_means[0]) in table
    assert "| {:.4f} ± ".format(teacher_means[1]) in table.split("| mean ± sd |")[1]


@pytest.mark.parametrize("flags, message", [(["--seeds", "1", "1"], "distinct seeds"),
                                           (["--seeds", "1", "1", "--dry-run"], "distinct seeds"),
                                           (["--set", "export.push_to_hub=me/student"], "one student per seed")])
def test_a_bad_seeds_run_is_refused_before_anything_runs(tmp_path, capsys, flags, message):
    code = run_distill.main(["seeds", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir",
                             str(tmp_path / "x"), *flags])
    assert code == 2 and message in capsys.readouterr().err
    assert not list((tmp_path / "x").glob("seed-*"))


MINUTES = r"(?:[0-9.]+ +|- +)?"  # the plan's estimated minutes, where the dry run could estimate them


def test_the_dry_run_prints_each_seeds_stages_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x"
    code = run_distill.main(["seeds", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(out),
                             "--seeds", "1", "2", "--dry-run"])
    printed = capsys.readouterr().out
    assert code == 0 and not out.exists()
    for seed in (1, 2):
        assert re.search(rf"^seed {seed}: teacher +run +{MINUTES}[0-9a-f]{{16}} +{re.escape(str(out / f'seed-{seed}'))}",
                         printed, re.M), printed
    assert re.search(rf"^summary +run +{MINUTES}- +{re.escape(str(out / 'seeds.md'))}$", printed, re.M)


def test_under_a_multi_process_launch_a_failing_seed_stops_the_command(tmp_path, monkeypatch):
    """One process failing alone cannot be kept in step with the others, so the command stops there."""
    import distill.job.seeds as seeds
    from teachers import ModelError

    ran = []

    def pipeline(config, device=None):
        ran.append(config.distill.prediction.seed)
        raise ModelError("the fine-tuned teacher scores accuracy 0.5000 on dev, at or below chance")

    monkeypatch.setattr(seeds, "run_pipeline", pipeline)
    monkeypatch.setenv("WORLD_SIZE", "2")  # this process: the main one of two
    out = tmp_path / "seeds"
    config = load_config(str(ROOT / "configs" / "smoke.yaml"), {"output_dir": str(out)})
    with pytest.raises(ModelError, match="at or below chance"):
        run_seeds(config, [42, 43])
    assert ran == [42] and not (out / "seeds.json").exists()


def test_a_failing_seed_does_not_stop_the_others_and_the_finished_ones_are_summarised(tmp_path, monkeypatch, capsys):
    import distill.job.seeds as seeds
    from teachers import ModelError

    ran = []

    def pipeline(config, device=None):  # the runs themselves are tested above; here only what a failure does
        seed = config.distill.prediction.seed
        ran.append(seed)
        if seed == 43:
            raise ModelError("the fine-tuned teacher scores accuracy 0.5000 on dev, at or below chance")
        return _report({"accuracy": 0.80}, {"accuracy": 0.78 + seed / 10000}, {"teacher": 60, "student": 120})

    monkeypatch.setattr(seeds, "run_pipeline", pipeline)
    out = tmp_path / "seeds"
    config = load_config(str(ROOT / "configs" / "smoke.yaml"), {"output_dir": str(out)})
    with pytest.raises(seeds.SeedsFailedError, match=r"1 of 3 seeds failed \(seed 43: ModelError: the fine-tuned"):
        run_seeds(config, [42, 43, 44])
    assert ran == [42, 43, 44]  # seed 44 ran after seed 43 failed
    saved = json.loads((out / "seeds.json").read_text())
    assert [run["seed"] for run in saved["runs"]] == [42, 44] and list(saved["failed"]) == ["43"]
    assert saved["over_seeds"]["student"]["accuracy"]["mean"] == pytest.approx(0.78 + 43 / 10000)
    assert "Seed 43 failed, not in the table: ModelError" in (out / "seeds.md").read_text()
    # The command prints the summary of the seeds that finished, names the failure and exits non-zero.
    code = run_distill.main(["seeds", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(out),
                             "--seeds", "42", "43"])
    captured = capsys.readouterr()
    assert code == 1 and "| 42 |" in captured.out and "seed 43: ModelError" in captured.err


def _benchmark(teacher: float, rows: dict[str, tuple[float, float]]) -> dict:
    """A benchmark report as run_benchmark writes it: the teacher first, then {name: (metric, latency at b32)}."""
    entries = []
    for name, (value, latency) in {"teacher": (teacher, 100.0), **rows}.items():
        entries.append({"name": name, "model": name.split(" ")[0], "variant": "int8" if "int8" in name else "pytorch",
                        "init": "pruned", "accuracy": value, "num_parameters": 1_000_000, "size_mb": 4.0,
                        "latency_ms": {"b1_t64": latency / 10, "b32_t64": latency},
                        "ratios": {"metric_retained": value / teacher, "faster_by": 100.0 / latency}})
    return {"rows": entries, "setup": {"task": "sst2", "metric": "accuracy", "throughput_at": "b32_t64",
                                       "num_threads": 2}}


def test_the_sweeps_summary_is_each_students_mean_and_spread_over_its_own_seeds_teachers(tmp_path):
    from distill.job.seeds import summarize_sweeps, sweeps_markdown
    from distill.publish.benchmark import plot_over_seeds

    reports = {42: _benchmark(0.90, {"small": (0.85, 20.0), "small int8": (0.84, 10.0)}),
               43: _benchmark(0.80, {"small": (0.78, 25.0), "small int8": (0.70, 12.0)}),
               44: _benchmark(0.85, {"small": (0.83, 22.0), "small int8": (0.80, 11.0), "late": (0.5, 5.0)})}
    summary = summarize_sweeps(reports)
    rows = {row["name"]: row for row in summary["rows"]}
    assert list(rows) == ["teacher", "small", "small int8", "late"] and summary["seeds"] == [42, 43, 44]
    shares = [0.85 / 0.90, 0.78 / 0.80, 0.83 / 0.85]  # each seed's student over that seed's teacher
    assert rows["small"]["retained"]["mean"] == pytest.approx(statistics.fmean(shares))
    assert rows["small"]["retained"]["std"] == pytest.approx(statistics.stdev(shares))
    assert rows["small"]["metric"]["mean"] == pytest.approx((0.85 + 0.78 + 0.83) / 3)
    assert (rows["small"]["faster_by"]["min"], rows["small"]["faster_by"]["max"]) == pytest.approx((4.0, 5.0))
    assert rows["small int8"]["per_seed"][43]["retained"] == pytest.approx(0.70 / 0.80)
    assert rows["teacher"]["retained"]["std"] == 0.0 and rows["late"]["metric"]["n"] == 1
    table = sweeps_markdown({**summary, "command": "python run_distill.py sweep --seeds 42 43 44"})
    line = next(line for line in table.splitlines() if line.startswith("| small |"))
    assert f"{100 * statistics.fmean(shares):.1f}% ± {100 * statistics.stdev(shares):.1f}%" in line
    assert "| 94.4, 97.5, 97.6 |" in line and "| 4.00-5.00x |" in line
    assert "| late |" in table and table.splitlines()[-1].endswith("--seeds 42 43 44`")
    late = next(line for line in table.splitlines() if line.startswith("| late |"))
    assert late.endswith("| -, -, 58.8 |")  # a student one seed has: the others' cells empty, its mean that seed's
    plot_over_seeds(summary, tmp_path / "seeds.png")
    assert (tmp_path / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tiny_sweep(tmp_path, **distill) -> str:
    """The tiny every-stage job (no general stage, no ONNX) with a quick benchmark and two one-layer students: one
    pruned from the teacher, one from random weights; ``distill`` updates its distill section."""
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    path = tiny_job_every_stage(tmp_path, tokenizer)
    job = yaml.safe_load(open(path))
    job["export"] = {"onnx": False}
    job["general"]["enabled"] = False
    job["distill"].update(distill)
    job["benchmark"] = {"batch_sizes": [1, 2], "seq_lengths": [8], "num_warmup": 1, "min_repeats": 2,
                        "max_repeats": 2, "compress": [], "memory": False}
    job["sweep"] = [{"name": "narrow", "student": {"preset": None, "num_hidden_layers": 1, "hidden_size": 16,
                                                    "intermediate_size": 32, "num_attention_heads": 2,
                                                    "init": "pruned"}},
                    {"name": "random", "student": {"preset": None, "num_hidden_layers": 1, "hidden_size": 16,
                                                    "intermediate_size": 32, "num_attention_heads": 2,
                                                    "init": "random"}}]
    yaml.safe_dump(job, open(path, "w"))
    return path


def test_a_sweeps_students_of_one_depth_share_one_teacher_output_cache(tmp_path, capsys, monkeypatch):
    import distill.job.stage_distill as stage_distill

    path, out = _tiny_sweep(tmp_path, teacher_cache="float16"), tmp_path / "sweep"
    builds = []
    build = stage_distill.build_teacher_cache
    monkeypatch.setattr(stage_distill, "build_teacher_cache",  # the folder it is given, and whether it holds a finished one
                        lambda *a, **k: builds.append((a[4], (a[4] / "stage.json").is_file())) or build(*a, **k))
    command = ["sweep", "--config", path, "--output-dir", str(out)]
    assert run_distill.main([*command, "--dry-run"]) == 0
    plan = {line.split()[0] + " " + line.split()[1]: line for line in capsys.readouterr().out.splitlines()
            if line.startswith(("narrow: teacher_outputs", "random: teacher_outputs"))}
    first, second = plan["narrow: teacher_outputs"].split(), plan["random: teacher_outputs"].split()
    assert first[2] == "run" and second[2] == "reuse" and first[3] == second[3]  # one run id, made by the first
    assert first[4] == second[4] == str(out / f"teacher_outputs-{first[3]}") and "made by narrow's run" in \
        plan["random: teacher_outputs"]
    assert run_distill.main(command) == 0
    shared = out / f"teacher_outputs-{first[3]}"
    assert builds == [(shared, False), (shared, True)]  # built by the first student, found finished by the second
    assert not list(out.glob("students/*/teacher_outputs")) and len(list(out.glob("teacher_outputs-*"))) == 1
    steps = [json.loads((out / "students" / name / "student_intermediate" / "stage.json").read_text())
             for name in ("narrow", "random")]
    assert steps[0]["teacher_cache"] == steps[1]["teacher_cache"] == first[3]


def test_a_sweep_over_seeds_runs_each_seeds_sweep_and_summarises_their_benchmarks(tmp_path, capsys):
    path = _tiny_sweep(tmp_path)
    out = tmp_path / "sweeps"
    command = ["sweep", "--config", path, "--output-dir", str(out), "--seeds", "7", "8"]
    assert run_distill.main([*command, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()  # the dry run wrote nothing
    for seed in (7, 8):
        for stage, folder in (("teacher", "teacher"), ("narrow: pruned", "students/narrow/pruned"),
                              ("random: student", "students/random/student")):
            assert re.search(rf"^seed {seed}: {stage} +run +{MINUTES}[0-9a-f]{{16}} +{re.escape(str(out / f'seed-{seed}' / folder))}",
                             printed, re.M), (stage, printed)
    assert re.search(rf"^summary +run +{MINUTES}- +{re.escape(str(out / 'seeds.md'))}$", printed, re.M)
    assert run_distill.main(command) == 0
    summary = json.loads((out / "seeds.json").read_text())
    benchmarks = {seed: json.loads((out / f"seed-{seed}" / "benchmark" / "benchmark.json").read_text())
                  for seed in (7, 8)}
    teachers = {seed: json.loads((out / f"seed-{seed}" / "teacher" / "stage.json").read_text()) for seed in (7, 8)}
    assert teachers[7]["run_id"] != teachers[8]["run_id"]  # each seed its own teacher
    rows = {row["name"]: row for row in summary["rows"]}
    assert list(rows) == ["teacher", "narrow", "random"] and summary["seeds"] == [7, 8]
    for name, row in rows.items():
        found = {seed: next(r for r in benchmarks[seed]["rows"] if r["name"] == name) for seed in (7, 8)}
        # the figure summarised is on the dev set's report half, as each benchmark reports it
        assert summary["metric"] == "report/accuracy"
        assert row["metric"]["mean"] == pytest.approx(statistics.fmean(found[s]["report/accuracy"] for s in (7, 8)))
        for seed in (7, 8):
            expected = None if found[seed]["retained_note"] else pytest.approx(  # a model at chance: no share
                found[seed]["report/accuracy"] / teachers[seed]["dev"]["report/accuracy"])
            assert row["per_seed"][str(seed)]["retained"] == expected
    assert (out / "seeds.png").is_file() and "| narrow | pytorch | pruned" in (out / "seeds.md").read_text()
    assert summary["failed"] == {} and summary["command"]  # the command line that ran it (here pytest's)
    # Run again: every stage of both seeds is reused and the summary is the same.
    assert run_distill.main(command) == 0
    again = json.loads((out / "seeds.json").read_text())
    assert [row["metric"] for row in again["rows"]] == [row["metric"] for row in summary["rows"]]
