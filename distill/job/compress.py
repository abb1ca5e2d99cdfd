"""``compress``: from a teacher and a budget to the smallest student that keeps the teacher's score.

The search space is the student shapes the pruning stage can make from the teacher (:func:`candidate_shapes`: depths
and widths below the teacher's, its head count where it divides the width, else the nearest count that divides both,
FFN at the teacher's ratio). Each shape's latency is measured on this machine, once per shape and machine (a forward
pass of its random weights at the budget's batch size and length, all shapes interleaved:
:class:`distill.job.estimate.Clock`, kept in ``$TINYDISTILL_CACHE/timings.json``), and so is the teacher's; a budget
is a speed-up over the teacher, a latency in milliseconds or a size in MB (:class:`Budget`).

The shapes inside the budget are ranked by a cheap proxy of their distilled quality: the share of the teacher's
importance the pruned start keeps (:func:`importance_kept`: the geometric mean, over the residual channels, the FFN
neurons and the attention's query/key and value dimensions, of the kept units' importance over all of the teacher's,
measured once on the training set as the pruning stage measures it). Only the best ``candidates`` are distilled in
full, with the task's recipe, as a sweep (:func:`distill.job.pipeline.run_sweep`'s stages: the teacher, augmentation,
teacher-output cache shared), then benchmarked; the chosen one is the fastest that keeps ``keep`` of the teacher's
metric on the dev set's report half, else the one that keeps the most. Every stage resumes, and a second ``compress``
with another budget reuses what the first measured (timings, importance) and distilled (a student of the same shape
is the same sweep entry).

Outputs in ``<output_dir>/compress-<budget>/``: ``compress.json``, ``compress.md`` (every shape: latency, speed-up,
size, inside the budget or not, its proxy, and the distilled ones' scores) and ``compress.png`` (the front: retained
share against measured latency, the teacher and the budget marked); the chosen student in
``<output_dir>/students/<shape>/student`` with its ONNX files and a card naming the budget.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from distill.config import ConfigError, PipelineConfig, SweepEntry
from distill.method.checkpoint import write_json_atomic
from distill.method.layer_map import build_layer_map

logger = logging.getLogger(__name__)

DEPTHS = (1, 2, 3, 4, 6, 8)  # student depths tried, below the teacher's
WIDTHS = (96, 128, 192, 256, 312, 384, 512, 768)  # student hidden sizes tried, at most the teacher's
LATENCY_REPEATS = 10  # interleaved rounds a latency is the median of (after one warm-up)


@dataclass(frozen=True)
class Budget:
    """What the student must meet: at least ``speedup`` times faster than the teacher, at most ``latency_ms``, or at
    most ``size_mb`` of fp32 weights on disk; latency at ``batch_size`` x ``seq_length`` tokens."""

    speedup: float | None = None
    latency_ms: float | None = None
    size_mb: float | None = None
    batch_size: int = 32
    seq_length: int = 64

    def __post_init__(self) -> None:
        given = [name for name in ("speedup", "latency_ms", "size_mb") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError("compress: give exactly one budget, --speedup S, --latency-ms L or --size-mb M"
                              + (f" (got {', '.join('--' + g.replace('_', '-') for g in given)})" if given else ""))
        value = getattr(self, given[0])
        if value <= 0 or (self.speedup is not None and self.speedup <= 1):
            raise ConfigError(f"compress: --{given[0].replace('_', '-')} must be above {1 if self.speedup else 0}, "
                              f"got {value:g}")
        if self.batch_size < 1 or self.seq_length < 8:
            raise ConfigError("compress: --batch-size must be >= 1 and --seq-length >= 8")

    @property
    def tag(self) -> str:
        """A folder name for the budget: ``speedup-10``, ``latency-25ms-b32-t64``, ``size-20mb``."""
        if self.speedup is not None:
            return f"speedup-{self.speedup:g}-b{self.batch_size}-t{self.seq_length}"
        if self.latency_ms is not None:
            return f"latency-{self.latency_ms:g}ms-b{self.batch_size}-t{self.seq_length}"
        return f"size-{self.size_mb:g}mb"

    def describe(self) -> str:
        if self.speedup is not None:
            return f"{self.speedup:g}x faster than the teacher at batch {self.batch_size}, length {self.seq_length}"
        if self.latency_ms is not None:
            return f"at most {self.latency_ms:g} ms at batch {self.batch_size}, length {self.seq_length}"
        return f"at most {self.size_mb:g} MB of weights"

    def allows(self, shape: "Shape", teacher_ms: float, latency_ms: float | None = None) -> bool:
        """Whether ``shape`` meets the budget, at its search latency or at ``latency_ms`` (the benchmark's
        measurement of the distilled student, against ``teacher_ms`` measured beside it)."""
        latency_ms = shape.latency_ms if latency_ms is None else latency_ms
        if self.speedup is not None:
            return teacher_ms / latency_ms >= self.speedup
        if self.latency_ms is not None:
            return latency_ms <= self.latency_ms
        return shape.size_mb <= self.size_mb

    @property
    def timing_key(self) -> str:
        """The benchmark's latency key of the budget's batch size and length (``b32_t64``)."""
        return f"b{self.batch_size}_t{self.seq_length}"


@dataclass
class Shape:
    """A student shape of the search: its sizes, measured latency (ms), parameters, fp32 size (MB) and, once the
    teacher's importance is known, its proxy; a distilled one gets its benchmark row's scores."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    latency_ms: float = 0.0
    num_parameters: int = 0
    size_mb: float = 0.0
    proxy: float | None = None
    fits: bool = False
    result: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return (f"{self.num_hidden_layers}l-{self.hidden_size}-a{self.num_attention_heads}-"
                f"f{self.intermediate_size}")

    @property
    def sizes(self) -> dict:
        return {"num_hidden_layers": self.num_hidden_layers, "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size}


def _heads(width: int, teacher_heads: int) -> int:
    """The teacher's head count when it divides ``width``, else the count nearest to it dividing both."""
    if width % teacher_heads == 0:
        return teacher_heads
    counts = [h for h in range(1, width + 1) if width % h == 0 and teacher_heads % h == 0]
    return min(counts, key=lambda h: (abs(h - teacher_heads), -h))


def candidate_shapes(teacher_config) -> list[Shape]:
    """Every student shape of the search for this teacher: each depth of :data:`DEPTHS` below the teacher's with each
    width of :data:`WIDTHS` up to the teacher's (the teacher's own width only at a smaller depth), heads as
    :func:`_heads`, FFN at the teacher's FFN-to-width ratio (rounded to a multiple of the heads)."""
    layers, hidden = teacher_config.num_hidden_layers, teacher_config.hidden_size
    heads, ratio = teacher_config.num_attention_heads, teacher_config.intermediate_size / hidden
    shapes = []
    for depth in (d for d in DEPTHS if d < layers):
        for width in (w for w in WIDTHS if w <= hidden):
            count = _heads(width, heads)
            ffn = max(count, int(round(width * ratio / count)) * count)
            shapes.append(Shape(depth, width, count, ffn))
    return shapes


def measure(shapes: list[Shape], teacher_config, budget: Budget, clock, task_type=None) -> float:
    """Fill each shape's latency, parameters and size on this machine; returns the teacher's latency (ms).

    The teacher and every shape not yet timed here are timed together, interleaved (each round runs every model once:
    the benchmark's own method, :func:`distill.publish.report.time_models`, so a busy spell slows them alike), on
    random weights of their shapes, :data:`LATENCY_REPEATS` rounds after a warm-up, at the budget's batch size and
    length; the medians are kept in the clock's file (not when the machine was busy) and read from it next time.
    """
    from transformers import AutoModelForSequenceClassification

    from distill.config import ReportConfig
    from distill.publish.report import time_models
    from distill.tasks import get_task_type
    from students.build import student_config

    configs = {shape.name: student_config(teacher_config, shape.sizes, init="pruned") for shape in shapes}
    for config in configs.values():
        config.num_labels = teacher_config.num_labels
    configs["teacher"] = teacher_config
    known = {name: clock.known_seconds(config, budget.batch_size, budget.seq_length, "latency")
             for name, config in configs.items()}
    missing = [name for name, seconds in known.items() if seconds is None]
    if missing:
        if "teacher" not in missing:  # the teacher is timed beside the shapes it is compared with
            missing.append("teacher")
        logger.info("compress: timing %d shapes on this machine at batch %d, length %d", len(missing),
                    budget.batch_size, budget.seq_length)
        torch.manual_seed(0)
        models = {name: AutoModelForSequenceClassification.from_config(configs[name]).eval() for name in missing}
        timing = time_models(models, ReportConfig(batch_sizes=[budget.batch_size], seq_length=budget.seq_length,
                                                  num_warmup=1, num_repeats=LATENCY_REPEATS),
                             task_type=task_type or get_task_type("sequence_classification"))
        del models
        for name in missing:
            known[name] = timing[name]["latency_ms"][f"batch_{budget.batch_size}"]["median"] / 1000
            clock.record(configs[name], budget.batch_size, budget.seq_length, "latency", known[name])
    for shape in shapes:
        shape.latency_ms = 1000 * known[shape.name]
        shape.num_parameters = count_parameters(configs[shape.name])
        shape.size_mb = 4 * shape.num_parameters / 1e6
    return 1000 * known["teacher"]


def count_parameters(config) -> int:
    """Parameters of a sequence classifier of ``config`` (built on the meta device: no memory, no time)."""
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    return sum(p.numel() for p in model.parameters())


def importance_kept(importance, teacher_config, shape: Shape, layers: list[int]) -> float:
    """The proxy of a shape's distilled quality: the geometric mean of the shares of the teacher's importance its
    pruned start keeps, over the residual channels (summed over the embedding output and every layer's output), the
    FFN neurons, and the attention's query/key and value dimensions, each share the kept units' importance over all
    of the teacher's units' (so a shallower or narrower start keeps less). In (0, 1]."""
    from students.pruning import plan_pruning

    plan = plan_pruning(importance, teacher_config, shape.sizes, layers)
    residual = importance.residual.sum(dim=0)
    shares = [float(importance.residual[[0, *layers]].sum(dim=0)[plan.residual].sum() / residual.sum())]
    for name, kept in (("ffn", plan.ffn), ("query_key", plan.query_key), ("value", plan.value)):
        scores = getattr(importance, name)
        total = float(scores.sum())
        shares.append(sum(float(scores[layer - 1][units].sum()) for layer, units in zip(layers, kept)) / total)
    return math.exp(sum(math.log(max(share, 1e-12)) for share in shares) / len(shares))


def shape_layers(config: PipelineConfig, teacher_config, importance, depth: int) -> list[int]:
    """The teacher layers a student of ``depth`` keeps: the job's layer map, or with ``student.pruning.layers:
    importance`` those that change their input most."""
    from students.pruning import select_layers

    if config.student.pruning.layers == "importance":
        return select_layers(importance, depth)
    return build_layer_map(config.distill.layer_map, teacher_config.num_hidden_layers, depth)


def entries(config: PipelineConfig, chosen: list[Shape]) -> PipelineConfig:
    """``config`` with a sweep of the chosen shapes, each pruned from the teacher with the job's pruning settings."""
    sweep = [SweepEntry(name=shape.name, student=dataclasses.replace(
        config.student, preset=None, init="pruned", model=None, **shape.sizes)) for shape in chosen]
    return dataclasses.replace(config, sweep=sweep)


def timed_at_budget(config: PipelineConfig, budget: Budget) -> PipelineConfig:
    """``config`` whose benchmark also times the budget's batch size and length, so the distilled students' measured
    latency can be set against the search's (:func:`latency_check`)."""
    timing = config.benchmark
    return dataclasses.replace(config, benchmark=dataclasses.replace(
        timing, batch_sizes=sorted({*timing.batch_sizes, budget.batch_size}),
        seq_lengths=sorted({*timing.seq_lengths, budget.seq_length})))


def latency_check(shape: Shape, budget: Budget, row: dict, teacher_row: dict) -> dict:
    """The search's latency of ``shape`` (a forward pass of random weights) set against the benchmark's measurement
    of the distilled student at the budget's batch size and length (``row``, ``teacher_row``: the benchmark's
    PyTorch rows): ``benchmark_ms``, ``latency_error`` (search / benchmark - 1), ``faster_by_measured`` (the
    teacher's latency over the student's, both measured by the benchmark) and ``meets_budget_measured``; {} when the
    benchmark has no timing at that setting. A search latency more than 10% off is logged as a warning."""
    key = budget.timing_key
    measured, teacher = row["latency_ms"].get(key), teacher_row["latency_ms"].get(key)
    if measured is None or teacher is None:
        return {}
    error = shape.latency_ms / measured - 1
    if abs(error) > 0.10:
        logger.warning("compress: %s: the search timed %.1f ms, the benchmark %.1f ms at %s (%+.0f%%); the budget is "
                       "judged on the benchmark's", shape.name, shape.latency_ms, measured, key, 100 * error)
    return {"benchmark_ms": measured, "latency_error": error, "faster_by_measured": teacher / measured,
            "meets_budget_measured": budget.allows(shape, teacher, measured)}


def pick(shapes: list[Shape], keep: float) -> Shape:
    """The fastest distilled shape that keeps at least ``keep`` of the teacher's metric, else the one keeping most."""
    done = [s for s in shapes if s.result.get("retained") is not None]
    if not done:
        raise ConfigError("compress: no distilled student has a retained share (a teacher at chance?); see the "
                          "benchmark of the run")
    keeping = [s for s in done if s.result["retained"] >= keep]
    return min(keeping, key=lambda s: s.latency_ms) if keeping else max(done, key=lambda s: s.result["retained"])


def run_compress(config: PipelineConfig, budget: Budget, keep: float = 0.97, candidates: int = 2,
                 device: torch.device | None = None, clock=None) -> dict:
    """The whole search (see the module's docstring): the teacher and data, the shapes measured, the ones inside the
    budget ranked by importance kept, the best ``candidates`` distilled and benchmarked, the choice shipped.

    Returns:
        The ``compress.json`` record: {"budget", "keep", "teacher_ms", "shapes": [...], "chosen": name, "meets":
        bool, "folder"}.

    Raises:
        ConfigError: no shape meets the budget (naming the fastest shape and its latency), ``keep`` outside (0, 1],
            or fewer than one candidate.
    """
    from distill.device import run_device
    from distill.job.estimate import Clock
    from distill.job.pipeline import _sweep, for_device, shared_stages, sweep_entries
    from distill.job.preflight import prepare, preflight
    from distill.method.checkpoint import output_lock
    from teachers.models import load_config as load_model_config

    if not 0 < keep <= 1 or candidates < 1:
        raise ConfigError(f"compress: --keep must be in (0, 1] and --candidates >= 1, got {keep:g} and {candidates}")
    device = device if device is not None else run_device()
    config = for_device(prepare(config), device)
    preflight(config)
    clock = clock or Clock()
    out = Path(config.output_dir)
    folder = out / f"compress-{budget.tag}"
    with output_lock(out, "compress"):
        shared = shared_stages(config, device)
        out, spec, data, teacher_record, train_data = shared.out, shared.spec, shared.data, shared.teacher, \
            shared.train_data
        teacher_config = load_model_config(str(out / "teacher"))
        shapes = candidate_shapes(teacher_config)
        teacher_ms = measure(shapes, teacher_config, budget, clock, spec.type)
        fits = [s for s in shapes if budget.allows(s, teacher_ms)]
        for shape in fits:
            shape.fits = True
        if not fits:
            raise no_shape(shapes, budget, teacher_ms)
        importance = teacher_importance(config, spec, train_data, out, teacher_record["run_id"], device)
        for shape in fits:
            shape.proxy = importance_kept(importance, teacher_config, shape,
                                          shape_layers(config, teacher_config, importance, shape.num_hidden_layers))
        chosen = sorted(fits, key=lambda s: (-s.proxy, s.latency_ms))[:candidates]
        logger.info("compress: %d of %d shapes meet the budget (%s); distilling %s", len(fits), len(shapes),
                    budget.describe(), ", ".join(s.name for s in chosen))
        sweep = timed_at_budget(entries(config, chosen), budget)
        report = _sweep(sweep, sweep_entries(sweep), device, benchmark_dir=folder / "benchmark")
    if report is None:  # another process of a multi-process launch: the main one writes the record
        return {}
    rows = {row["name"]: row for row in report["rows"] if row["variant"] == "pytorch"}
    metric = report["setup"]["metric"]
    for shape in chosen:
        row = rows[shape.name]
        shape.result = {"metric": row[metric], "retained": row["ratios"]["metric_retained"],
                        "faster_by": row["ratios"]["faster_by"],
                        **latency_check(shape, budget, row, rows["teacher"])}
    best = pick(chosen, keep)
    record = {"budget": dataclasses.asdict(budget), "describe": budget.describe(), "keep": keep,
              "teacher_ms": teacher_ms, "metric": metric, "chosen": best.name,
              "meets": best.result["retained"] >= keep, "student": f"students/{best.name}/student",
              "meets_budget_measured": best.result.get("meets_budget_measured"),
              "teacher": {"metric": rows["teacher"][metric],
                          "benchmark_ms": rows["teacher"]["latency_ms"].get(budget.timing_key)},
              "shapes": [{**dataclasses.asdict(s), "name": s.name} for s in shapes]}
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "compress.json", record)
    (folder / "compress.md").write_text(compress_markdown(record), encoding="utf-8")
    front_plot(record, folder / "compress.png")
    ship(config, spec, data, out / "students" / best.name / "student")
    for shape in chosen:  # the sweep wrote their cards anew: each names the budgets it was chosen for
        annotate(out, shape.name)
    return {**record, "folder": str(folder)}


def teacher_importance(config: PipelineConfig, spec, train_data, out: Path, teacher_id: str, device):
    """The fine-tuned teacher's importance on the training set, as the pruning stage measures it (its criterion,
    calibration sample and batches), kept in ``out/compress/importance-<criterion>.safetensors`` for its teacher."""
    from safetensors.torch import load_file, save_file

    from distill.job.pruned import calibration_batches
    from students.pruning import Importance, compute_importance
    from teachers import load_teacher, load_tokenizer

    pruning = config.student.pruning
    path = out / "compress" / f"importance-{pruning.importance}-{teacher_id}.safetensors"
    if path.is_file():
        return Importance.from_tensors(load_file(path))
    tokenizer = load_tokenizer(str(out / "teacher"))
    batches = calibration_batches(train_data, tokenizer, spec, config.task.max_seq_length, pruning.num_examples,
                                  labels=pruning.importance == "taylor")
    importance = compute_importance(load_teacher(str(out / "teacher"), spec), batches, device=device,
                                    criterion=pruning.importance)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(importance.to_tensors(), str(path))
    return importance


def ship(config: PipelineConfig, spec, data, student: Path) -> None:
    """The chosen student as the pipeline ships one: ONNX files (and int8 where on) checked on dev."""
    from distill.publish.card import record_export
    from distill.publish.export import export_student

    if config.export.onnx:
        record_export(student, spec, export_student(student, spec, data["dev"], config.task.max_seq_length,
                                                    config.export.int8))


CARD_SECTION = "\n\n## Chosen by `compress`\n"


def annotate(out: Path, name: str) -> None:
    """The card of the sweep's student ``name`` names every budget ``compress`` chose it for (the records of
    ``out/compress-*/compress.json``); a card of a student no search chose has no such section. (The sweep writes the
    cards anew, so each search puts the sections back for every student it distilled.)"""
    from huggingface_hub import ModelCard

    path = out / "students" / name / "student" / "README.md"
    if not path.is_file():
        return
    chosen = []
    for found in sorted(out.glob("compress-*/compress.json")):
        record = json.loads(found.read_text(encoding="utf-8"))
        if record.get("chosen") == name:
            chosen.append(f"- {record['describe']}, keeping {record['keep']:.0%} of the teacher's {record['metric']}: "
                          + ("it meets both" if record["meets"] else "no distilled shape kept that share; it kept "
                             "the most") + f" ({found.parent.name}/compress.md of the run)")
    card = ModelCard.load(path)
    text = card.text.split(CARD_SECTION)[0]
    if chosen:
        text += CARD_SECTION + "\nThe student `compress` chose for these budgets:\n\n" + "\n".join(chosen) + "\n"
    card.text = text
    card.save(path)


def compress_markdown(record: dict) -> str:
    """``compress.md``: the budget and the choice, then every shape measured, the distilled ones with their scores."""
    metric = record["metric"]
    lines = [f"# compress: {record['describe']}, keep {record['keep']:.0%}", "",
             f"Chosen: **{record['chosen']}** ({'meets the budget and keeps the share' if record['meets'] else 'meets the budget; no distilled shape kept the share, it kept the most'}); "
             f"teacher {metric} {record['teacher']['metric']:.4f}, latency {record['teacher_ms']:.1f} ms.", "",
             f"| shape | parameters | size (MB) | latency (ms) | faster by | in budget | importance kept | {metric} "
             "| retained | benchmark latency (ms) | search vs benchmark |", "|---" * 11 + "|"]
    ordered = sorted(record["shapes"], key=lambda s: s["latency_ms"])
    for shape in ordered:
        result = shape.get("result") or {}
        lines.append("| " + " | ".join([
            f"**{shape['name']}**" if shape["name"] == record["chosen"] else shape["name"],
            f"{shape['num_parameters'] / 1e6:.1f}M", f"{shape['size_mb']:.1f}", f"{shape['latency_ms']:.1f}",
            f"{record['teacher_ms'] / shape['latency_ms']:.1f}x", "yes" if shape["fits"] else "no",
            "-" if shape["proxy"] is None else f"{shape['proxy']:.3f}",
            f"{result['metric']:.4f}" if result else "-",
            f"{100 * result['retained']:.1f}%" if result.get("retained") is not None else "-",
            f"{result['benchmark_ms']:.1f}" if "benchmark_ms" in result else "-",
            f"{100 * result['latency_error']:+.0f}%" if "latency_error" in result else "-"]) + " |")
    lines += ["", "Latency: median of the shape's forward passes on random weights on this machine (the teacher's "
              "too); importance kept: the proxy the shapes inside the budget are ranked by (distill/job/compress.py); "
              "the distilled ones' scores from the benchmark in benchmark/ (on the dev set's report half), with their "
              "latency measured there at the budget's batch size and length beside the teacher's, and the search's "
              "latency against it."]
    if record.get("meets_budget_measured") is not None:
        verdict = "meets" if record["meets_budget_measured"] else "does not meet"
        lines += ["", f"Measured by the benchmark, the chosen student {verdict} the budget."]
    return "\n".join(lines) + "\n"


def front_plot(record: dict, path: Path) -> None:
    """The front: retained share against measured latency for the distilled shapes, every shape's latency as a tick,
    the teacher at 100% and the budget marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    done = [s for s in record["shapes"] if (s.get("result") or {}).get("retained") is not None]
    axis.scatter([s["latency_ms"] for s in done], [100 * s["result"]["retained"] for s in done], color="tab:blue",
                 label="distilled students", zorder=3)
    for s in done:
        axis.annotate(s["name"], (s["latency_ms"], 100 * s["result"]["retained"]), fontsize=7,
                      textcoords="offset points", xytext=(4, 4))
    axis.scatter([record["teacher_ms"]], [100.0], marker="*", s=150, color="tab:red", label="teacher", zorder=3)
    low = min([100 * s["result"]["retained"] for s in done] + [90.0])
    axis.scatter([s["latency_ms"] for s in record["shapes"]], [low - 2] * len(record["shapes"]), marker="|",
                 color="grey", label="shapes measured")
    budget = record["budget"]
    limit = (record["teacher_ms"] / budget["speedup"] if budget.get("speedup") else budget.get("latency_ms"))
    if limit:
        axis.axvline(limit, color="tab:green", linestyle="--", label="budget")
    axis.axhline(100 * record["keep"], color="tab:orange", linestyle=":", label=f"keep {record['keep']:.0%}")
    axis.set_xscale("log")
    axis.set_xlabel(f"latency (ms), batch {budget['batch_size']}, length {budget['seq_length']}")
    axis.set_ylabel(f"{record['metric']} retained (%)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plan_compress(config: PipelineConfig, budget: Budget, clock=None) -> tuple[list[Shape], float]:
    """What ``compress`` would measure and distil, for its dry run: every shape with its latency here and whether it
    meets the budget (the teacher's shape from its config: its fine-tuned weights time the same), largest first (the
    proxy needs the fine-tuned teacher; inside the budget it mostly ranks the larger shapes first), and the teacher's
    latency (ms).

    Raises:
        ConfigError: no shape meets the budget (as the run would say).
    """
    from distill.job.estimate import Clock
    from distill.job.preflight import prepare
    from teachers.models import load_config as load_model_config

    config = prepare(config)
    teacher = Path(config.output_dir) / "teacher"
    teacher_config = load_model_config(str(teacher) if (teacher / "config.json").is_file()
                                       else config.teacher.model or config.teacher.base_model)
    teacher_config.num_labels = max(teacher_config.num_labels, 2)
    shapes = candidate_shapes(teacher_config)
    teacher_ms = measure(shapes, teacher_config, budget, clock or Clock())
    for shape in shapes:
        shape.fits = budget.allows(shape, teacher_ms)
    if not any(shape.fits for shape in shapes):
        raise no_shape(shapes, budget, teacher_ms)
    return sorted(shapes, key=lambda s: -s.num_parameters), teacher_ms


def no_shape(shapes: list[Shape], budget: Budget, teacher_ms: float) -> ConfigError:
    """The error of a budget no shape meets: the fastest shape, its latency and size."""
    fastest = min(shapes, key=lambda s: s.latency_ms)
    return ConfigError(f"compress: no student shape meets the budget ({budget.describe()}): the fastest, "
                       f"{fastest.name}, takes {fastest.latency_ms:.1f} ms against the teacher's {teacher_ms:.1f} ms "
                       f"({teacher_ms / fastest.latency_ms:.1f}x), {fastest.size_mb:.1f} MB; ask for less")
