"""Size, speed and accuracy of teacher and students side by side: ``report.json`` and ``report.md``.

Latency is the wall time of one forward pass (no gradients, eval mode) on random token ids of a fixed length:
median, p10 and p90 over repeated runs after warm-up, so every number comes with its spread. Models are timed
interleaved (each repeat runs every model once) so that machine noise spreads evenly over them. A finished pipeline
run again reuses the timing its report.json holds while the models and the timing setup are the same (see
:func:`timing_key`), rather than printing new numbers for the same models.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from distill.method.checkpoint import write_json_atomic
from distill.tasks import headline_metrics
from distill.tasks.split import REPORT, TUNING, half_key
from distill.config import ReportConfig, to_dict
from distill.device import synchronize, torch_threads
from teachers.finetune import CHANCE_MARGIN

logger = logging.getLogger(__name__)

# Latency spread, (p90 - p10) / median, above which the report warns that the numbers are noisy.
MAX_SPREAD = 0.25


def weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint folder (``*.safetensors``/``pytorch_model*.bin``) and of a
    sentence-transformers Dense module in it (the map a sentence encoder runs after its pooling), sorted."""
    return sorted([*model_dir.glob("*.safetensors"), *model_dir.glob("pytorch_model*.bin"),
                   *model_dir.glob("*_Dense/*.safetensors")])


def size_mb(model_dir: Path) -> float:
    """On-disk size of :func:`weight_files` in ``model_dir``, in MB (10^6 bytes)."""
    return sum(f.stat().st_size for f in weight_files(model_dir)) / 1e6


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Total parameters, and parameters outside the embedding layer (what compute scales with)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for p in model.get_input_embeddings().parameters())
    return {"num_parameters": total, "num_parameters_without_embeddings": total - embedding}


@torch.no_grad()
def time_models(models: dict[str, torch.nn.Module], config: ReportConfig, device: torch.device | str = "cpu",
                prefix: str = "", *, task_type) -> dict[str, dict]:
    """Latency of each model at each batch size on ``device``, timed interleaved.

    Args:
        models: {name: model}; each is moved to ``device`` (the report owns these copies).
        task_type: the task's :class:`distill.tasks.TaskType`, whose :meth:`~distill.tasks.TaskType.example_inputs`
            are the inputs timed (random ids of the model's vocabulary, every position real).
        config: batch sizes, length, warm-up and repeats, threads.
        device: where to time; on an accelerator each run is timed to its end (synchronised).
        prefix: put before each latency key (e.g. "cuda_" for the accelerator's timings).

    Returns:
        {name: {"latency_ms": {"<prefix>batch_1": {"median", "p10", "p90", "spread"}, ...}, "<prefix>samples_per_s":
        at the largest batch}}: milliseconds; percentiles interpolated between the sorted runs; spread
        (p90 - p10) / median.
    """
    device = torch.device(device)
    with torch_threads(config.num_threads):
        generator = torch.Generator().manual_seed(0)
        results: dict[str, dict] = {name: {"latency_ms": {}} for name in models}
        models = {name: model.eval().to(device) for name, model in models.items()}
        for batch_size in config.batch_sizes:
            inputs = {name: {k: v.to(device) for k, v in task_type.example_inputs(
                m.config, batch_size, config.seq_length, generator).items()} for name, m in models.items()}
            for _ in range(config.num_warmup):
                for name, model in models.items():
                    model(**inputs[name])
            synchronize(device)
            samples: dict[str, list[float]] = {name: [] for name in models}
            for _ in range(config.num_repeats):
                for name, model in models.items():
                    start = time.perf_counter()
                    model(**inputs[name])
                    synchronize(device)
                    samples[name].append((time.perf_counter() - start) * 1000)
            for name, times in samples.items():
                results[name]["latency_ms"][f"{prefix}batch_{batch_size}"] = latency_summary(times)
        largest = max(config.batch_sizes)
        for name in models:
            median = results[name]["latency_ms"][f"{prefix}batch_{largest}"]["median"]
            results[name][f"{prefix}samples_per_s"] = largest / (median / 1000)
        return results


def latency_summary(times: list[float]) -> dict[str, float]:
    """Median, p10, p90 (linear interpolation between the sorted values; one value: all three) and spread
    (p90 - p10) / median of repeated timings, in their unit."""
    ordered = sorted(times)
    if len(ordered) > 1:
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    else:
        p10 = p90 = ordered[0]
    median = statistics.median(ordered)
    return {"median": median, "p10": p10, "p90": p90, "spread": (p90 - p10) / median if median > 0 else 0.0}


def timing_key(models: dict[str, str], config: ReportConfig, accelerator: str | None) -> dict:
    """What a stored timing depends on: the timed models (name -> the run id of the stage that made it), the timing
    settings, the accelerator timed on and the machine (host, CPU count, torch threads and version). Two runs with
    the same key time the same models the same way, so a re-run reuses the stored numbers."""
    return {"models": dict(models), "settings": to_dict(config), "accelerator": accelerator,
            "machine": {"host": platform.node(), "cpu_count": os.cpu_count(),
                        "num_threads": config.num_threads or torch.get_num_threads(),
                        "torch": torch.__version__}}


def stored_timing(output_dir: Path, key: dict) -> dict[str, dict] | None:
    """The timing in ``output_dir/report.json`` when it was made under ``key`` (:func:`timing_key`), as
    :func:`time_models` returns it (every prefix together) plus "timed_at"; None when there is none or the key
    differs."""
    path = Path(output_dir) / "report.json"
    if not path.is_file():
        return None
    try:
        flat = json.loads(path.read_text(encoding="utf-8"))
        if any(entry["timing"].get("key") != key or "latency" not in entry for entry in flat.values()):
            return None
        return {name: {"latency_ms": entry["latency"], "timed_at": entry["timing"]["timed_at"],
                       **{k: v for k, v in entry.items() if k.endswith("samples_per_s")}}
                for name, entry in flat.items() if name in key["models"]}
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError):
        return None  # a report of an older version: time again


def chance_note(role: str, dev: dict, chance: dict | None) -> str | None:
    """Why a retained share would mean nothing: the model (``role``, "teacher" or "student") is at, below or within
    :data:`CHANCE_MARGIN` of chance on the primary metric. None when it is clear of chance.

    Args:
        dev: the model's dev metrics.
        chance: :func:`teachers.finetune.chance`'s record ({"metric", "value", "basis"}), or None (not known).
    """
    if chance is None or chance["metric"] not in dev:
        return None
    value, level = dev[chance["metric"]], chance["value"]
    if value >= level + CHANCE_MARGIN:
        return None
    if abs(value - level) < 0.005:
        return f"{role} at chance ({value:.3f} = {chance['basis']})"
    where = "below" if value < level else f"within {CHANCE_MARGIN:g} of"
    return f"{role} {where} chance ({value:.3f}; chance {level:.3f} = {chance['basis']})"


# Stage folders of a pipeline output folder, in the order they run, with the names the report gives them.
STAGE_NAMES = {"teacher": "teacher", "mlm": "masked LM", "augmented": "augmentation", "general": "general distillation",
               "pruning": "pruning in stages (each pruned and distilled)", "pruned": "pruning", "teacher_outputs": "teacher outputs (cached)", "student_intermediate": "intermediate step", "teacher_logits": "teacher logits",
               "student": "prediction step"}


def stage_seconds(output_dir: Path, stages: list[str], pruning_stages: int = 0) -> dict[str, dict]:
    """Wall time of each finished stage of a pipeline output folder, from the stages' records.

    Args:
        output_dir: the pipeline's output folder.
        stages: the stage folders this run used, in the order it ran them (:func:`distill.job.table.stage_folders`;
            a folder left from an earlier run with other settings, e.g. ``augmented/`` after augmentation was turned
            off, is not counted). :data:`STAGE_NAMES` names them in the report (another folder by its own name).
        pruning_stages: how many stages of pruning in stages the run has (``pruning/stage-1`` ... ``stage-N``, summed
            as "pruning"; a stage folder left from a run with more stages is not counted).

    Returns:
        {stage: {"seconds": wall seconds of the process that finished it, "resumed": whether that process resumed
        an earlier one's work}}, in ``stages``' order. General distillation: the time it took when it was
        made, possibly by another job that shares the cache. Stages without a recorded time (given, or finished by
        an older version) are left out.
    """
    found = {}
    for folder in dict.fromkeys(stages):
        if folder == "pruning":  # the stages before the student's own pruning, each with its three steps
            paths = [Path(output_dir) / "pruning" / f"stage-{number}" / step / "stage.json"
                     for number in range(1, pruning_stages + 1) for step in ("pruned", "student_intermediate", "student")]
            records = [json.loads(p.read_text(encoding="utf-8")) for p in paths if p.is_file()]
            if records and len(records) == len(paths) and all(r.get("seconds") is not None for r in records):
                found[folder] = {"seconds": sum(float(r["seconds"]) for r in records),
                                 "resumed": any(r.get("resumed", False) for r in records)}
            continue
        path = Path(output_dir) / ("general.json" if folder == "general" else f"{folder}/stage.json")
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if record.get("seconds") is not None:
            found[folder] = {"seconds": float(record["seconds"]), "resumed": bool(record.get("resumed", False))}
    return found


def build_report(entries: dict[str, dict], config: ReportConfig, reference: str = "teacher",
                 accelerator: str | None = None, stages: dict[str, dict] | None = None, chance: dict | None = None,
                 run: dict | None = None, timed: dict | None = None, sections: list[str] | None = None) -> dict:
    """Add ratios to the reference model (smaller by, faster by on the CPU with its range, metric retained) and the
    timing setup.

    Args:
        entries: {name: {"dev", "num_parameters", "latency_ms": {key: :func:`latency_summary`}, ...}}.
        config: the report settings.
        reference: the entry the ratios compare with (the teacher).
        accelerator: the device type of the extra timings, if any.
        stages: :func:`stage_seconds`.
        chance: :func:`teachers.finetune.chance`'s record: a model at or near chance gets no retained share
            (``metric_retained`` None) but a ``retained_note`` saying why.
        run: {"task", "data" (a :class:`distill.tasks.data.DataSource` as a dict, with "description"), "config" (path)}.
        timed: {"key": :func:`timing_key`, "timed_at": ISO time, "reused": bool}: when and under what the latency was
            measured.
        sections: markdown the task's type adds after the table (:meth:`distill.tasks.TaskType.report_sections`).

    Returns:
        {"models": entries with "ratios" ("faster_by_range": [teacher p10 / model p90, teacher p90 / model p10]) and
        "retained_note", "timing": the setup, "run": ``run``, "chance": ``chance``}.
    """
    base = entries[reference]
    largest = f"batch_{max(config.batch_sizes)}"
    reference_note = chance_note(reference, base["dev"], chance)
    for name, entry in entries.items():
        theirs, ours = base["latency_ms"][largest], entry["latency_ms"][largest]
        note = reference_note or chance_note(name, entry["dev"], chance)
        entry["ratios"] = {
            "smaller_by": base["num_parameters"] / entry["num_parameters"],
            "faster_by": theirs["median"] / ours["median"],
            "faster_by_range": [theirs.get("p10", theirs["median"]) / ours.get("p90", ours["median"]),
                                theirs.get("p90", theirs["median"]) / ours.get("p10", ours["median"])],
            "metric_retained": None if note else _retained(entry["dev"], base["dev"]),
            "metric_retained_tuning": None if note else _retained(entry["dev"], base["dev"], TUNING),
            "metric_retained_dev": None if note else _retained(entry["dev"], base["dev"], None),
        }
        entry["retained_note"] = note and f"n/a — {note}"
    for message in dict.fromkeys(e["retained_note"] for e in entries.values() if e["retained_note"]):
        logger.warning("report: metric retained %s", message)
    noisy = _noisy(entries)
    for line in noisy:
        logger.warning("report: latency spread is large: %s; the numbers are noisy (a busy machine?), time again on "
                       "an idle one or raise report.num_repeats", line)
    setup = {
        "seq_length": config.seq_length,
        "batch_sizes": config.batch_sizes,
        "num_repeats": config.num_repeats,
        "num_threads": config.num_threads or torch.get_num_threads(),  # what the timing ran at, reused or not
        "torch": torch.__version__,
        "accelerator": accelerator,
        "stage_seconds": stages or {},
        "max_spread": MAX_SPREAD,
        "noisy": noisy,
        **(timed or {}),
    }
    return {"models": entries, "timing": setup, "run": run, "chance": chance, "sections": list(sections or [])}


def _noisy(entries: dict[str, dict]) -> list[str]:
    """Each timing whose spread (p90 - p10) / median is above :data:`MAX_SPREAD`, in words."""
    return [f"{name} {key.replace('_', ' ')}: {t['median']:.1f} ms, p10-p90 {t['p10']:.1f}-{t['p90']:.1f} "
            f"(spread {t['spread']:.2f})"
            for name, entry in entries.items() for key, t in entry["latency_ms"].items()
            if t.get("spread", 0.0) > MAX_SPREAD]


def _retained(metrics: dict, reference: dict, half: str | None = REPORT) -> float | None:
    """The model's primary metric over the reference's, on the dev set's ``half`` where both were scored on it (None:
    the whole dev set); None where the reference's is 0."""
    name = next(iter(reference), None)
    if name is not None and half is not None and half_key(half, name) in reference and half_key(half, name) in metrics:
        name = half_key(half, name)
    if name is None or not reference[name]:
        return None
    return metrics[name] / reference[name]


def write_report(report: dict, output_dir: Path) -> None:
    """Write ``report.json`` (one entry per model: its dev metrics such as ``accuracy``, ``num_parameters``,
    ``size_mb``, ``latency_ms`` (median) and ``latency_p90_ms`` per batch size, ``latency`` (median, p10, p90,
    spread), ``samples_per_s``, ``path`` (the model's folder, relative to the report's), ratios to the teacher
    (``retained_note`` where a retained share means nothing), the
    timing setup with ``stage_seconds`` (:func:`stage_seconds`) and the timing key, the run (task, data, config),
    chance, and for a teacher fine-tuned with model selection its ``selection``: dev scores while training, best step,
    last step's score) and ``report.md`` (the same as tables and notes)."""
    flat = {}
    for name, entry in report["models"].items():
        largest = max(report["timing"]["batch_sizes"])
        flat[name] = {
            **entry["dev"],
            "num_parameters": entry["num_parameters"],
            "num_parameters_without_embeddings": entry["num_parameters_without_embeddings"],
            "size_mb": entry["size_mb"],
            "latency_ms": {k: v["median"] for k, v in entry["latency_ms"].items()},
            "latency_p90_ms": {k: v["p90"] for k, v in entry["latency_ms"].items()},
            "latency": entry["latency_ms"],
            **{key: value for key, value in entry.items() if key.endswith("samples_per_s")},
            "throughput_batch_size": largest,
            "ratios": entry["ratios"],
            "retained_note": entry.get("retained_note"),
            "path": entry.get("path"),
            "timing": report["timing"],
            "run": report.get("run"),
            "chance": report.get("chance"),
            **({"selection": entry["selection"]} if entry.get("selection") else {}),
        }
    write_json_atomic(output_dir / "report.json", flat)
    (output_dir / "report.md").write_text(markdown_table(flat, report["timing"], report.get("run"),
                                                         report.get("sections")), encoding="utf-8")


def markdown_table(flat: dict, timing: dict, run: dict | None = None, sections: list[str] | None = None) -> str:
    """``report.md``: what was run (task, data, config), the table of models, the task type's sections (its measures
    beyond the table's columns), and notes on timing, noise, the teacher's selection and the stages' wall times."""
    first = next(iter(flat.values()))
    whole = headline_metrics(first)
    halved = bool(whole) and all(half_key(REPORT, whole[0]) in e for e in flat.values())  # every model scored so
    # the report half first (what is reported), then the whole dev set and the tuning half (what settings saw)
    metric_names = ([half_key(REPORT, m) for m in whole if half_key(REPORT, m) in first] if halved else []) + whole + (
        [half_key(TUNING, m) for m in whole if half_key(TUNING, m) in first] if halved else [])
    batches = list(first["latency_ms"])  # CPU "batch_B", then "<accelerator>_batch_B" if timed
    header = ["model", *metric_names, "params (M)", "size (MB)",
              *[f"latency {b.replace('_', ' ')} (ms, p10-p90)" for b in batches],
              "samples/s", "smaller by", "faster by (range)",
              "metric retained (report half; tuning half)" if halved else "metric retained"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, e in flat.items():
        retained, tuning = e["ratios"]["metric_retained"], e["ratios"].get("metric_retained_tuning")
        spread = e.get("latency", {})
        low, high = e["ratios"].get("faster_by_range", [None, None])
        share = "-" if retained is None else f"{100 * retained:.1f}%"
        if halved and tuning is not None:
            share += f" ({100 * tuning:.1f}%)"
        cells = [name, *[f"{e[m]:.4f}" if m in e else "-" for m in metric_names], f"{e['num_parameters'] / 1e6:.1f}",
                 f"{e['size_mb']:.1f}",
                 *[f"{e['latency_ms'][b]:.1f}" + (f" ({spread[b]['p10']:.1f}-{spread[b]['p90']:.1f})" if b in spread else "")
                   for b in batches], f"{e['samples_per_s']:.0f}",
                 f"{e['ratios']['smaller_by']:.2f}x",
                 f"{e['ratios']['faster_by']:.2f}x" + (f" ({low:.2f}-{high:.2f}x)" if low is not None else ""),
                 e.get("retained_note") or share]
        lines.append("| " + " | ".join(cells) + " |")
    if halved:
        lines.append(f"\nDev metrics on the dev set's report half (`{REPORT}/...`), on the whole dev set, and on its "
                     f"tuning half (`{TUNING}/...`), the half on which settings such as the teacher's kept checkpoint "
                     "and a decision threshold are chosen; the halves split dev by a hash of each example's text "
                     "(docs/design.md). The retained share is on the report half, the tuning half's in brackets.")
    note = (f"\nLatency: median and p10-p90 of {timing['num_repeats']} interleaved runs after warm-up, sequence length "
            f"{timing['seq_length']}, {timing['num_threads']} CPU threads, torch {timing['torch']}; samples/s, "
            f"'smaller by' and 'faster by' on the CPU at batch {max(timing['batch_sizes'])} ('faster by' range: the "
            "teacher's p10 over the model's p90 to the teacher's p90 over the model's p10).")
    if timing.get("accelerator"):
        note += f" Columns named {timing['accelerator']} batch B: the same timing on {timing['accelerator']}."
    if timing.get("timed_at"):
        note += (f" Timed {timing['timed_at']}" + (": the stored timing of these same models, reused (delete "
                 "report.json to time again)." if timing.get("reused") else "."))
    if timing.get("noisy"):
        note += (f"\n\n**Warning: noisy timing.** The spread (p90 - p10) / median is above {timing['max_spread']:g} for "
                 + "; ".join(timing["noisy"]) + ". Time again on an idle machine, or raise report.num_repeats.")
    selection = flat.get("teacher", {}).get("selection")
    extra = "".join(f"\n{section}\n" for section in sections or [])
    return (_run_header(run) + "\n".join(lines) + "\n" + extra + note + "\n"
            + (_selection_note(selection) if selection else "") + _stage_table(timing.get("stage_seconds") or {}))


def _run_header(run: dict | None) -> str:
    """The title and what was run: task, data (source and examples used), config file."""
    if not run:
        return ""
    return (f"# Report: {run['task']}\n\n- task: {run['task']}\n- data: {run['data']['description']}\n"
            f"- config: {run['config']}\n\n")


def _selection_note(selection: dict) -> str:
    """The fine-tuned teacher against plain fine-tuning: the kept (best-scored) checkpoint and the last step's."""
    scores = dict((step, value) for step, value in selection["evaluations"])
    best, last_step = selection["best_step"], selection["evaluations"][-1][0]
    listed = ", ".join(f"step {step}: {value:.4f}" for step, value in selection["evaluations"])
    metric = selection["metric"].replace("tuning/", "") + (" on the dev set's tuning half"
                                                           if selection["metric"].startswith("tuning/") else "")
    return (f"\nTeacher: dev {metric} scored while fine-tuning ({listed}); the best, step {best} "
            f"({scores[best]:.4f}), is kept. Plain fine-tuning for the same budget would ship the last step's model "
            f"(step {last_step}: {selection['last']:.4f}).\n")


def task_seconds(stages: dict[str, dict]) -> float:
    """Wall seconds of a job's task stages (:func:`stage_seconds`), general distillation left out: it is made once
    and reused by every task."""
    return sum(entry["seconds"] for name, entry in stages.items() if name != "general")


def _stage_table(stages: dict[str, dict]) -> str:
    if not stages:
        return ""
    rows = [f"| {STAGE_NAMES.get(name, name)}{' (resumed)' if entry['resumed'] else ''} | {entry['seconds'] / 60:.1f} |"
            for name, entry in stages.items()]
    return ("\n| stage | wall time (min) |\n|---|---|\n" + "\n".join(rows)
            + f"\n| task stages in all | {task_seconds(stages) / 60:.1f} |\n"
            "\nWall time of the process that finished each stage (a resumed stage counts from its resume)"
            + ("; general distillation was made once, when first needed, and is reused from its cache by every task, so "
               "it is not in the total." if "general" in stages else ".") + "\n")


def load_report(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "report.json").read_text(encoding="utf-8"))
