"""report.json / report.md: latency with its spread, "faster by" with its range, a warning on noisy timing, no
retained share for a model at chance, what was run (task, data, config), and a re-run that reuses the timing of the
same models. Structure and logic only: no test depends on how fast anything runs."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import run_distill
from distill.config import ReportConfig
from distill.tasks import get_task_type
from distill.publish.report import build_report, latency_summary, write_report
from tests.conftest import tiny_bert, tiny_job
from tests.glue_fixtures import write_glue_folder

RUN = {"task": "mrpc", "config": "/runs/mrpc/config.json",
       "data": {"kind": "hub", "location": "glue/mrpc", "num_examples": {"train": 3668, "dev": 32},
                "num_available": {"train": 3668, "dev": 408},
                "description": "the hub (glue/mrpc): 3668 train, first 32 of 408 dev examples"}}
MAJORITY = {"metric": "accuracy", "value": 279 / 408, "basis": "majority class 'equivalent'"}


def _entry(accuracy: float, median: float, p10: float, p90: float) -> dict:
    return {"dev": {"accuracy": accuracy}, "num_parameters": 1000, "num_parameters_without_embeddings": 800,
            "size_mb": 1.0, "samples_per_s": 10.0, "path": "somewhere",
            "latency_ms": {"batch_1": {"median": median, "p10": p10, "p90": p90, "spread": (p90 - p10) / median}}}


def _report(teacher_accuracy: float, student_accuracy: float, student_timing=(2.0, 1.9, 2.1)) -> dict:
    entries = {"teacher": _entry(teacher_accuracy, 10.0, 9.0, 11.0), "student": _entry(student_accuracy, *student_timing)}
    return build_report(entries, ReportConfig(batch_sizes=[1], num_repeats=5), chance=MAJORITY, run=RUN,
                        timed={"timed_at": "2026-11-25T10:00:00+00:00", "reused": False})


def test_latency_summary_gives_median_p10_p90_and_spread():
    summary = latency_summary([float(x) for x in range(1, 12)])  # 1..11 ms
    assert summary == {"median": 6.0, "p10": 2.0, "p90": 10.0, "spread": pytest.approx(8 / 6)}
    assert latency_summary([4.0]) == {"median": 4.0, "p10": 4.0, "p90": 4.0, "spread": 0.0}


def test_timing_at_its_own_thread_count_puts_the_previous_count_back():
    """A report timed at one thread must not leave the stages after it (the next seed's training) on one thread."""
    from distill.publish.report import time_models

    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    timed = time_models({"tiny": tiny_bert()}, ReportConfig(batch_sizes=[1], seq_length=8, num_warmup=0,
                                                           num_repeats=2, num_threads=wanted),
                        task_type=get_task_type("sequence_classification"))
    assert timed["tiny"]["latency_ms"]["batch_1"]["median"] > 0
    assert torch.get_num_threads() == before


def test_faster_by_comes_with_its_range_and_report_md_says_task_data_and_config(tmp_path):
    report = _report(0.86, 0.84)
    ratios = report["models"]["student"]["ratios"]
    assert ratios["faster_by"] == 5.0 and ratios["faster_by_range"] == pytest.approx([9.0 / 2.1, 11.0 / 1.9])
    write_report(report, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# Report: mrpc\n\n- task: mrpc\n- data: the hub (glue/mrpc): 3668 train, first 32 of 408 "
                           "dev examples\n- config: /runs/mrpc/config.json\n")
    assert "| 2.0 (1.9-2.1) |" in text and f"| 5.00x ({9 / 2.1:.2f}-{11 / 1.9:.2f}x) |" in text
    assert "| 97.7% |" in text and "noisy" not in text
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["student"]["run"] == RUN and saved["student"]["latency"]["batch_1"]["p10"] == 1.9


def test_a_large_spread_is_a_warning_in_the_log_and_in_report_md(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="distill.publish.report"):
        report = _report(0.86, 0.84, student_timing=(2.0, 1.0, 4.0))  # (4 - 1) / 2 = 1.5 > 0.25
    assert any("latency spread is large: student batch 1: 2.0 ms, p10-p90 1.0-4.0 (spread 1.50)" in r.getMessage()
               for r in caplog.records)
    write_report(report, tmp_path)
    assert "**Warning: noisy timing.** The spread (p90 - p10) / median is above 0.25 for student batch 1" in \
        (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("teacher, student, note", [
    (279 / 408, 0.66, "n/a — teacher at chance (0.684 = majority class 'equivalent')"),
    (0.86, 279 / 408, "n/a — student at chance (0.684 = majority class 'equivalent')"),
    (0.86, 0.60, "n/a — student below chance (0.600; chance 0.684 = majority class 'equivalent')"),
])
def test_a_model_at_chance_gets_no_retained_share(tmp_path, caplog, teacher, student, note):
    """Finding 2 of issue 27: a teacher at chance printed "93.3% retained" with no warning."""
    with caplog.at_level(logging.WARNING, logger="distill.publish.report"):
        report = _report(teacher, student)
    assert report["models"]["student"]["ratios"]["metric_retained"] is None
    assert report["models"]["student"]["retained_note"] == note
    assert any(note in r.getMessage() for r in caplog.records)
    write_report(report, tmp_path)
    assert f"| {note} |" in (tmp_path / "report.md").read_text()
    (row,) = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| student |")]
    assert "%" not in row


def test_a_rerun_reuses_the_timing_of_the_same_models_and_says_so(tmp_path, tiny_tokenizer):
    """Re-running a finished pipeline gives the card and the report the same latency numbers (the stored ones, with
    when they were measured); new timing settings time again."""
    folder = write_glue_folder(tmp_path, "sst2")
    config = tiny_job(tmp_path, tiny_bert(id2label={0: "negative", 1: "positive"},
                                          label2id={"negative": 0, "positive": 1}), tiny_tokenizer)
    args = ["pipeline", "--config", config, "--data-dir", str(folder)]
    assert run_distill.main(args) == 0
    out = tmp_path / "run"
    first = json.loads((out / "report.json").read_text())
    assert first["student"]["timing"]["reused"] is False
    text = (out / "report.md").read_text()
    assert text.startswith(f"# Report: sst2\n\n- task: sst2\n- data: local data folder ({folder.name}): 12 train, "
                           "6 dev examples\n- config: run/config.json\n")  # no path of the machine that made it
    assert run_distill.main(args) == 0
    again = json.loads((out / "report.json").read_text())
    assert again["student"]["latency"] == first["student"]["latency"] and again["student"]["timing"]["reused"]
    assert again["student"]["timing"]["timed_at"] == first["student"]["timing"]["timed_at"]
    assert "the stored timing of these same models, reused" in (out / "report.md").read_text()
    assert "(reused on a re-run of the same models)" in (out / "student" / "README.md").read_text()
    assert run_distill.main([*args, "--set", "report.num_repeats=2"]) == 0
    timed = json.loads((out / "report.json").read_text())
    assert not timed["student"]["timing"]["reused"] and timed["student"]["timing"]["num_repeats"] == 2
    # Timed at report.num_threads, and reused in a process with another thread count: the report says the count the
    # timing ran at, not the new process's.
    import torch

    threads = torch.get_num_threads()
    try:
        assert run_distill.main([*args, "--set", "report.num_threads=1"]) == 0
        torch.set_num_threads(2)
        assert run_distill.main([*args, "--set", "report.num_threads=1"]) == 0
        reused = json.loads((out / "report.json").read_text())
        assert reused["student"]["timing"]["reused"] and reused["student"]["timing"]["num_threads"] == 1
    finally:
        torch.set_num_threads(threads)
