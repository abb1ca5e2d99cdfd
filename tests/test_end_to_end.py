"""The real CLI on configs/smoke.yaml: real MiniLM weights, the bundled SST-2 sample, a few steps per stage."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "run_distill.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    start = time.time()
    result = _run("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    result.wall_seconds = time.time() - start
    return out, result


def test_report_has_teacher_and_student_numbers(smoke_run):
    out, result = smoke_run
    report = json.loads((out / "report.json").read_text())
    for name in ("teacher", "student"):
        entry = report[name]
        assert 0.0 <= entry["accuracy"] <= 1.0
        assert entry["num_parameters"] > 0 and entry["size_mb"] > 0 and entry["samples_per_s"] > 0
        assert entry["latency_ms"]["batch_1"] > 0 and entry["latency_ms"]["batch_8"] > 0
    assert report["teacher"]["num_parameters"] > 5 * report["student"]["num_parameters"]
    assert report["student"]["ratios"]["smaller_by"] == pytest.approx(
        report["teacher"]["num_parameters"] / report["student"]["num_parameters"])
    assert "| student |" in (out / "report.md").read_text()
    for stage in ("teacher", "mlm", "augmented", "student_intermediate", "student"):
        assert (out / stage / "stage.json").exists(), stage
    assert (out / "student_intermediate" / "projections.safetensors").exists()
    log = [json.loads(line) for line in (out / "student_intermediate" / "log.jsonl").read_text().splitlines()]
    assert {"loss/embedding", "loss/hidden", "loss/attention"} <= set(log[-1])


def test_report_gives_the_wall_time_of_every_stage_that_ran(smoke_run):
    out, result = smoke_run
    stages = json.loads((out / "report.json").read_text())["student"]["timing"]["stage_seconds"]
    assert list(stages) == ["teacher", "mlm", "augmented", "general", "student_intermediate", "teacher_logits", "student"]
    general = json.loads((out / "general.json").read_text())
    assert stages.pop("general")["seconds"] == general["seconds"]  # maybe made earlier
    # The general stage is kept in the suite's own cache (conftest), never in the user's ~/.cache.
    assert Path(general["folder"]).is_relative_to(os.environ["TINYDISTILL_CACHE"])
    for name, entry in stages.items():
        record = json.loads((out / name / "stage.json").read_text())
        assert entry == {"seconds": record["seconds"], "resumed": False} and entry["seconds"] >= 0, name
    assert stages["teacher"]["seconds"] > 0
    # Disjoint intervals of one process: together they fit in the command's own wall time.
    total = sum(entry["seconds"] for entry in stages.values())
    assert total < result.wall_seconds
    table = (out / "report.md").read_text()
    assert "| intermediate step |" in table and f"| task stages in all | {total / 60:.1f} |" in table


def test_saved_student_reloads_to_the_same_logits_and_runs_in_a_pipeline(smoke_run):
    out, _ = smoke_run
    report = json.loads((out / "report.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out / "student")
    model = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    again = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    # The dev accuracy recomputed from the reloaded checkpoint equals the one the pipeline recorded.
    lines = (ROOT / "distill" / "assets" / "sst2" / "dev.tsv").read_text().splitlines()[1:33]
    texts, labels = [l.split("\t")[0] for l in lines], np.array([int(l.split("\t")[1]) for l in lines])
    batch = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
        assert torch.equal(logits, again(**batch).logits)
    assert (logits.argmax(-1).numpy() == labels).mean() == pytest.approx(report["student"]["accuracy"])
    classify = pipeline("text-classification", model=str(out / "student"), device="cpu")
    prediction = classify("a charming and often affecting journey")[0]
    assert prediction["label"] in ("negative", "positive")


def test_rerun_skips_finished_stages(smoke_run):
    out, _ = smoke_run
    before = json.loads((out / "report.json").read_text())
    result = _run("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "teacher: done" in result.stderr and "student: done" in result.stderr
    assert "=== stage: teacher" not in result.stderr
    after = json.loads((out / "report.json").read_text())
    assert after["student"]["accuracy"] == before["student"]["accuracy"]


def test_a_changed_setting_reruns_only_the_stages_that_read_it(smoke_run, tmp_path):
    """`--set distill.temperature=2` on a finished run: the prediction step runs again (its old output kept under
    superseded/), every other stage is reused."""
    import shutil

    out, _ = smoke_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    old = json.loads((copy / "student" / "stage.json").read_text())["run_id"]
    result = _run("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(copy),
                  "--set", "distill.temperature=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "=== stage: task distillation, prediction step" in result.stderr
    for banner in ("teacher", "adapt-mlm", "augmentation", "task distillation, intermediate step"):
        assert f"=== stage: {banner} " not in result.stderr, banner
    assert (copy / "superseded" / f"student-{old}" / "model.safetensors").is_file()
    assert json.loads((copy / "student" / "stage.json").read_text())["run_id"] != old


def test_teacher_cache_runs_the_intermediate_step_from_cached_teacher_outputs(smoke_run, tmp_path):
    """`--set distill.teacher_cache=float16` on a finished run: the dry run lists the cache stage, then the job makes
    it (its size in the log, its time in the report) and runs the intermediate step again (its run id covers the
    setting), reusing the teacher and the augmented set; the teacher logits, made again, come from the cache's own
    forward pass."""
    import shutil

    out, _ = smoke_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "teacher_logits")
    old = json.loads((copy / "student_intermediate" / "stage.json").read_text())["run_id"]
    args = ("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(copy),
            "--set", "distill.teacher_cache=float16")
    plan = _run(*args, "--dry-run")
    assert plan.returncode == 0, plan.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1] for line in plan.stdout.splitlines() if len(line.split()) > 1}
    assert rows["teacher_outputs"] == "run" and rows["student_intermediate"] == "replace" and rows["teacher"] == "reuse"
    result = _run(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "=== stage: teacher -> " not in result.stderr and "=== stage: augmentation " not in result.stderr
    assert "teacher-output cache: " in result.stderr and " in float16 (" in result.stderr
    cache = json.loads((copy / "teacher_outputs" / "stage.json").read_text())
    assert cache["dtype"] == "float16" and cache["bytes"] > 0 and cache["seconds"] >= 0
    step = json.loads((copy / "student_intermediate" / "stage.json").read_text())
    assert step["run_id"] != old and step["teacher_cache"] == cache["run_id"]
    assert json.loads((copy / "teacher_logits" / "stage.json").read_text())["source"] == "teacher_outputs"
    assert "rows taken from the teacher-output cache" in result.stderr
    stages = json.loads((copy / "report.json").read_text())["student"]["timing"]["stage_seconds"]
    assert list(stages)[:5] == ["teacher", "mlm", "augmented", "general", "teacher_outputs"]
    assert "| teacher outputs (cached) |" in (copy / "report.md").read_text()
    again = _run(*args, "--dry-run")  # finished: the cache is reused with the step, or skipped
    rows = {line.split()[0]: line.split()[1] for line in again.stdout.splitlines() if len(line.split()) > 1}
    assert rows["teacher_outputs"] == "reuse" and rows["student_intermediate"] == "reuse"


def test_bad_input_gives_a_clear_error_and_no_traceback(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\textra\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    result = _run("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--data-dir", str(tmp_path),
                  "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "train.tsv, line 3: expected 2 tab-separated fields, found 3" in result.stderr
    assert "Traceback" not in result.stderr
    bad = (ROOT / "configs" / "smoke.yaml").read_text().replace("  num_copies: 3", "  num_copies: 3\n  word_vectors: /no/such/glove.txt")
    (tmp_path / "bad.yaml").write_text(bad)
    result = _run("pipeline", "--config", str(tmp_path / "bad.yaml"), "--output-dir", str(tmp_path / "out2"))
    assert result.returncode == 2
    assert "word vectors '/no/such/glove.txt' not found" in result.stderr
    assert not (tmp_path / "out2" / "teacher").exists()  # checked before any work is done


def test_same_config_and_seed_give_the_same_student(smoke_run, tmp_path):
    out, _ = smoke_run
    result = _run("pipeline", "--config", str(ROOT / "configs" / "smoke.yaml"), "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    for stage in ("teacher", "mlm", "student"):  # new heads and the student are drawn from a seeded RNG
        first = (out / stage / "model.safetensors").read_bytes()
        assert first == (tmp_path / stage / "model.safetensors").read_bytes(), stage


def test_sweep_distils_every_student_from_shared_stages_and_benchmarks_them(smoke_run, tmp_path, capsys):
    """`sweep` on the smoke run's teacher and augmented set: two students, then the benchmark over them and the
    smoke run's own student (benchmark.students). Its dry run, before and after, plans what the run does: the copied
    shared stages reused, each student's stages run in its own folder, then every stage reused."""
    import run_distill
    import shutil

    out, _ = smoke_run
    for stage in ("teacher", "mlm", "augmented", "teacher_logits"):
        shutil.copytree(out / stage, tmp_path / stage)
    sweep = (ROOT / "configs" / "smoke.yaml").read_text() + f"""
benchmark: {{batch_sizes: [1, 4], seq_lengths: [16], num_warmup: 1, min_repeats: 2, max_repeats: 3, compress: [],
            memory: false, students: ["{out}"]}}
sweep:
  - name: tiny-random
    student: {{preset: 2l-128, init: random}}
  - name: tiny-teacher-init
    student: {{preset: null, num_hidden_layers: 2, hidden_size: 384, intermediate_size: 1536, num_attention_heads: 12,
              init: teacher}}
    layer_map: [3, 6]
"""
    (tmp_path / "sweep.yaml").write_text(sweep)

    def plan() -> dict[str, tuple[str, str]]:
        capsys.readouterr()
        assert run_distill.main(["sweep", "--config", str(tmp_path / "sweep.yaml"), "--output-dir", str(tmp_path),
                                 "--dry-run"]) == 0
        table = capsys.readouterr().out.split("\n\n")[0].splitlines()[1:]  # the plan first
        rows = [re.split(r"\s{2,}", line, maxsplit=3) for line in table]  # stage, action, run id, folder (note)
        return {stage: (action, where.split(" (")[0]) for stage, action, _, where in rows}

    before = plan()
    assert {stage: before[stage][0] for stage in ("teacher", "mlm", "augmented", "teacher_logits")} == {
        "teacher": "reuse", "mlm": "reuse", "augmented": "reuse", "teacher_logits": "reuse"}
    for name in ("tiny-random", "tiny-teacher-init"):
        for step in ("student_intermediate", "student"):
            assert before[f"{name}: {step}"] == ("run", str(tmp_path / "students" / name / step))
    assert before["benchmark"][0] == "run" and not (tmp_path / "students").exists()  # the plan wrote nothing
    result = _run("sweep", "--config", str(tmp_path / "sweep.yaml"), "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "=== stage: teacher" not in result.stderr  # the shared stages were reused, not redone
    report = json.loads((tmp_path / "benchmark" / "benchmark.json").read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert list(rows) == ["teacher", "tiny-random", "tiny-teacher-init", out.name]
    # the smoke config's general stage is on: the student's random layers were general-distilled first (as its card
    # says), not started from random for the task
    assert rows["tiny-random"]["init"] == "general distillation start (random)"
    assert rows["tiny-teacher-init"]["init"] == "general distillation start (teacher layers ([3, 6]))"
    assert rows["tiny-random"]["num_parameters"] < rows["tiny-teacher-init"]["num_parameters"]
    for name in ("tiny-random", "tiny-teacher-init"):
        record = json.loads((tmp_path / "students" / name / "student" / "stage.json").read_text())
        assert rows[name]["accuracy"] == pytest.approx(record["dev"]["accuracy"])  # benchmark re-measured it
    assert (tmp_path / "benchmark" / "benchmark.png").exists() and "Traceback" not in result.stderr
    after = plan()
    assert {stage for stage, (action, _) in after.items() if action == "run"} == {"benchmark"}
    assert after["teacher_logits"][0] == "reuse"
    shutil.rmtree(tmp_path / "teacher_logits")  # every student finished: the shared logits are not needed
    assert plan()["teacher_logits"] == ("skip", "(every student is finished; the teacher logits are not needed)")
    assert all(after[f"{name}: {step}"][0] == "reuse" for name in ("tiny-random", "tiny-teacher-init")
               for step in ("student_intermediate", "student"))


def _readme_command(task: str) -> list[str]:
    from tests.test_first_contact import readme_smoke_commands

    return next(c for c in readme_smoke_commands() if c[0] == "pipeline" and task in c)


def _output_to(command: list[str], folder: Path) -> list[str]:
    """The README's command with its --output-dir moved from runs/ into a test folder."""
    command = list(command)
    command[command.index("--output-dir") + 1] = str(folder)
    return command


@pytest.fixture(scope="module")
def ner_smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_ner") / "run"
    result = _run(*_output_to(_readme_command("wnut_17"), out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_readmes_ner_smoke_run_and_its_benchmark_run_as_written(ner_smoke_run, tmp_path):
    """The README's token-classification smoke command (WNUT-17 from the shared data, augmentation on), then its
    benchmark command on the run's stage folders: the run's task and dev set, every variant, in about a minute."""
    from tests.test_first_contact import readme_smoke_commands

    report = json.loads((ner_smoke_run / "report.json").read_text())
    assert report["student"]["run"]["task"] == "wnut_17" and set(report["student"]) >= {"f1", "precision", "recall"}
    assert json.loads((ner_smoke_run / "augmented" / "stage.json").read_text())["num_augmented"] > 0
    (bench,) = [c for c in readme_smoke_commands() if c[0] == "benchmark"]
    bench = [a.replace("runs/smoke_ner", str(ner_smoke_run)) for a in bench]
    result = _run(*bench, "--output-dir", str(tmp_path / "bench"))
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((tmp_path / "bench" / "benchmark.json").read_text())
    assert (written["setup"]["task"], written["setup"]["metric"]) == ("wnut_17", "report/f1")  # the report half
    assert len(written["rows"]) == 8 and written["setup"]["time_budget_s"] == 20
    assert written["setup"]["timing_seconds"] < 45  # its 20 s budget, and a few slow rounds past it at most


def test_the_readmes_qa_smoke_run_runs_as_written(tmp_path):
    """The README's question-answering smoke command (SQuAD from the shared data; the smoke config's augmentation is
    off for QA): every stage, the reader's windows saved beside the student's weights."""
    out = tmp_path / "run"
    result = _run(*_output_to(_readme_command("squad"), out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["student"]["run"]["task"] == "squad" and set(report["student"]) >= {"f1", "exact_match"}
    assert not (out / "augmented").exists() and "=== stage: augmentation" not in result.stderr
    windows = json.loads((out / "student" / "config.json").read_text())["question_answering"]
    assert windows == {"max_seq_length": 32, "doc_stride": 10, "max_answer_length": 30}
    assert (out / "student" / "onnx" / "model.onnx").is_file()
