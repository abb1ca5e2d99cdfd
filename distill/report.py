"""Size, speed and accuracy of teacher and students side by side: ``report.json`` and ``report.md``.

Latency is the wall time of one forward pass (no gradients, eval mode) on random token ids of a fixed length,
median (and p90) over repeated runs after warm-up. Models are timed interleaved (each repeat runs every model once)
so that machine noise spreads evenly over them.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from distill.checkpoint import write_json_atomic
from distill.config import METRICS, ReportConfig
from distill.device import synchronize


def size_mb(model_dir: Path) -> float:
    """On-disk size of the weight files (``*.safetensors``/``*.bin``) in ``model_dir``, in MB (10^6 bytes)."""
    files = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("pytorch_model*.bin"))
    return sum(f.stat().st_size for f in files) / 1e6


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Total parameters, and parameters outside the embedding layer (what compute scales with)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for p in model.get_input_embeddings().parameters())
    return {"num_parameters": total, "num_parameters_without_embeddings": total - embedding}


def _inputs(model: torch.nn.Module, batch_size: int, seq_length: int, generator: torch.Generator) -> dict:
    vocab = model.config.vocab_size
    ids = torch.randint(1000 if vocab > 2000 else 1, vocab, (batch_size, seq_length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@torch.no_grad()
def time_models(models: dict[str, torch.nn.Module], config: ReportConfig, device: torch.device | str = "cpu",
                prefix: str = "") -> dict[str, dict]:
    """Latency of each model at each batch size on ``device``, timed interleaved.

    Args:
        models: {name: model}; each is moved to ``device`` (the report owns these copies).
        config: batch sizes, length, warm-up and repeats, threads.
        device: where to time; on an accelerator each run is timed to its end (synchronised).
        prefix: put before each latency key (e.g. "cuda_" for the accelerator's timings).

    Returns:
        {name: {"latency_ms": {"<prefix>batch_1": {"median", "p90"}, ...}, "<prefix>samples_per_s": at the largest
        batch}}, milliseconds.
    """
    device = torch.device(device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    generator = torch.Generator().manual_seed(0)
    results: dict[str, dict] = {name: {"latency_ms": {}} for name in models}
    models = {name: model.eval().to(device) for name, model in models.items()}
    for batch_size in config.batch_sizes:
        inputs = {name: {k: v.to(device) for k, v in _inputs(m, batch_size, config.seq_length, generator).items()}
                  for name, m in models.items()}
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
            ordered = sorted(times)
            results[name]["latency_ms"][f"{prefix}batch_{batch_size}"] = {
                "median": statistics.median(ordered),
                "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            }
    largest = max(config.batch_sizes)
    for name in models:
        median = results[name]["latency_ms"][f"{prefix}batch_{largest}"]["median"]
        results[name][f"{prefix}samples_per_s"] = largest / (median / 1000)
    return results


# Stage folders of a pipeline output folder, in the order they run, with the names the report gives them.
STAGE_NAMES = {"teacher": "teacher", "mlm": "masked LM", "augmented": "augmentation", "general": "general distillation",
               "student_intermediate": "intermediate step", "teacher_logits": "teacher logits",
               "student": "prediction step"}


def stage_seconds(output_dir: Path, stages: list[str]) -> dict[str, dict]:
    """Wall time of each finished stage of a pipeline output folder, from the stages' records.

    Args:
        output_dir: the pipeline's output folder.
        stages: the stage folders this run used, in :data:`STAGE_NAMES` (a folder left from an earlier run with
            other settings, e.g. ``augmented/`` after augmentation was turned off, is not counted).

    Returns:
        {stage: {"seconds": wall seconds of the process that finished it, "resumed": whether that process resumed
        an earlier one's work}}, in :data:`STAGE_NAMES` order. General distillation: the time it took when it was
        made, possibly by another job that shares the cache. Stages without a recorded time (given, or finished by
        an older version) are left out.

    Raises:
        ValueError: a name in ``stages`` is not a stage folder.
    """
    unknown = set(stages) - set(STAGE_NAMES)
    if unknown:
        raise ValueError(f"not stage folders: {sorted(unknown)}; known: {list(STAGE_NAMES)}")
    found = {}
    for folder in (name for name in STAGE_NAMES if name in stages):
        path = Path(output_dir) / ("general.json" if folder == "general" else f"{folder}/stage.json")
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        if record.get("seconds") is not None:
            found[folder] = {"seconds": float(record["seconds"]), "resumed": bool(record.get("resumed", False))}
    return found


def build_report(entries: dict[str, dict], config: ReportConfig, reference: str = "teacher",
                 accelerator: str | None = None, stages: dict[str, dict] | None = None) -> dict:
    """Add ratios to the reference model (smaller by, faster by on the CPU, metric retained) and the timing setup
    (``accelerator``: the device type of the extra timings, if any; ``stages``: :func:`stage_seconds`)."""
    base = entries[reference]
    largest = f"batch_{max(config.batch_sizes)}"
    for entry in entries.values():
        entry["ratios"] = {
            "smaller_by": base["num_parameters"] / entry["num_parameters"],
            "faster_by": base["latency_ms"][largest]["median"] / entry["latency_ms"][largest]["median"],
            "metric_retained": _retained(entry["dev"], base["dev"]),
        }
    setup = {
        "seq_length": config.seq_length,
        "batch_sizes": config.batch_sizes,
        "num_repeats": config.num_repeats,
        "num_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "accelerator": accelerator,
        "stage_seconds": stages or {},
    }
    return {"models": entries, "timing": setup}


def _retained(metrics: dict, reference: dict) -> float | None:
    name = next(iter(reference), None)
    if name is None or not reference[name]:
        return None
    return metrics[name] / reference[name]


def write_report(report: dict, output_dir: Path) -> None:
    """Write ``report.json`` (one entry per model: its dev metrics such as ``accuracy``, ``num_parameters``,
    ``size_mb``, ``latency_ms`` per batch size, ``samples_per_s``, ratios to the teacher, the timing setup with
    ``stage_seconds`` (:func:`stage_seconds`), and for a teacher fine-tuned with model selection its ``selection``:
    dev scores while training, best step, last step's score) and ``report.md`` (the same as tables and notes)."""
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
            **{key: value for key, value in entry.items() if key.endswith("samples_per_s")},
            "throughput_batch_size": largest,
            "ratios": entry["ratios"],
            "path": entry.get("path"),
            "timing": report["timing"],
            **({"selection": entry["selection"]} if entry.get("selection") else {}),
        }
    write_json_atomic(output_dir / "report.json", flat)
    (output_dir / "report.md").write_text(markdown_table(flat, report["timing"]), encoding="utf-8")


def markdown_table(flat: dict, timing: dict) -> str:
    metric_names = [k for k in next(iter(flat.values())) if any(k == m or k.startswith(f"{m}_") for m in METRICS)]
    batches = list(next(iter(flat.values()))["latency_ms"])  # CPU "batch_B", then "<accelerator>_batch_B" if timed
    header = ["model", *metric_names, "params (M)", "size (MB)", *[f"latency {b.replace('_', ' ')} (ms)" for b in batches],
              "samples/s", "smaller by", "faster by", "metric retained"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, e in flat.items():
        retained = e["ratios"]["metric_retained"]
        cells = [name, *[f"{e[m]:.4f}" for m in metric_names], f"{e['num_parameters'] / 1e6:.1f}", f"{e['size_mb']:.1f}",
                 *[f"{e['latency_ms'][b]:.1f}" for b in batches], f"{e['samples_per_s']:.0f}",
                 f"{e['ratios']['smaller_by']:.2f}x", f"{e['ratios']['faster_by']:.2f}x",
                 "-" if retained is None else f"{100 * retained:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nLatency: median of {timing['num_repeats']} interleaved runs after warm-up, sequence length "
            f"{timing['seq_length']}, {timing['num_threads']} CPU threads, torch {timing['torch']}; samples/s, "
            f"'smaller by' and 'faster by' on the CPU at batch {max(timing['batch_sizes'])}.")
    if timing.get("accelerator"):
        note += f" Columns named {timing['accelerator']} batch B: the same timing on {timing['accelerator']}."
    selection = flat.get("teacher", {}).get("selection")
    return ("\n".join(lines) + "\n" + note + "\n" + (_selection_note(selection) if selection else "")
            + _stage_table(timing.get("stage_seconds") or {}))


def _selection_note(selection: dict) -> str:
    """The fine-tuned teacher against plain fine-tuning: the kept (best-scored) checkpoint and the last step's."""
    scores = dict((step, value) for step, value in selection["evaluations"])
    best, last_step = selection["best_step"], selection["evaluations"][-1][0]
    listed = ", ".join(f"step {step}: {value:.4f}" for step, value in selection["evaluations"])
    return (f"\nTeacher: dev {selection['metric']} scored while fine-tuning ({listed}); the best, step {best} "
            f"({scores[best]:.4f}), is kept. Plain fine-tuning for the same budget would ship the last step's model "
            f"(step {last_step}: {selection['last']:.4f}).\n")


def task_seconds(stages: dict[str, dict]) -> float:
    """Wall seconds of a job's task stages (:func:`stage_seconds`), general distillation left out: it is made once
    and reused by every task."""
    return sum(entry["seconds"] for name, entry in stages.items() if name != "general")


def _stage_table(stages: dict[str, dict]) -> str:
    if not stages:
        return ""
    rows = [f"| {STAGE_NAMES[name]}{' (resumed)' if entry['resumed'] else ''} | {entry['seconds'] / 60:.1f} |"
            for name, entry in stages.items()]
    return ("\n| stage | wall time (min) |\n|---|---|\n" + "\n".join(rows)
            + f"\n| task stages in all | {task_seconds(stages) / 60:.1f} |\n"
            "\nWall time of the process that finished each stage (a resumed stage counts from its resume)"
            + ("; general distillation was made once, when first needed, and is reused from its cache by every task, so "
               "it is not in the total." if "general" in stages else ".") + "\n")


def load_report(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "report.json").read_text(encoding="utf-8"))
