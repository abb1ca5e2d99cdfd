"""`benchmark`: size, speed and accuracy of a teacher and its students side by side, with compressed variants.

Every model is a row; each compression variant of a model is one more row, with its own accuracy measured:

- ``int8``: PyTorch dynamic quantization of the linear layers (``torch.ao.quantization.quantize_dynamic``, int8
  weights, activations quantized per batch at run time);
- ``onnx``: the model exported with ``torch.onnx.export`` (dynamo exporter, dynamic batch and length) and run with
  ONNX Runtime (CPU execution provider);
- ``onnx-int8``: that graph through ONNX Runtime's dynamic quantization (``onnxruntime.quantization.quantize_dynamic``,
  int8 weights).

Those rows run on the CPU. When the run's device (:func:`distill.device.run_device`) is an accelerator, every model
gets two more rows there: ``<device>`` (fp32, e.g. ``cuda``) and ``<device>-fp16`` (the weights in half precision),
each evaluated and timed on that device (timed to the end of each run); their 'faster by' compares with the
teacher's row of the same variant, and peak memory is not measured for them.

Latency is the wall time of one forward pass (eval mode, no gradients) on random token ids of a fixed batch size and
length. All rows are timed in one process, interleaved (each repeat runs every row once), after warm-up; runs repeat
until the spread ``(p90 - median) / median`` of every row is at most ``max_spread`` (after ``min_repeats``),
``max_repeats`` is reached, or the setting's share of ``time_budget_s`` is spent (after :data:`MIN_TIMED_RUNS`), so a
benchmark of many rows or slow models takes about its budget; each row's spread and repeats are reported. Peak memory is the resident memory of a fresh process that loads the row's model and
runs one inference at the largest batch and length, above that process's memory before loading (Linux; the process
is forked from a server that imported the libraries once, so the libraries' code is not counted, nor re-imported).

Outputs: ``benchmark.json`` (everything), ``benchmark.csv`` (one line per row), ``benchmark.md`` (table) and
``benchmark.png`` (metric against latency, marker area by parameters, Pareto frontier, teacher marked).
"""

from __future__ import annotations

import copy
import csv
import gc
import json
import logging
import math
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch

from distill.method.checkpoint import write_json_atomic
from distill.config import BenchmarkConfig
from distill.tasks.base import TaskSpec
from distill.tasks.data import tokenize
from distill.device import is_accelerator, run_device, synchronize, torch_threads
from distill.tasks.evaluate import compute_metrics, predict
from distill.tasks.split import REPORT, HalfScorer, half_key
from distill.publish.export import (
    FILES,
    ONNX_FOLDER,
    OnnxClassifier,
    around,
    export_onnx,
    graph_module,
    quantize_onnx,
    quantize_torch,
    reusable_export,
)
from distill.publish.memory import memory_worker
from distill.publish.report import chance_note, count_parameters, latency_summary, size_mb
from teachers.finetune import chance
from distill.tasks import check_model_head, load_head_model, saved_settings

logger = logging.getLogger(__name__)


@dataclass
class Row:
    """One line of the benchmark: a model or a compressed variant of one."""

    name: str  # e.g. "student_4l312" or "student_4l312 (onnx-int8)"
    model_name: str  # the model it comes from
    variant: str  # "pytorch", "int8", "onnx", "onnx-int8" (CPU), or "<device type>", "<device type>-fp16"
    model: object  # callable(**inputs) -> object with .logits
    artefact: Path  # what it loads from: a checkpoint folder, an .onnx or a .pt file
    size_mb: float
    parameters: dict[str, int]
    init: str = ""
    results: dict = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where it runs


def model_rows(name: str, folder: Path, init: str, config: BenchmarkConfig, work: Path, max_length: int,
               device: torch.device, spec: TaskSpec) -> list[Row]:
    """The row of a checkpoint, one row per compression variant in ``config.compress``, and when ``device`` is an
    accelerator its fp32 and fp16 rows there (``spec``: the task, whose type reads the head's outputs of an export)."""
    model = load_head_model(folder).eval()
    parameters = count_parameters(model)
    rows = [Row(name, name, "pytorch", model, folder, size_mb(folder), parameters, init)]
    if is_accelerator(device):
        for variant, dtype in ((device.type, torch.float32), (f"{device.type}-fp16", torch.float16)):
            moved = copy.deepcopy(model).to(device=device, dtype=dtype)
            rows.append(Row(f"{name} ({variant})", name, variant, moved, folder,
                            size_mb(folder) * (0.5 if dtype == torch.float16 else 1.0), parameters, init, device=device))
    if "int8" in config.compress:
        quantized = quantize_torch(model)
        path = work / f"{name}.int8.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(quantized.state_dict(), path)
        rows.append(Row(f"{name} (int8)", name, "int8", quantized, path, path.stat().st_size / 1e6, parameters, init))
    wanted = [variant for variant in ("onnx", "onnx-int8") if variant in config.compress]
    if wanted:
        record = reusable_export(folder)
        if record is not None and all(FILES[v] in record["files"] and record["max_seq_length"] >= max_length
                                      for v in wanted):
            paths = {v: folder / ONNX_FOLDER / FILES[v] for v in wanted}  # the student's own deployable files
            logger.info("%s: timing the exported files in %s", name, folder / ONNX_FOLDER)
        else:
            paths = {"onnx": work / f"{name}.onnx", "onnx-int8": work / f"{name}.int8.onnx"}
            difference = export_onnx(graph_module(model), paths["onnx"], max_length, spec.type)
            logger.info("%s: exported to %s (max |logit difference| %.1e)", name, paths["onnx"], difference)
            if "onnx-int8" in wanted:
                quantize_onnx(paths["onnx"], paths["onnx-int8"])
        for variant in wanted:
            path = paths[variant]
            session = around(model, OnnxClassifier(path, config.num_threads))  # a map after the graph runs here
            rows.append(Row(f"{name} ({variant})", name, variant, session, path, path.stat().st_size / 1e6,
                            parameters, init))
    return rows


def _random_inputs(spec: TaskSpec, config, batch_size: int, length: int, seed: int) -> dict:
    """The task type's example inputs (:meth:`distill.tasks.TaskType.example_inputs`) of ``config``'s vocabulary,
    drawn from a generator seeded with ``seed``."""
    return spec.type.example_inputs(config, batch_size, length, torch.Generator().manual_seed(seed))


MIN_TIMED_RUNS = 3  # the fewest timed runs a setting gets under the time budget: a median and a p90 to read


@torch.no_grad()
def time_rows(rows: list[Row], config: BenchmarkConfig, spec: TaskSpec, model_config) -> dict[str, dict]:
    """Latency of every row at every (batch size, length), interleaved, repeated until the spread is small, the cap
    is reached or the setting's share of ``config.time_budget_s`` (warm-up included) is spent; a row on an accelerator
    gets its inputs there and is timed to the end of its run.

    Returns:
        {row name: {"b{B}_t{T}": {"median_ms", "p90_ms", "spread", "repeats"}}}.
    """
    results: dict[str, dict] = {row.name: {} for row in rows}
    settings = len(config.batch_sizes) * len(config.seq_lengths)
    share = None if config.time_budget_s is None else config.time_budget_s / settings  # seconds per setting
    for batch_size in config.batch_sizes:
        for length in config.seq_lengths:
            key = f"b{batch_size}_t{length}"
            started = time.perf_counter()
            cpu_inputs = _random_inputs(spec, model_config, batch_size, length, seed=batch_size * 1000 + length)
            inputs = {row.name: {k: v.to(row.device) for k, v in cpu_inputs.items()} for row in rows}
            for _ in range(config.num_warmup):
                for row in rows:
                    row.model(**inputs[row.name])
                    synchronize(row.device)
            times: dict[str, list[float]] = {row.name: [] for row in rows}
            for repeat in range(config.max_repeats):
                for row in rows:
                    start = time.perf_counter()
                    row.model(**inputs[row.name])
                    synchronize(row.device)
                    times[row.name].append(1000 * (time.perf_counter() - start))
                if repeat + 1 >= config.min_repeats and all(_spread(t) <= config.max_spread for t in times.values()):
                    break
                if share is not None and repeat + 1 >= MIN_TIMED_RUNS and time.perf_counter() - started >= share:
                    break
            for name, values in times.items():
                results[name][key] = {"median_ms": statistics.median(values), "p90_ms": _p90(values),
                                      "spread": _spread(values), "repeats": len(values)}
            logger.info("timed batch %d, length %d: %d repeats in %.0f s, spread up to %.0f%%", batch_size, length,
                        len(values), time.perf_counter() - started,
                        100 * max(results[name][key]["spread"] for name in times))
    return results


def _p90(values: list[float]) -> float:
    """The 90th percentile, interpolated between the sorted values: the report's own (one value: itself)."""
    return latency_summary(values)["p90"]


def _spread(values: list[float]) -> float:
    median = statistics.median(values)
    return (_p90(values) - median) / median


def peak_memory(row: Row, source: Path, inputs: dict, threads: int | None) -> dict | None:
    """Resident memory of inference for one row, measured in a fresh process: {"model_mb", "peak_mb"}, or None
    where it cannot be measured (not Linux)."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    context = _memory_context()
    queue = context.Queue()
    process = context.Process(target=memory_worker, args=(row.variant, str(row.artefact), str(source), inputs,
                                                           threads, queue))
    process.start()
    try:
        return queue.get(timeout=600)
    finally:
        process.join()


def _memory_context() -> multiprocessing.context.BaseContext:
    """Where each row's fresh process comes from: a fork server that imported the worker's code (torch,
    ``transformers``, ONNX Runtime) once, so that a row's process starts in a fraction of a second instead of importing
    them again; each row still gets its own process, forked from one that never ran a model. Falls back to ``spawn``
    where there is no fork server (not POSIX)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["distill.publish.memory"])  # read when the server starts (once a process)
    return context


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower x = latency, higher y = metric), by x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -float("inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def resolve_model_folder(path: Path, stage: str) -> tuple[Path, str]:
    """A checkpoint folder, or the output folder of a pipeline run (its ``stage`` subfolder is used): returns the
    checkpoint folder and how the model was initialised (from the run's ``config.json``, else "").

    Raises:
        FileNotFoundError: ``path`` is neither.
    """
    run_config = None
    if (path / stage / "config.json").is_file():  # a pipeline output folder
        run_config, path = path / "config.json", path / stage
    elif (path.parent / "report.json").is_file():  # the student/ folder inside one
        run_config = path.parent / "config.json"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no config.json) nor a pipeline output folder with "
                                f"{stage}/")
    init = ""
    if stage == "student" and run_config is not None and run_config.is_file():  # as the run's card says it
        from distill.config import load_config
        from distill.publish.card import describe_init

        try:
            job = load_config(run_config)
        except ValueError:  # a config of another version: its student section as written
            settings = json.loads(run_config.read_text(encoding="utf-8")).get("student", {})
            return path, f"from {settings['model']}" if settings.get("model") else settings.get("init", "")
        init = describe_init(job.student, job.distill.layer_map, job.general.enabled)
    return path, init


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... when it is taken (two ``.../student`` folders, a sweep entry's name):
    a benchmark row's name is its key, and a second model under one name would replace the first silently."""
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}_{number}"
    return candidate


def run_benchmark(
    teacher: Path, students: dict[str, tuple[Path, str]], spec: TaskSpec, dev, config: BenchmarkConfig,
    output_dir: Path, max_seq_length: int, device: torch.device | None = None,
) -> dict:
    """Measure every model and variant and write ``benchmark.{json,csv,md,png}`` to ``output_dir``.

    Args:
        teacher: the teacher's checkpoint folder (the reference of every ratio).
        students: {name: (checkpoint folder, how it was initialised)}.
        spec, dev: the task and its dev split (text columns and ``label``).
        config: what to time and which compressed variants to add.
        max_seq_length: tokens per dev example (as in training).
        device: the run's device (None: :func:`distill.device.run_device`); an accelerator adds its rows.

    Returns:
        The contents of ``benchmark.json``.

    Raises:
        ModelError: a model whose head does not fit the task (:func:`distill.tasks.check_model_head`).
    """
    device = torch.device(device) if device is not None else run_device()
    with torch_threads(config.num_threads):  # the count put back after, for whatever runs next in this process
        return _run_benchmark(teacher, students, spec, dev, config, output_dir, max_seq_length, device)


def _run_benchmark(teacher: Path, students: dict[str, tuple[Path, str]], spec: TaskSpec, dev,
                   config: BenchmarkConfig, output_dir: Path, max_seq_length: int, device: torch.device) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    models = {"teacher": (teacher, "fine-tuned"), **students}
    for name, (folder, _) in models.items():  # before any work: a model of another task is refused
        check_model_head(folder, spec, name)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = output_dir / "models"
    max_length = max([max_seq_length, *config.seq_lengths])
    rows: list[Row] = []
    for name, (folder, init) in models.items():
        logger.info("benchmark: preparing %s (%s)", name, folder)
        rows.extend(model_rows(name, folder, init, config, work, max_length, device, spec))
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    encoded = tokenize(dev, tokenizer, spec, max_seq_length)
    labels = encoded["labels"]  # (N,), or per example (T_i,) for token classification: compute_metrics takes both
    halves = HalfScorer(spec, datasets.DatasetDict({"dev": dev}), "dev", labels, tokenizer, max_seq_length)
    # a model that ships with settings chosen on dev's tuning half (a decision threshold) is scored with them, every
    # variant of it alike: what a user of the file gets
    shipped = {name: saved_settings(AutoConfig.from_pretrained(folder), spec) for name, (folder, _) in models.items()}
    for row in rows:
        outputs = predict(row.model, encoded, tokenizer, task_type=spec.type, device=row.device)
        fixed = shipped.get(row.model_name) or {}
        row.results["dev"] = compute_metrics(spec, outputs, labels, settings=fixed)
        row.results["dev"].update(halves.score(outputs, labels, lambda found, gold, context, settings: compute_metrics(
            spec, found, gold, context, settings), fixed))
        logger.info("%s: %s", row.name, _headline(spec, row.results["dev"]))
    reference = rows[0].model
    started = time.perf_counter()
    timing = time_rows(rows, config, spec, reference.config)
    timing_seconds = time.perf_counter() - started
    largest = f"b{max(config.batch_sizes)}_t{max(config.seq_lengths)}"
    sources = {row.model_name: row.artefact for row in rows if row.variant == "pytorch"}
    for row in rows:
        row.results["latency"] = timing[row.name]
        row.results["samples_per_s"] = max(config.batch_sizes) / (timing[row.name][largest]["median_ms"] / 1000)
        if config.memory and not is_accelerator(row.device):
            inputs = _random_inputs(spec, reference.config, max(config.batch_sizes), max(config.seq_lengths), seed=0)
            row.results["memory"] = peak_memory(row, sources[row.model_name], inputs, config.num_threads)
    report = _report(rows, spec, config, largest, device, output_dir, chance(spec, dev["label"]))
    report["setup"]["timing_seconds"] = timing_seconds
    write_benchmark(report, output_dir)
    return report


def _headline(spec: TaskSpec, dev: dict) -> str:
    """A model's dev scores in one line: the task's metrics on the report half and the whole dev set."""
    shown = [key for name in spec.metrics for key in (half_key(REPORT, name), name) if key in dev]
    return ", ".join(f"{key} {dev[key]:.4f}" for key in shown)


def _report(rows: list[Row], spec: TaskSpec, config: BenchmarkConfig, largest: str, device: torch.device,
            output_dir: Path, level: dict | None = None) -> dict:
    base = rows[0]
    # a teacher, or a model, at or near chance (``level``, the task's constant guess): no share means anything there,
    # as the pipeline's report says ("n/a")
    reference_note = chance_note("teacher", base.results["dev"], level)
    metric = spec.metrics[0]
    if half_key(REPORT, metric) in base.results["dev"]:  # the figure reported: the dev set's report half
        metric = half_key(REPORT, metric)
    teacher_rows = {row.variant: row for row in rows if row.model_name == base.model_name}
    entries = []
    for row in rows:
        memory = row.results.get("memory") or {}
        speed_base = teacher_rows[row.variant] if is_accelerator(row.device) else base
        note = reference_note or (chance_note(row.name, row.results["dev"], level) if row is not base else None)
        entries.append({
            "name": row.name, "model": row.model_name, "variant": row.variant, "init": row.init,
            "path": os.path.relpath(row.artefact, output_dir), **row.results["dev"],  # no path of this machine
            "num_parameters": row.parameters["num_parameters"],
            "num_parameters_without_embeddings": row.parameters["num_parameters_without_embeddings"],
            "size_mb": row.size_mb,
            "latency_ms": {k: v["median_ms"] for k, v in row.results["latency"].items()},
            "latency_p90_ms": {k: v["p90_ms"] for k, v in row.results["latency"].items()},
            "latency_spread": {k: v["spread"] for k, v in row.results["latency"].items()},
            "samples_per_s": row.results["samples_per_s"],
            "peak_memory_mb": memory.get("peak_mb"),
            "ratios": {
                "smaller_by": base.parameters["num_parameters"] / row.parameters["num_parameters"],
                "smaller_on_disk_by": base.size_mb / row.size_mb,
                "faster_by": (speed_base.results["latency"][largest]["median_ms"]
                              / row.results["latency"][largest]["median_ms"]),
                "metric_retained": None if note or not base.results["dev"][metric]
                else row.results["dev"][metric] / base.results["dev"][metric],
                "metric_retained_dev": None if note or not base.results["dev"][spec.metrics[0]]
                else row.results["dev"][spec.metrics[0]] / base.results["dev"][spec.metrics[0]],
            },
            "retained_note": note and f"n/a — {note}",
        })
    repeats = sorted({v["repeats"] for row in rows for v in row.results["latency"].values()})
    setup = {"task": spec.name, "metric": metric, "batch_sizes": config.batch_sizes, "seq_lengths": config.seq_lengths,
             "throughput_at": largest, "num_threads": torch.get_num_threads(), "repeats": repeats,
             "max_spread": config.max_spread, "time_budget_s": config.time_budget_s, "torch": torch.__version__,
             "cpu_count": os.cpu_count(),
             "accelerator": str(device) if is_accelerator(device) else None}
    return {"rows": entries, "setup": setup}


CSV_COLUMNS = ["name", "model", "variant", "init", "metric", "num_parameters", "num_parameters_without_embeddings",
               "size_mb", "samples_per_s", "peak_memory_mb", "smaller_by", "smaller_on_disk_by", "faster_by",
               "metric_retained"]


def write_benchmark(report: dict, output_dir: Path) -> None:
    """``benchmark.json``, ``benchmark.csv``, ``benchmark.md`` and ``benchmark.png`` from a report."""
    setup, rows = report["setup"], report["rows"]
    write_json_atomic(output_dir / "benchmark.json", report)
    latency_keys = list(rows[0]["latency_ms"])
    with (output_dir / "benchmark.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*CSV_COLUMNS, *[f"latency_{k}_ms" for k in latency_keys],
                         *[f"latency_{k}_p90_ms" for k in latency_keys],
                         *[f"latency_{k}_spread" for k in latency_keys]])
        for row in rows:
            flat = {**row, **row["ratios"], "metric": row[setup["metric"]]}
            writer.writerow([flat[c] for c in CSV_COLUMNS] + [row["latency_ms"][k] for k in latency_keys]
                            + [row["latency_p90_ms"][k] for k in latency_keys]
                            + [row["latency_spread"][k] for k in latency_keys])
    (output_dir / "benchmark.md").write_text(markdown(report), encoding="utf-8")
    plot(report, output_dir / "benchmark.png")


def markdown(report: dict) -> str:
    """The benchmark as a Markdown table with a note on how it was timed."""
    setup, rows = report["setup"], report["rows"]
    metric = setup["metric"]
    keys = list(rows[0]["latency_ms"])
    header = ["model", "init", metric, "params (M)", "params w/o emb. (M)", "size (MB)",
              *[f"ms {k.replace('_', ' ')}" for k in keys], "spread", "samples/s", "peak mem (MB)", "smaller by",
              "faster by", f"{metric} retained"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        retained = row["ratios"]["metric_retained"]
        memory = row["peak_memory_mb"]
        lines.append("| " + " | ".join([
            row["name"], row["init"], f"{row[metric]:.4f}", f"{row['num_parameters'] / 1e6:.1f}",
            f"{row['num_parameters_without_embeddings'] / 1e6:.1f}", f"{row['size_mb']:.1f}",
            *[f"{row['latency_ms'][k]:.1f}" for k in keys], _spread_cell(row, setup["max_spread"]),
            f"{row['samples_per_s']:.0f}",
            "-" if memory is None else f"{memory:.0f}",
            f"{row['ratios']['smaller_on_disk_by' if row['variant'] != 'pytorch' else 'smaller_by']:.2f}x",
            f"{row['ratios']['faster_by']:.2f}x",
            "n/a" if row.get("retained_note") else "-" if retained is None else f"{100 * retained:.1f}%",
        ]) + " |")
    budget = setup.get("time_budget_s")
    spent = f" in {setup['timing_seconds']:.0f} s" if setup.get("timing_seconds") is not None else ""
    note = (f"\n`ms bB tT`: median latency at batch B, length T; {setup['num_threads']} threads, torch "
            f"{setup['torch']}; rows timed interleaved in one process, {setup['repeats']} repeats{spent} (until (p90 - "
            f"median) / median <= {setup['max_spread']:.0%}, the cap"
            + (f" or the time budget of {budget:g} s" if budget else "") + "). `spread`: the row's largest (p90 - "
            f"median) / median over the settings, marked (!) above {setup['max_spread']:.0%}: that row's latency is "
            "noisy (a busy machine, or too few repeats). "
            + (f"`{metric}`: on the dev set's report half (the half no setting was chosen on; the whole dev set's "
               "and the tuning half's are in benchmark.json). " if metric.startswith(f"{REPORT}/") else "")
            + "samples/s and 'faster by' at "
            f"{setup['throughput_at'].replace('_', ' ')}. 'smaller by': parameters for PyTorch rows, on-disk size for "
            "compressed rows. Peak memory: resident memory of a fresh process that loads the model and runs one "
            "inference at the largest batch and length.\n")
    notes = "".join(f"\n{text}\n" for text in dict.fromkeys(
        row["retained_note"] for row in rows if row.get("retained_note")))
    return "\n".join(lines) + "\n" + note + notes


def _spread_cell(row: dict, limit: float) -> str:
    """The row's largest latency spread over the settings, in percent, marked when above ``limit``."""
    spread = max(row["latency_spread"].values())
    return f"{spread:.0%}" + (" (!)" if spread > limit else "")


def plot(report: dict, path: Path) -> None:
    """Metric against latency (log scale) at the throughput setting, marker area by parameters, Pareto frontier
    drawn, teacher marked, a dotted line at 95% of the teacher's metric (the retained share the TinyBERT paper's
    4-layer student comes near, 96.8%). One colour and one label a model; the marker says the variant."""
    import matplotlib.pyplot as plt

    figure = plot_figure(report)
    figure.savefig(path)
    plt.close(figure)


def plot_figure(report: dict):
    """:func:`plot`'s matplotlib figure (Agg backend), unsaved; the caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    setup, rows = report["setup"], report["rows"]
    metric, key = setup["metric"], setup["throughput_at"]
    points = [(row["latency_ms"][key], row[metric]) for row in rows]
    figure, axes = plt.subplots(figsize=(8, 5.5), dpi=120)
    largest = max(row["num_parameters"] for row in rows)
    markers = {"pytorch": "o", "int8": "s", "onnx": "D", "onnx-int8": "^"}
    for variant in dict.fromkeys(row["variant"] for row in rows):  # accelerator rows: "cuda", "cuda-fp16"
        markers.setdefault(variant, "X" if variant.endswith("fp16") else "P")
    colours = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(row["model"] for row in rows))}
    labelled = set()
    for index, (row, (x, y)) in enumerate(zip(rows, points)):
        area = 40 + 400 * row["num_parameters"] / largest
        teacher = index == 0
        axes.scatter(x, y, s=area * (2 if teacher else 1), marker="*" if teacher else markers[row["variant"]],
                     color=colours[row["model"]], alpha=0.8, edgecolors="black", linewidths=0.6, zorder=3)
        if row["model"] not in labelled:  # its other variants share its colour
            axes.annotate(row["model"], (x, y), textcoords="offset points", fontsize=7, zorder=4,
                          xytext=(7, 6 if len(labelled) % 2 else -11),
                          bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.7, "linewidth": 0})
            labelled.add(row["model"])
    reference = 0.95 * points[0][1]
    if min(y for _, y in points) <= reference:
        axes.axhline(reference, linestyle=":", color="black", linewidth=0.8, zorder=1, label="95% of the teacher")
    front = pareto_front(points)
    axes.plot([points[i][0] for i in front], [points[i][1] for i in front], "--", color="grey", zorder=2,
              label="Pareto frontier")
    axes.scatter([], [], marker="*", s=120, color="lightgrey", edgecolors="black", label="teacher")
    for variant, marker in markers.items():
        if any(row["variant"] == variant for row in rows):
            axes.scatter([], [], marker=marker, color="lightgrey", edgecolors="black", label=variant)
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_tick_labels(axes)))
    batch, length = key[1:].split("_t")
    axes.set_xlabel(f"latency (ms, batch {batch}, length {length}, {setup['num_threads']} CPU threads; log scale)")
    axes.set_ylabel(f"{setup['task']} dev {metric}")
    axes.set_title("Size / speed / accuracy (colour: model; marker: variant; area: parameters)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return figure


def _minor_tick_labels(axes):
    """The label function of a log x axis' minor ticks: every minor tick labelled runs the numbers together
    ("6070809100"), so where a power of ten is in view (and labelled as a major tick) only 2 and 5 times a power of ten
    are (20, 50, 200, ...), none beyond 3 decades; with no power of ten in view (e.g. 60-95 ms) every tick is."""

    def label(value: float, _position) -> str:
        low, high = sorted(axes.get_xlim())
        if value <= 0 or low <= 0:
            return ""
        if math.floor(math.log10(low)) == math.floor(math.log10(high)):
            return f"{value:g}"
        if math.log10(high / low) > 3:
            return ""
        mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
        return f"{value:g}" if round(mantissa, 6) in (2.0, 5.0) else ""

    return label


def plot_over_seeds(summary: dict, path: Path) -> None:
    """:func:`plot`'s figure for a sweep run over several seeds (:func:`distill.job.seeds.summarize_sweeps`): each
    model and variant at its mean latency and mean metric over the seeds, with the metric's sample standard deviation
    and the latency's range over the seeds as error bars."""
    import matplotlib.pyplot as plt

    key, metric = summary["throughput_at"], summary["metric"]
    rows = [{"model": row["model"], "variant": row["variant"], "num_parameters": row["num_parameters"],
             "latency_ms": {key: row["latency_ms"]["mean"]}, metric: row["metric"]["mean"]}
            for row in summary["rows"]]
    figure = plot_figure({"rows": rows, "setup": {"metric": metric, "throughput_at": key, "task": summary["task"],
                                                  "num_threads": summary["num_threads"]}})
    axes = figure.axes[0]
    for row in summary["rows"]:
        latency, value = row["latency_ms"], row["metric"]
        axes.errorbar(latency["mean"], value["mean"], yerr=value["std"],
                      xerr=[[latency["mean"] - latency["min"]], [latency["max"] - latency["mean"]]],
                      fmt="none", ecolor="dimgrey", elinewidth=0.8, capsize=2, zorder=2.5)
    seeds = summary["seeds"]
    axes.set_title(f"Mean over seeds {', '.join(map(str, seeds))}: {metric} ± sd, latency range "
                   "(colour: model; marker: variant; area: parameters)", fontsize=9)
    figure.savefig(path)
    plt.close(figure)
