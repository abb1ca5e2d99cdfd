"""One job run with several seeds, and the mean and spread of what it gives.

A single run can mislead: on the bundled SST-2 sample the same default job gave students 0.8131 and 0.8200 on two
machines. :func:`run_seeds` runs the whole pipeline once per seed, each in ``<output_dir>/seed-<seed>/`` (every
stage resumable as usual), and writes ``seeds.json`` and ``seeds.md``: each seed's teacher and student dev metrics,
the share of the teacher's metric the student keeps, the task stages' wall time, then the mean, the sample standard
deviation and the range over seeds. :func:`run_sweep_seeds` does the same for a sweep (``sweep --seeds``): each
seed's sweep and benchmark in its own folder, then every student's metric, retained share and speed-up over the
seeds in ``seeds.md``, ``seeds.json`` and an accuracy/latency plot with error bars (``seeds.png``).

The seed of every task stage changes with the run (teacher fine-tuning, masked LM, augmentation, both distillation
steps); general distillation keeps its own, so it is made once and shared through its cache like any other job's.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

import torch

from distill.method.checkpoint import is_main_process, output_lock, write_json_atomic
from distill.tasks import summary_metrics
from distill.config import ConfigError, PipelineConfig, with_overrides
from distill.job.pipeline import plan_pipeline, run_pipeline, run_sweep, shared_row
from distill.method.processes import several_processes
from distill.publish.report import task_seconds

logger = logging.getLogger(__name__)

# Config sections whose ``seed`` a run sets: every stage of the task part of the job.
SEEDED_SECTIONS = ("teacher.train", "mlm.train", "augment", "distill.intermediate", "distill.prediction")


def seeded(config: PipelineConfig, seed: int, output_dir: Path) -> PipelineConfig:
    """``config`` with ``seed`` in every section of :data:`SEEDED_SECTIONS` and its output in ``output_dir``.

    Raises:
        ConfigError: ``export.push_to_hub`` is set: each seed makes its own student, and they would overwrite one
            another in the same repository.
    """
    if config.export.push_to_hub:
        raise ConfigError(f"export.push_to_hub ({config.export.push_to_hub!r}): a seeds run makes one student per seed. "
                          "Leave it unset, then upload the student you pick with `python run_distill.py pipeline "
                          "--config DIR/seed-N/config.json --push-to-hub REPO` (its finished stages are reused)")
    return with_overrides(config, {**{f"{section}.seed": seed for section in SEEDED_SECTIONS},
                                   "output_dir": str(output_dir)})


def seed_configs(config: PipelineConfig, seeds: list[int]) -> dict[int, PipelineConfig]:
    """Each seed's job (:func:`seeded`), in ``<output_dir>/seed-<seed>``, in the order given.

    Raises:
        ConfigError: no seed, a seed given twice, or what :func:`seeded` refuses.
    """
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: give distinct seeds, e.g. 42 43 44 (got {seeds})")
    base = Path(config.output_dir)
    return {seed: seeded(config, seed, base / f"seed-{seed}") for seed in seeds}


def plan_seeds(config: PipelineConfig, seeds: list[int], plan=plan_pipeline) -> list[dict]:
    """What :func:`run_seeds` would do (``seeds --dry-run``; with ``plan=plan_sweep``, what :func:`run_sweep_seeds`
    would do, ``sweep --seeds --dry-run``), changing nothing: each seed's ``plan`` rows
    (:func:`distill.job.pipeline.plan_pipeline` by default), their ``stage`` prefixed ``seed N:``, then the summary.

    The general stage, made once and shared: when the first seed that needs it would make it, the later seeds' rows
    say ``reuse``, naming that seed.

    Raises:
        ConfigError: as :func:`seed_configs`; ConfigError, ModelError: what preflight refuses for a seed's job.
    """
    rows, general_made_by = [], {}
    for seed, run_config in seed_configs(config, seeds).items():
        for row in plan(run_config):
            if row["stage"].split(": ")[-1] == "general":  # a sweep's students share one general stage too
                row = shared_row(row, general_made_by, row["run_id"], f"seed {seed}")
            rows.append({**row, "stage": f"seed {seed}: {row['stage']}"})
    rows.append({"stage": "summary", "folder": str(Path(config.output_dir) / "seeds.md"), "run_id": None,
                 "action": "run"})
    return rows


def run_seeds(config: PipelineConfig, seeds: list[int], device: torch.device | None = None,
              command: str | None = None) -> dict:
    """Run the pipeline once per seed and summarise the runs (:func:`summarize`).

    Args:
        config: the job; its ``output_dir`` holds one folder per seed and the summary.
        seeds: distinct seeds, e.g. ``[42, 43, 44]`` (42 is every stage's default, so its run is the plain job's).
        device: as :func:`distill.job.pipeline.run_pipeline`.
        command: the command line, for the summary (each seed's model card gets the command that reruns that seed).

    Returns:
        The summary written to ``seeds.json``.

    A seed whose run fails (a teacher refused by its guard-rail, a loss that turned non-finite, a full disk) does not
    stop the others: its error is logged with its traceback and named in the summary, the remaining seeds run, and
    the seeds that finished are summarised. Running the same command again reuses every finished stage. Under a
    multi-process launch a failing seed stops the command (its error raised as it is): the processes cannot be kept
    in step after one of them failed alone.

    Raises:
        ConfigError: no seed, a seed given twice, or ``export.push_to_hub`` set (:func:`seeded`), before any run.
        SeedsFailedError: after the other seeds ran and the summary of those that finished was written, when at least
            one seed's run failed. ``KeyboardInterrupt`` stops the whole command at once (finished stages kept).
    """
    def write(reports: dict, summary: dict) -> dict:
        summary = {**summarize(reports), **summary}
        write_json_atomic(base / "seeds.json", summary)
        (base / "seeds.md").write_text(seeds_markdown(summary), encoding="utf-8")
        return summary

    base = Path(config.output_dir)
    return _each_seed(config, seeds, run_pipeline, write, device, command)


def run_sweep_seeds(config: PipelineConfig, seeds: list[int], device: torch.device | None = None,
                    command: str | None = None) -> dict:
    """Run the sweep (:func:`distill.job.pipeline.run_sweep`) once per seed, each in ``<output_dir>/seed-<seed>/``
    with every task stage's seed set as :func:`seeded` sets it, then summarise the seeds' benchmarks
    (:func:`summarize_sweeps`) in ``seeds.json``, ``seeds.md`` (:func:`sweeps_markdown`) and ``seeds.png``
    (:func:`distill.publish.benchmark.plot_over_seeds`).

    A failing seed is handled as :func:`run_seeds` handles it: logged and named, the others run and are summarised,
    then :class:`SeedsFailedError`; running the same command again reuses every finished stage.

    Returns:
        The summary written to ``seeds.json``; empty in the other processes of a multi-process launch (the main
        process alone benchmarks).

    Raises:
        ConfigError: as :func:`seed_configs`, and what :func:`distill.job.pipeline.run_sweep` refuses for the first
            seed before any of its stages. SeedsFailedError: as :func:`run_seeds`.
    """
    from distill.publish.benchmark import plot_over_seeds

    def write(reports: dict, summary: dict) -> dict:
        reports = {seed: report for seed, report in reports.items() if report is not None}
        if not reports:  # another process of a multi-process launch: the main one benchmarked and summarises
            return {}
        summary = {**summarize_sweeps(reports), **summary}
        write_json_atomic(base / "seeds.json", summary)
        (base / "seeds.md").write_text(sweeps_markdown(summary), encoding="utf-8")
        plot_over_seeds(summary, base / "seeds.png")
        return summary

    base = Path(config.output_dir)
    return _each_seed(config, seeds, run_sweep, write, device, command)


def _each_seed(config: PipelineConfig, seeds: list[int], run, write, device: torch.device | None,
               command: str | None) -> dict:
    """``run(config of the seed, device)`` for each seed (:func:`seed_configs`), then, in the main process, ``write(
    {seed: what run returned}, {"failed": {seed: error}, "command": command})`` over the seeds that finished; returns
    what ``write`` returns (``{}`` when none finished or in another process). Raises as :func:`run_seeds`."""
    base = Path(config.output_dir)
    configs = seed_configs(config, seeds)  # every check before any run
    results, failed, summary = {}, {}, {}
    with output_lock(base, command):  # each seed's own folder is locked by its own job
        for number, (seed, run_config) in enumerate(configs.items(), 1):
            logger.info("=== seed %d (%d of %d) -> %s", seed, number, len(seeds), run_config.output_dir)
            try:
                results[seed] = run(run_config, device)
            except Exception as error:  # noqa: BLE001 - one seed's failure is reported, the others still run
                if several_processes():  # the processes cannot be kept in step after one failed alone: stop them all
                    raise
                logger.exception("seed %d failed; its finished stages are kept, going on with the next seed", seed)
                failed[seed] = f"{type(error).__name__}: {error}"
        if results and is_main_process():  # under a multi-process launch, the main process writes it
            summary = write(results, {"failed": failed, "command": command})
    if failed:
        done = (f"{base / 'seeds.md'} summarises the {len(results)} that finished" if results else "none finished")
        raise SeedsFailedError(
            f"{len(failed)} of {len(seeds)} seeds failed ({'; '.join(f'seed {s}: {m}' for s, m in failed.items())}); "
            f"{done}. Fix the cause and re-run the same command: finished stages are reused (tracebacks in "
            f"{base / 'run.log'})")
    return summary


class SeedsFailedError(RuntimeError):
    """One or more seeds' runs failed; the message names each with its error (the others ran and were summarised)."""


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def _retained(student: float, teacher: float) -> float | None:
    """Student / teacher; None where the ratio means nothing (a teacher metric at or below 0, e.g. a correlation)."""
    return student / teacher if teacher > 0 else None


def summarize(reports: dict[int, dict]) -> dict:
    """Per seed and over seeds: teacher and student dev metrics, retained (student / teacher, per seed), task wall time.

    Args:
        reports: {seed: the report :func:`distill.job.pipeline.run_pipeline` returns}.

    Returns:
        {"seeds": [...], "metrics": [names, primary first], "runs": [{"seed", "teacher": {metric: value},
        "student": {...}, "retained": {metric: value or None}, "task_minutes", "resumed"}, ...], "over_seeds":
        {"teacher" | "student" | "retained": {metric: {"mean", "std", "min", "max", "n"}}, "task_minutes": {...}}}.
        ``std`` is the sample standard deviation (n - 1), 0 for one seed; ``n`` counts the runs with a value
        (retained is left out where the teacher's metric is at or below 0, and where the run's report gives no share
        because a model is at chance: its ``retained_note`` says so). ``task_minutes`` leaves out general
        distillation, made once and reused; ``resumed``: a stage of the run resumed an interrupted process, so its
        time counts from the resume.
    """
    runs = []
    for seed, report in reports.items():
        teacher, student = report["models"]["teacher"]["dev"], report["models"]["student"]["dev"]
        stages = report["timing"].get("stage_seconds", {})
        note = report["models"]["student"].get("retained_note")  # a model at chance: no share means anything
        runs.append({"seed": seed, "teacher": dict(teacher), "student": dict(student),
                     "retained": {m: None if note else _retained(student[m], teacher[m]) for m in teacher},
                     "retained_note": note,
                     "task_minutes": task_seconds(stages) / 60,
                     "resumed": any(entry["resumed"] for entry in stages.values())})
    # the table's metrics: the headline ones and those a type names for the summary (others stay in the reports)
    metrics = [m for m in summary_metrics(runs[0]["teacher"]) if all(m in run["teacher"] and m in run["student"]
                                                                    for run in runs)]
    over = {}
    for role in ("teacher", "student", "retained"):
        values = {m: [run[role][m] for run in runs if run[role][m] is not None] for m in metrics}
        over[role] = {m: _spread(found) for m, found in values.items() if found}
    over["task_minutes"] = _spread([run["task_minutes"] for run in runs])
    return {"seeds": list(reports), "metrics": metrics, "runs": runs, "over_seeds": over}


def _show(spread: dict | None, low_high: bool, scale: float = 1.0, unit: str = "", digits: int = 4) -> str:
    """A spread (:func:`_spread`) as "mean ± sd" or as "min-max"; "-" for none; one value alone (no sd) as itself."""
    if spread is None:
        return "-"
    if low_high:
        return f"{scale * spread['min']:.{digits}f}{unit}-{scale * spread['max']:.{digits}f}{unit}"
    if spread["n"] < 2:
        return f"{scale * spread['mean']:.{digits}f}{unit}"
    return f"{scale * spread['mean']:.{digits}f}{unit} ± {scale * spread['std']:.{digits}f}{unit}"


def seeds_markdown(summary: dict) -> str:
    """``seeds.md``: one row per seed, then mean ± standard deviation and the range over seeds (left out for one seed,
    which has no spread; a metric that one run alone has is shown as its value with n=1)."""
    metrics = summary["metrics"]
    header = ["seed", *[f"teacher {m}" for m in metrics], *[f"student {m}" for m in metrics],
              *[f"retained {m}" for m in metrics], "task stages (min)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in summary["runs"]:
        retained = [("n/a" if run.get("retained_note") else "-") if run["retained"][m] is None
                    else f"{100 * run['retained'][m]:.1f}%" for m in metrics]
        minutes = f"{run['task_minutes']:.1f}" + (" (resumed)" if run["resumed"] else "")
        lines.append("| " + " | ".join([str(run["seed"]), *[f"{run['teacher'][m]:.4f}" for m in metrics],
                                        *[f"{run['student'][m]:.4f}" for m in metrics], *retained, minutes]) + " |")
    over, runs = summary["over_seeds"], len(summary["runs"])
    for label, low_high in (("mean ± sd", False), ("range", True)) if runs > 1 else ():
        cells = [_show(over[role].get(m), low_high) for role in ("teacher", "student") for m in metrics]
        for m in metrics:
            spread = over["retained"].get(m)
            cells.append(_show(spread, low_high, 100, "%", 1)
                         + (f" (n={spread['n']})" if spread is not None and spread["n"] < runs else ""))
        lines.append("| " + " | ".join([label, *cells, _show(over["task_minutes"], low_high, digits=1)]) + " |")
    spread_said = ("sd is the sample standard deviation" if runs > 1 else
                   "one run has no spread over seeds: name more with --seeds for one")
    note = (f"\n\n{runs} run{'s' if runs > 1 else ''} of the same job, one per seed (every task stage's seed); "
            "retained is the student's dev metric over its own run's teacher's (left out where the teacher's is at or "
            f"below 0; n counts the runs that have it); {spread_said}. Task stages: wall time of the stages each run "
            "ran, general distillation left out (made once, reused); a resumed stage counts from its resume.\n")
    notes = "".join(f"\nSeed {run['seed']}: retained {run['retained_note']}\n"
                    for run in summary["runs"] if run.get("retained_note"))
    return "\n".join(lines) + note + notes + _failed_and_command(summary)


def summarize_sweeps(reports: dict[int, dict]) -> dict:
    """The seeds' sweep benchmarks side by side: for each benchmark row (a model and variant, by its name in the
    first seed's report, then any a later seed adds), its dev metric, its share of the teacher's, its latency and
    speed-up, over the seeds that have it.

    Args:
        reports: {seed: the benchmark report :func:`distill.job.pipeline.run_sweep` returns}; each report's first
            row is its own teacher, so a share is always of the same seed's teacher.

    Returns:
        {"seeds": [...], "task", "metric", "throughput_at" (e.g. ``b32_t64``), "num_threads", "rows": [{"name",
        "model", "variant", "init", "num_parameters", "size_mb", "metric" | "retained" | "faster_by" | "latency_ms":
        {"mean", "std", "min", "max", "n"}, "per_seed": {seed: {"metric", "retained", "faster_by", "latency_ms"}}},
        ...]}. ``retained`` is the row's metric over its seed's teacher's (the benchmark's ``metric_retained``; left
        out where that is None); ``faster_by`` and ``latency_ms`` are at ``throughput_at`` (ms, median of the
        benchmark's repeats); ``std`` the sample standard deviation (0 for one seed).
    """
    first = next(iter(reports.values()))["setup"]
    metric, key = first["metric"], first["throughput_at"]
    per_name: dict[str, dict] = {}
    for seed, report in reports.items():
        for row in report["rows"]:
            entry = per_name.setdefault(row["name"], {
                "name": row["name"], "model": row["model"], "variant": row["variant"], "init": row["init"],
                "num_parameters": row["num_parameters"], "size_mb": row["size_mb"], "per_seed": {}})
            entry["per_seed"][seed] = {"metric": row[metric], "retained": row["ratios"]["metric_retained"],
                                       "faster_by": row["ratios"]["faster_by"], "latency_ms": row["latency_ms"][key]}
    rows = []
    for entry in per_name.values():
        for field in ("metric", "retained", "faster_by", "latency_ms"):
            found = [value[field] for value in entry["per_seed"].values() if value[field] is not None]
            entry[field] = _spread(found) if found else None
        rows.append(entry)
    return {"seeds": list(reports), "task": first["task"], "metric": metric, "throughput_at": key,
            "num_threads": first["num_threads"], "rows": rows}


def sweeps_markdown(summary: dict) -> str:
    """``seeds.md`` of ``sweep --seeds``: one row per model and variant, its metric and retained share as mean ± sd
    over the seeds with each seed's share beside them, its speed-up as the range over seeds."""
    metric, seeds = summary["metric"], summary["seeds"]
    batch, length = summary["throughput_at"][1:].split("_t")
    header = ["model", "variant", "init", "params (M)", "size (MB)", f"ms batch {batch}, length {length} (mean)",
              "faster by (range)", f"{metric} (mean ± sd)", "retained (mean ± sd)",
              f"retained per seed ({', '.join(map(str, seeds))})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in summary["rows"]:
        per_seed = ", ".join("-" if seed not in row["per_seed"] or row["per_seed"][seed]["retained"] is None
                             else f"{100 * row['per_seed'][seed]['retained']:.1f}" for seed in seeds)
        speed = row["faster_by"]
        lines.append("| " + " | ".join([
            row["name"], row["variant"], row["init"], f"{row['num_parameters'] / 1e6:.1f}", f"{row['size_mb']:.1f}",
            f"{row['latency_ms']['mean']:.1f}",
            f"{speed['min']:.2f}x" if speed["n"] < 2 else f"{speed['min']:.2f}-{speed['max']:.2f}x",
            _show(row["metric"], False), _show(row["retained"], False, 100, "%", 1), per_seed]) + " |")
    runs = len(seeds)
    spread_said = ("sd is the sample standard deviation over the seeds" if runs > 1 else
                   "one seed has no spread: name more with --seeds for one")
    note = (f"\n\nThe same sweep run {runs} time{'s' if runs > 1 else ''}, one per seed (every task stage's seed: "
            f"teacher, masked LM, augmentation, both distillation steps); each seed's benchmark in "
            f"seed-N/benchmark/. Retained is a model's dev {metric} over its own seed's teacher's; {spread_said}. "
            f"Latency and 'faster by' at batch {batch}, length {length}, {summary['num_threads']} threads, timed by "
            "each seed's benchmark (a busy machine widens their range). The plot (seeds.png) draws the means, with "
            f"the sd of {metric} and the range of latency as bars.\n")
    return "\n".join(lines) + note + _failed_and_command(summary)


def _failed_and_command(summary: dict) -> str:
    """The end of a ``seeds.md``: each failed seed with its error, then the command that ran (when known)."""
    failed = "".join(f"\nSeed {seed} failed, not in the table: {message}\n"
                     for seed, message in summary.get("failed", {}).items())
    return failed + (f"\nCommand: `{summary['command']}`\n" if summary.get("command") else "")
