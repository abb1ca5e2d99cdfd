"""One job run with several seeds, and the mean and spread of what it gives.

A single run can mislead: on the bundled SST-2 sample the same default job gave students 0.8131 and 0.8200 on two
machines. :func:`run_seeds` runs the whole pipeline once per seed, each in ``<output_dir>/seed-<seed>/`` (every
stage resumable as usual), and writes ``seeds.json`` and ``seeds.md``: each seed's teacher and student dev metrics,
the share of the teacher's metric the student keeps, the task stages' wall time, then the mean, the sample standard
deviation and the range over seeds.

The seed of every task stage changes with the run (teacher fine-tuning, masked LM, augmentation, both distillation
steps); general distillation keeps its own, so it is made once and shared through its cache like any other job's.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import torch

from distill.checkpoint import write_json_atomic
from distill.config import ConfigError, PipelineConfig, from_dict, to_dict
from distill.pipeline import run_pipeline

logger = logging.getLogger(__name__)

# Config sections whose ``seed`` a run sets: every stage of the task part of the job.
SEEDED_SECTIONS = ("teacher.train", "mlm.train", "augment", "distill.intermediate", "distill.prediction")


def seeded(config: PipelineConfig, seed: int, output_dir: Path) -> PipelineConfig:
    """``config`` with ``seed`` in every section of :data:`SEEDED_SECTIONS` and its output in ``output_dir``."""
    data = to_dict(config)
    for section in SEEDED_SECTIONS:
        node = data
        for part in section.split("."):
            node = node[part]
        node["seed"] = seed
    data["output_dir"] = str(output_dir)
    return from_dict(PipelineConfig, data)


def run_seeds(config: PipelineConfig, seeds: list[int], device: torch.device | None = None,
              command: str | None = None) -> dict:
    """Run the pipeline once per seed and summarise the runs (:func:`summarize`).

    Args:
        config: the job; its ``output_dir`` holds one folder per seed and the summary.
        seeds: distinct seeds, e.g. ``[42, 43, 44]`` (42 is every stage's default, so its run is the plain job's).
        device: as :func:`distill.pipeline.run_pipeline`.
        command: the command line, for the model cards and the summary.

    Returns:
        The summary written to ``seeds.json``.

    Raises:
        ConfigError: no seed, or a seed given twice.
    """
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: give distinct seeds, e.g. --seeds 42 43 44 (got {seeds})")
    base = Path(config.output_dir)
    reports = {}
    for number, seed in enumerate(seeds, 1):
        logger.info("=== seed %d (%d of %d) -> %s", seed, number, len(seeds), base / f"seed-{seed}")
        reports[seed] = run_pipeline(seeded(config, seed, base / f"seed-{seed}"), device, command=command)
    summary = summarize(reports)
    summary["command"] = command
    write_json_atomic(base / "seeds.json", summary)
    (base / "seeds.md").write_text(seeds_markdown(summary), encoding="utf-8")
    return summary


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def summarize(reports: dict[int, dict]) -> dict:
    """Per seed and over seeds: teacher and student dev metrics, retained (student / teacher, per seed), task wall time.

    Args:
        reports: {seed: the report :func:`distill.pipeline.run_pipeline` returns}.

    Returns:
        {"seeds": [...], "metrics": [names, primary first], "runs": {seed: {"teacher": {metric: value}, "student":
        {...}, "retained": {...}, "task_minutes": float}}, "over_seeds": {"teacher" | "student" | "retained":
        {metric: {"mean", "std", "min", "max"}}, "task_minutes": {...}}}. ``std`` is the sample standard deviation
        (n - 1); 0 for one seed. ``task_minutes`` leaves out general distillation, made once and reused.
    """
    runs = {}
    for seed, report in reports.items():
        teacher, student = report["models"]["teacher"]["dev"], report["models"]["student"]["dev"]
        stages = report["timing"].get("stage_seconds", {})
        runs[seed] = {"teacher": dict(teacher), "student": dict(student),
                      "retained": {m: student[m] / teacher[m] if teacher[m] else None for m in teacher},
                      "task_minutes": sum(s for name, s in stages.items() if name != "general") / 60}
    metrics = list(next(iter(runs.values()))["teacher"])
    over = {role: {m: _spread([run[role][m] for run in runs.values()]) for m in metrics
                   if all(run[role][m] is not None for run in runs.values())}
            for role in ("teacher", "student", "retained")}
    over["task_minutes"] = _spread([run["task_minutes"] for run in runs.values()])
    return {"seeds": list(reports), "metrics": metrics, "runs": runs, "over_seeds": over}


def _show(spread: dict | None, scale: float, unit: str, digits: int, low_high: bool) -> str:
    """A spread (:func:`_spread`) as "mean ± sd" or as "min-max"; "-" for none."""
    if spread is None:
        return "-"
    if low_high:
        return f"{scale * spread['min']:.{digits}f}{unit}-{scale * spread['max']:.{digits}f}{unit}"
    return f"{scale * spread['mean']:.{digits}f}{unit} ± {scale * spread['std']:.{digits}f}"


def seeds_markdown(summary: dict) -> str:
    """``seeds.md``: one row per seed, then mean ± standard deviation and the range over seeds."""
    metrics = summary["metrics"]
    header = ["seed", *[f"teacher {m}" for m in metrics], *[f"student {m}" for m in metrics],
              *[f"retained {m}" for m in metrics], "task stages (min)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cells(get_metric, get_retained, minutes) -> list[str]:
        return [*[get_metric("teacher", m) for m in metrics], *[get_metric("student", m) for m in metrics],
                *[get_retained(m) for m in metrics], minutes]

    for seed, run in summary["runs"].items():
        percent = lambda m: "-" if run["retained"][m] is None else f"{100 * run['retained'][m]:.1f}%"
        lines.append("| " + " | ".join([str(seed), *cells(lambda role, m: f"{run[role][m]:.4f}", percent,
                                                           f"{run['task_minutes']:.1f}")]) + " |")
    over = summary["over_seeds"]
    for label, low_high in (("mean ± sd", False), ("range", True)):
        show = lambda s, scale=1.0, unit="", digits=4: _show(s, scale, unit, digits, low_high)
        row = cells(lambda role, m: show(over[role].get(m)), lambda m: show(over["retained"].get(m), 100, "%", 1),
                    show(over["task_minutes"], digits=1))
        lines.append("| " + " | ".join([label, *row]) + " |")
    return ("\n".join(lines) + f"\n\n{len(summary['seeds'])} runs of the same job, one per seed (every task stage's "
            "seed); retained is the student's dev metric over its own run's teacher's, averaged over runs; sd is the "
            "sample standard deviation. Task stages: wall time of the stages each run ran, general distillation left "
            "out (made once, reused).\n" + (f"\nCommand: `{summary['command']}`\n" if summary.get("command") else ""))
