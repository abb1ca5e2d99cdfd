"""The last stages: the report (teacher and student scored and timed side by side) and what ships with the student
(ONNX, the model card, the upload)."""


from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import datasets
import torch

from distill.config import (
    PipelineConfig,
)
from distill.device import is_accelerator
from distill.job.stage_augment import num_augmented, num_unlabelled
from distill.job.stage_distill import ship_tuned
from distill.job.stages import banner
from distill.method.checkpoint import (
    STAGE_FILE,
    write_json_atomic,
)
from distill.method.processes import failure_marked, is_main_process, recorded, wait_for
from distill.publish.card import (
    latency_note,
    public_name,
    push_to_hub,
    recipe_lines,
    student_card,
)
from distill.publish.export import export_student
from distill.publish.report import (
    build_report,
    count_parameters,
    size_mb,
    stage_seconds,
    stored_timing,
    time_models,
    timing_key,
    write_report,
)
from distill.tasks.base import PAIRED, TaskSpec
from distill.tasks.data import DataSource
from distill.tasks.evaluate import evaluate_task
from distill.tasks.split import REPORT, half_key
from teachers import (
    load_tokenizer,
)

logger = logging.getLogger(__name__)


def card_recipe(config: PipelineConfig, spec: TaskSpec, teacher_record: dict, general: dict, step1: dict,
                train_data: datasets.Dataset, step2: dict, shape: dict | None = None) -> list[str]:
    """The card's recipe lines (:func:`distill.publish.card.recipe_lines`) with the counts read from the distillation
    set; ``shape``: the student's shape as the job resolved it."""
    return recipe_lines(config, teacher_record, general, step1, len(train_data), step2,
                        num_unlabelled=num_unlabelled(train_data), num_augmented=num_augmented(train_data),
                        temperature=spec.type.uses_temperature(spec), shape=shape)


def report_stage(config: PipelineConfig, spec: TaskSpec, teacher_record: dict, student_record: dict, out: Path, *,
                 device: torch.device, stages: list[str], chance: dict | None = None, run: dict | None = None,
                 write: bool = True) -> dict:
    """Time teacher and student interleaved on the CPU (and on ``device`` too when it is an accelerator) and write
    ``report.json`` / ``report.md``.

    A re-run whose models (the teacher and student stages' run ids) and timing setup are those ``report.json`` was
    timed with reuses that timing (:func:`distill.publish.report.timing_key`), so the same models do not get new latency
    numbers on every run; the report says when they were timed. ``chance`` (:func:`teachers.finetune.chance`) flags
    a model at chance; ``run`` (task, data, config) heads report.md (see :func:`distill.publish.report.build_report`).
    ``stages``: the stage folders whose wall time the report lists (:func:`distill.job.table.stage_folders`).
    ``write=False``: build the report without writing it (a multi-process job's other processes, which reuse the
    timing its main process wrote)."""
    banner("report", out)
    accelerator = device.type if is_accelerator(device) else None
    key = timing_key({"teacher": teacher_record["run_id"], "student": student_record["run_id"]}, config.report,
                     accelerator)
    models, entries = {}, {}
    for name, record in (("teacher", teacher_record), ("student", student_record)):
        folder = out / name
        model = spec.type.model_class(spec).from_pretrained(folder).eval()
        models[name] = model
        entries[name] = {"dev": record["dev"], "size_mb": size_mb(folder), "path": name, **count_parameters(model),
                         **({"selection": record["selection"]} if "selection" in record else {})}
    stored = stored_timing(out, key)
    if stored is not None:
        timed_at = stored["teacher"].pop("timed_at")
        stored["student"].pop("timed_at")
        logger.info("report: these models were timed %s with the same settings; that timing is reused (delete "
                    "report.json to time again)", timed_at)
        timings, timed = [stored], {"key": key, "timed_at": timed_at, "reused": True}
    else:
        timed = {"key": key, "timed_at": datetime.now().astimezone().isoformat(timespec="seconds"), "reused": False}
        timings = [time_models(models, config.report, task_type=spec.type)]
        if accelerator:
            timings.append(time_models(models, config.report, device, prefix=f"{device.type}_", task_type=spec.type))
    for timing in timings:
        for name, values in timing.items():
            entries[name]["latency_ms"] = {**entries[name].get("latency_ms", {}), **values.pop("latency_ms")}
            entries[name].update(values)
    report = build_report(entries, config.report, accelerator=accelerator,
                          stages=stage_seconds(out, stages, len(config.student.pruning.stages)),
                          chance=chance, run=run, timed=timed,
                          sections=spec.type.report_sections(spec, {name: e["dev"] for name, e in entries.items()}))
    if write:
        write_report(report, out)
    return report


def run_record(spec: TaskSpec, source: DataSource, out: Path) -> dict:
    """What a run used, for its report and card: the task, the data (:class:`distill.tasks.data.DataSource` with its
    description) and the config file."""
    return {"task": spec.name, "data": source.public(), "config": f"{out.name}/config.json"}


def publish_stage(config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict, out: Path, report: dict,
                  recipe: list[str], command: str) -> None:
    """What ships with the student: ONNX files checked on the dev set (``export.onnx``), the model card
    (``student/README.md``) and, with ``export.push_to_hub``, the upload."""
    folder = out / "student"
    export = (export_student(folder, spec, data["dev"], config.task.max_seq_length, config.export.int8)
              if config.export.onnx else None)
    rows = []
    for name, entry in report["models"].items():
        label = (f"teacher (`{public_name(config.teacher.model or config.teacher.base_model)}`, fine-tuned)"
                 if name == "teacher" else "student")
        rows.append({"name": label, "dev": entry["dev"], "num_parameters": entry["num_parameters"],
                     "size_mb": entry["size_mb"], "faster_by": entry["ratios"]["faster_by"],
                     "faster_by_range": entry["ratios"].get("faster_by_range"),
                     "retained": entry["ratios"]["metric_retained"], "latency_ms": entry["latency_ms"]})
    card = student_card(name=f"{Path(config.output_dir).name}-student", spec=spec,
                        teacher=config.teacher.model or config.teacher.base_model, rows=rows, recipe=recipe,
                        command=command, export=export, license=config.export.license,
                        data=(report.get("run") or {}).get("data"), chance=report.get("chance"),
                        latency_note=latency_note(report["timing"]))
    card.save(folder / "README.md")
    if config.export.push_to_hub:
        push_to_hub(folder, config.export.push_to_hub)


def rescored(record: dict, folder: Path, config: PipelineConfig, spec: TaskSpec, data: datasets.DatasetDict,
             device: torch.device) -> dict:
    """A finished teacher or student stage's record with dev metrics of the current scorer: a record that lacks a
    metric the task names now, or one its type adds to the seeds summary (scored by an older version, e.g. NER before
    ``f1_strict`` stood beside the standard ``f1``, or before the dev set's report half), is scored again from the
    saved model by the main process, and its ``stage.json`` updated (run id and wall time kept; a teacher's
    fine-tuning history, scored the old way, dropped), so the report never compares a teacher and a student scored
    two ways."""
    def missing(found: dict | None) -> list[str]:
        names = (*spec.metrics, half_key(REPORT, spec.metrics[0]),  # a teacher has no teacher_index/ metrics
                 *(name for name in spec.type.summary_metrics if not name.startswith(f"{PAIRED}/")))
        return list(names) if found is None else [name for name in names if name not in found.get("dev", {})]

    stale = missing(record)
    if not stale:
        return record
    if not is_main_process():  # the main process scores it; the others read the record it writes
        return wait_for(folder, lambda: None if missing(found := recorded(folder, record["run_id"])) else found)
    with failure_marked(folder):
        logger.info("%s: its dev metrics predate %s; scoring the saved model again", folder, ", ".join(stale))
        model = spec.type.model_class(spec).from_pretrained(folder).eval().to(device)
        metrics = evaluate_task(model, data, load_tokenizer(str(folder)), spec, config.task.max_seq_length,
                                device=device)
        kept = {key: value for key, value in record.items() if key not in ("dev", "selection")}
        # scores against the teacher (a sentence encoder's in its space) are of the same weights: kept as they were
        paired = {key: value for key, value in record.get("dev", {}).items() if PAIRED in key}
        updated = {**kept, "dev": {**paired, **metrics}, "rescored": True, **ship_tuned(folder, model, spec, metrics)}
        write_json_atomic(folder / STAGE_FILE, updated)
    return updated
