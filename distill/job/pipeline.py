"""The main job: teacher → masked LM → augmentation → task distillation (intermediate, prediction) → report, and the
sweep of several students from one teacher; each run or planned (the dry run) by walking :mod:`distill.job.table`.

Every stage writes its own folder under ``output_dir`` and a ``stage.json`` marker when it is complete; a complete
stage is skipped on re-run, an interrupted one resumes from its last checkpoint or shard. Each stage's run id is
derived from the config fields it declares and its inputs' run ids (:mod:`distill.job.stages`), and its code reads the
config through a view that allows those fields only. A folder holding the output of another run id (the config of
that stage, or of a stage before it, changed) is moved to ``superseded/`` and the stage is run again; stages whose
run id did not change are reused.

Layout: ``teacher/`` (HF checkpoint), ``mlm/`` (HF masked LM), ``augmented/`` (dataset shards),
``teacher_logits/`` (cached teacher logits), ``student_intermediate/`` (after the intermediate step, plus
``projections.safetensors``), ``student/`` (final HF checkpoint), ``report.json``, ``report.md``.
The stages' code: :mod:`~distill.job.stage_teacher`, :mod:`~distill.job.stage_augment`, :mod:`~distill.job.general`,
:mod:`~distill.job.pruned`, :mod:`~distill.job.stage_distill`, :mod:`~distill.job.stage_report`.
"""


from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch

from distill.config import (
    ConfigError,
    PipelineConfig,
    with_overrides,
)
from distill.device import run_device
from distill.job.preflight import preflight, prepare
from distill.job.stage_report import card_recipe, run_record
from distill.job.stages import banner
from distill.job.table import SHARED, STUDENT, Job, Plan, plan_steps, run_steps
from distill.method.checkpoint import (
    output_lock,
)
from distill.method.processes import is_main_process
from distill.publish.card import describe_init, public_name, student_card
from distill.tasks.base import DataError, TaskSpec
from distill.tasks.data import data_source_kind, load_task_data_with_source, task_spec
from distill.tasks.split import REPORT, half_key
from teachers.finetune import chance, dev_labels

logger = logging.getLogger(__name__)


def run_pipeline(config: PipelineConfig, device: torch.device | None = None, command: str | None = None) -> dict:
    """Run every stage of the main job (skipping finished ones) and return the report.

    One run at a time per output folder: the folder is locked while the job runs
    (:func:`distill.method.checkpoint.output_lock`).

    Args:
        config: the job.
        device: where every stage computes (None: :func:`distill.device.run_device`, accelerate's choice).
        command: the command line that started it, for the model card (None: the one that reruns the saved config).

    Raises:
        FolderInUseError: another process is running a job in ``output_dir``; and whatever a stage raises
            (ConfigError, DataError, ModelError, ...), finished stages kept.
    """
    device = device if device is not None else run_device()
    config = for_device(prepare(config), device)
    preflight(config)
    logger.info("device: %s", device)
    with output_lock(Path(config.output_dir), command):
        return _pipeline(config, device, command)


def for_device(config: PipelineConfig, device: torch.device) -> PipelineConfig:
    """``config`` with the budget rules that depend on where the job runs resolved, so that run ids and the saved
    config say what runs: on a CPU, ``task.max_train_examples_cpu`` caps ``task.max_train_examples`` and
    ``teacher.max_train_examples_cpu`` stays (the teacher's share of them); on an accelerator both are dropped (the
    whole training set, or ``max_train_examples``, for the teacher and the student alike), and so is the teacher's
    share when ``teacher.model`` names a fine-tuned teacher (nothing is fine-tuned)."""
    cap = config.task.max_train_examples_cpu
    overrides = {}
    if cap is not None:
        limit = config.task.max_train_examples
        if device.type == "cpu":
            limit = cap if limit is None else min(limit, cap)
            logger.info("task.max_train_examples_cpu: the first %d training examples on the CPU", limit)
        overrides.update({"task.max_train_examples": limit, "task.max_train_examples_cpu": None})
    if config.teacher.max_train_examples_cpu is not None:
        if device.type == "cpu" and config.teacher.model is None:
            logger.info("teacher.max_train_examples_cpu: the teacher is fine-tuned on the first %d of them",
                        config.teacher.max_train_examples_cpu)
        else:
            overrides["teacher.max_train_examples_cpu"] = None
    return with_overrides(config, overrides) if overrides else config


def _pipeline(config: PipelineConfig, device: torch.device, command: str | None) -> dict:
    out = Path(config.output_dir)
    return run_steps(Job(config, out, out, device=device, command=command)).report


def plan_pipeline(config: PipelineConfig, student_dir: Path | None = None) -> list[dict]:
    """What :func:`run_pipeline` would do with ``config``, read from the output folder and the cache without changing
    anything (``pipeline --dry-run``): the steps of :mod:`distill.job.table` planned in the order the run takes them.
    ``student_dir``: where the student's own stages go (default the output folder; a sweep's ``students/<name>``).

    Returns:
        One row per stage, in order: ``stage``, ``folder``, ``run_id`` and ``action``: ``reuse`` (finished under this
        run id), ``resume`` (unfinished work of this run id), ``run``, ``replace`` (the folder holds another run's
        output, moved to ``superseded/`` when the job runs) or ``skip``; ``why`` says why a stage is skipped.

    Raises:
        ConfigError, ModelError: what :func:`distill.job.preflight.preflight` refuses before any stage.
    """
    config = for_device(prepare(config), run_device())
    preflight(config)
    out = Path(config.output_dir)
    return plan_steps(Job(config, out, student_dir or out), Plan()).rows


def run_sweep(config: PipelineConfig, device: torch.device | None = None) -> dict | None:
    """Several students distilled from one teacher and one augmented set, then benchmarked together.

    The teacher, masked LM, augmentation and teacher logits are made once in ``output_dir`` (as the pipeline does);
    each entry of ``config.sweep`` gets ``students/<name>/`` with its two steps; the benchmark over the teacher, every
    student and ``benchmark.students`` goes to ``benchmark/``. Every stage resumes and is skipped when done. Every
    stage runs on ``device`` (None: :func:`distill.device.run_device`).

    Returns:
        The benchmark report; None in the other processes of a multi-process launch (the main process alone
        benchmarks the students, after every process has trained them).

    Raises:
        FolderInUseError: another process is running a job in ``output_dir``. DataError: a ``benchmark.students``
            folder that does not exist (checked before any stage runs).
    """
    from distill.publish.benchmark import resolve_model_folder

    if not config.sweep:
        raise ConfigError("sweep: the config lists no students; add a `sweep:` list (see configs/sweep_sst2.yaml)")
    device = device if device is not None else run_device()
    config = for_device(prepare(config), device)
    entries = sweep_entries(config)
    for entry_config in entries.values():
        preflight(entry_config)
    for extra in config.benchmark.students:  # a wrong path is an error now, not after every student has trained
        try:
            resolve_model_folder(Path(extra), "student")
        except FileNotFoundError as error:
            raise DataError(f"benchmark.students: {error}") from None
    with output_lock(Path(config.output_dir)):
        return _sweep(config, entries, device)


def sweep_entries(config: PipelineConfig) -> dict[str, PipelineConfig]:
    """Each ``sweep:`` entry's job by name: ``config`` with the entry's student and, when it names one, its layer map."""
    entries = {}
    for entry in config.sweep:
        distill = dataclasses.replace(config.distill, layer_map=entry.layer_map or config.distill.layer_map)
        entries[entry.name] = dataclasses.replace(config, student=entry.student, distill=distill)
    return entries


def shared_stages(config: PipelineConfig, device: torch.device) -> Job:
    """The stages every student of a run shares (:data:`distill.job.table.SHARED`: the config record, task data,
    teacher, augmented training set), run on ``device``; the :class:`~distill.job.table.Job` they leave."""
    out = Path(config.output_dir)
    return run_steps(Job(config, out, out, device=device), (SHARED,))


def _sweep(config: PipelineConfig, entries: dict[str, PipelineConfig], device: torch.device,
           benchmark_dir: Path | None = None) -> dict | None:
    from distill.publish.benchmark import (
        resolve_model_folder,
        run_benchmark,
        unique_name,
    )

    shared = shared_stages(config, device)
    out, spec, data, teacher_record = shared.out, shared.spec, shared.data, shared.teacher
    students, jobs = {}, {}
    for name, student_config in entries.items():
        banner(f"sweep student {name}", out / "students" / name)
        jobs[name] = job = run_steps(shared.for_student(student_config, out / "students" / name), (STUDENT,))
        logger.info("sweep student %s: dev %s", name, job.student["dev"])
        students[name] = (out / "students" / name / "student",
                          describe_init(student_config.student, student_config.distill.layer_map,
                                        student_config.general.enabled))
    if not is_main_process():  # the main process times the models alone and writes the benchmark and the cards
        return None
    for extra in config.benchmark.students:
        students[unique_name(Path(extra).name, {"teacher", *students})] = resolve_model_folder(Path(extra), "student")
    benchmark_dir = benchmark_dir or out / "benchmark"
    banner("benchmark", benchmark_dir)
    report = run_benchmark(out / "teacher", students, spec, data["dev"], config.benchmark, benchmark_dir,
                           config.task.max_seq_length, device=device)
    rows = {row["name"]: row for row in report["rows"] if row["variant"] == "pytorch"}
    halves = [half_key(REPORT, name) for name in spec.metrics]
    for name, student_config in entries.items():
        card_rows = [{"name": f"{label} (`{public_name(config.teacher.model or config.teacher.base_model)}`)"
                      if label == "teacher"
                      else name, "dev": {m: rows[label][m] for m in (*spec.metrics, *halves) if m in rows[label]},
                      "num_parameters": rows[label]["num_parameters"], "size_mb": rows[label]["size_mb"],
                      "faster_by": rows[label]["ratios"]["faster_by"], "retained": rows[label]["ratios"]["metric_retained"],
                      "latency_ms": rows[label]["latency_ms"]} for label in ("teacher", name)]
        job = jobs[name]
        general = json.loads((job.student_dir / "general.json").read_text(encoding="utf-8"))
        recipe = card_recipe(student_config, spec, teacher_record, general, job.step1, shared.train_data,
                             job.student, shape=job.shape)
        student_card(name=f"{Path(config.output_dir).name}-{name}", spec=spec,
                     teacher=config.teacher.model or config.teacher.base_model, rows=card_rows, recipe=recipe,
                     command=f"python run_distill.py sweep --config {public_name(str(out))}/config.json",
                     license=config.export.license, data=run_record(spec, shared.source, out)["data"],
                     chance=chance(spec, dev_labels(data, spec)),
                     latency_note="Latency from the benchmark of the sweep (see benchmark/benchmark.md of the run)."
                     ).save(job.student_dir / "student" / "README.md")
    return report


def shared_row(row: dict, made_by: dict, key: str, maker: str) -> dict:
    """A dry-run row of a stage that several runs share (one ``key``: its run id or folder): the first row that would
    make it (``run``, ``resume``, ``replace``) is kept and ``maker`` recorded in ``made_by[key]``; a later one becomes
    ``reuse`` with the note ``made by <maker>'s run``. Rows with any other action are returned as they are."""
    if row["action"] not in ("run", "resume", "replace"):
        return row
    if key in made_by:
        return {**row, "action": "reuse", "note": f"made by {made_by[key]}'s run"}
    made_by[key] = maker
    return row


def plan_sweep(config: PipelineConfig) -> list[dict]:
    """What :func:`run_sweep` would do with ``config`` (``sweep --dry-run``), changing nothing: the shared steps of
    :mod:`distill.job.table` (teacher, masked LM, augmentation) once, then each entry's student steps in
    ``students/<name>/`` (their ``stage`` prefixed with the entry's name), then the benchmark. Rows as
    :func:`plan_pipeline`'s; the teacher logits (made once, by the first student's prediction step) are one row, skipped
    only when every student is finished; a teacher-output cache shared by several students
    (:func:`~distill.job.stage_distill.teacher_cache_folder`) is made by the first that needs it and reused by the
    others.

    Raises:
        ConfigError: no ``sweep:`` list; and what :func:`distill.job.preflight.preflight` refuses for an entry (named).
    """
    if not config.sweep:
        raise ConfigError("sweep: the config lists no students; add a `sweep:` list (see configs/sweep_sst2.yaml)")
    out = Path(config.output_dir)
    shared, logits, students, cache_made_by = None, [], [], {}
    for name, entry_config in sweep_entries(config).items():
        try:
            entry_config = for_device(prepare(entry_config), run_device())
            preflight(entry_config)
        except ConfigError as error:
            raise ConfigError(f"sweep entry {name!r}: {error}") from None
        if shared is None:  # planned with the first entry's config, as the run makes them
            shared = plan_steps(Job(entry_config, out, out), Plan(), (SHARED,))
        own = plan_steps(Job(entry_config, out, out / "students" / name), Plan(ids=dict(shared.ids)), (STUDENT,)).rows
        logits.append(next(row for row in own if row["stage"] == "teacher_logits"))
        for row in own:
            if row is logits[-1]:
                continue
            if row["stage"] == "teacher_outputs":  # a shared cache: the first student that needs it makes it
                row = shared_row(row, cache_made_by, row["folder"], name)
            students.append({**row, "stage": f"{name}: {row['stage']}"})
    needed = [row for row in logits if row["action"] != "skip"]  # a student still to train reads them
    logits = needed[0] if needed else {**logits[0], "why": "every student is finished; the teacher logits are not "
                                                           "needed"}
    benchmark = {"stage": "benchmark", "folder": str(out / "benchmark"), "run_id": None, "action": "run"}
    return [*shared.rows, logits, *students, benchmark]


def data_preview(config: PipelineConfig, num_rows: int = 3) -> str:
    """The task data as the run will read it, for ``pipeline --dry-run``: read in full with the run's own readers
    (file layout, every label, every answer's offset), so that what the run would refuse at reading the dry run
    refuses too; then where it comes from, its columns and labels and its first training rows, as lines. Data from the
    hub is not fetched (the run reads it when it starts).

    Raises:
        DataError: what reading the data raises (the file and its line named).
    """
    spec = task_spec(config.task)
    task = config.task
    if spec.hub is not None:
        if data_source_kind(task, spec) == "hub":
            return f"data: {'/'.join(spec.hub)} from the hub, read when the run starts (not fetched by a dry run)"
    elif not all(Path(name).exists() for name in (task.train_file, task.dev_file)):
        return f"data: {task.train_file}, {task.dev_file} (hub data sets), read when the run starts"
    data, source = load_task_data_with_source(task, spec)
    labels = spec.type.describe_labels(spec)
    lines = [f"data: {source.describe(public=False)}",
             f"{spec.type.description} ({spec.task_type}): columns {', '.join(spec.text_columns)}; labels: {labels}"]
    train = data["train"]
    for index in range(min(num_rows, len(train))):
        lines.append(f"  train {index}: {_preview_row(train[index], spec)}")
    return "\n".join(lines)


def _preview_row(row: dict, spec: TaskSpec, width: int = 60) -> str:
    """One example in a line: each text cut to ``width`` characters, labels by their names."""
    def shown(value):
        if isinstance(value, str):
            return repr(value if len(value) <= width else value[:width] + "...")
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(spec.label_names) \
                and spec.type.labels_are_classes:
            return spec.label_names[value]
        if isinstance(value, list):
            items = [shown(v) for v in value[:12]]
            return "[" + ", ".join(items) + (", ..." if len(value) > 12 else "") + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
        return repr(value)

    return "; ".join(f"{name} {shown(value)}" for name, value in row.items())


def plan_markdown(rows: list[dict], minutes: dict[str, float] | None = None) -> str:
    """:func:`plan_pipeline`'s rows as a plain-text table, one stage a line, with each stage's estimated minutes
    (:func:`plan_minutes`) where given."""
    width = max(22, *(len(row["stage"]) + 2 for row in rows))
    shown = minutes is not None
    lines = [f"{'stage':<{width}}{'action':<9}" + ("min    " if shown else "") + f"{'run id':<18}folder"]
    for row in rows:
        where = row.get("why") and f"({row['why']})" or row["folder"] or ""
        note = f" ({row['note']})" if row.get("note") else ""
        cost = (f"{minutes[row['stage']]:<7.1f}" if row["stage"] in minutes else f"{'-':<7}") if shown else ""
        lines.append(f"{row['stage']:<{width}}{row['action']:<9}{cost}{row['run_id'] or '-':<18}{where}{note}")
    return "\n".join(lines)


def plan_minutes(config: PipelineConfig, rows: list[dict], entries: dict | None = None
                 ) -> tuple[dict[str, float] | None, str]:
    """Each stage's estimated minutes on this machine (:func:`distill.job.estimate.estimate_minutes`) and how they
    were reached, or (None, why not): the data or a model cannot be read here yet (a hub data set or teacher
    offline)."""
    from distill.job.estimate import Clock, estimate_minutes

    if os.environ.get("TINYDISTILL_ESTIMATE", "on").lower() in ("off", "0", "false", "no"):
        return None, "TINYDISTILL_ESTIMATE is off"
    spec = task_spec(config.task)
    if spec.hub is not None and data_source_kind(config.task, spec) == "hub":
        return None, "the data come from the hub when the run starts"
    clock = Clock()
    try:
        data, _ = load_task_data_with_source(config.task, spec)
        minutes = estimate_minutes(config, rows, data, spec, clock, entries)
    except (OSError, ValueError) as error:  # a teacher or masked LM not readable offline (ModelError is one)
        return None, f"{str(error).splitlines()[0]}"
    timed = (f"timed {clock.measured} model shape{'s' if clock.measured != 1 else ''} here"
             if clock.measured else "from the model shapes' timings on this machine")
    if clock.busy and clock.measured:
        timed += (", while other work kept the cores busy: high, and not kept (dry-run again on an idle machine "
                  "for a true estimate)")
    return minutes, f"{timed}; the work counted from the config and the data: steps, rows, masked-LM words"
