"""The training loop's overhead: per-step time of the real loop against the same model work alone, side by side.

Job: the intermediate step of task distillation (embedding, hidden-state and attention losses, AdamW) on the bundled
SST-2 sample tokenized with the MiniLM tokenizer, for a teacher and student built from configs (random weights, no
download): by default a tiny pair (teacher 4 layers of 128, student 2 of 64), the regime where host work dominates;
``--shape bert-base`` is a BERT-base-shaped teacher (12 layers, 768) and the TinyBERT 4-layer/312 student.

- ``loop``: :func:`distill.method.trainer.train` as the distillation steps run it (batches collated from the dataset ahead
  of the step by its prefetch thread, moved to the device, the loss checks, logging, the progress bar, the scheduler);
  ``loop_inline``: the same with collation in the training thread (``prefetch=False``), what the prefetch hides.
  ``--num-workers N``: the loop collates in N DataLoader worker processes instead of the thread.
  ``--collation-only``: the milliseconds a batch takes to collate, alone.
  Two runs of ``--warmup`` and ``--warmup`` + ``--steps`` steps in fresh folders; the per-step time is their
  difference over ``--steps``, so the set-up and the final checkpoint, which both runs pay, drop out.
- ``model_work``: the same batches, collated beforehand and already on the device, through the same objective's
  forward, backward, gradient clipping (as the loop's ``max_grad_norm``) and AdamW step in a bare ``for`` loop (no
  collation, no checks, no logging; fp16 on CUDA with loss scaling, as the loop).

Repeated ``--repeats`` times, interleaved (on CUDA after one untimed pass); it prints each repeat and the medians,
and ``ratio`` = loop / model work (the CPU target: at most 1.10), ``throughput_ratio`` = model work / loop (the GPU
target: at least 0.85), ``ratio_inline`` = loop_inline / model work (left out with ``--no-inline``). On CUDA, the
GPU's utilisation is read while the loop and the model work run (``nvidia-smi`` sampled every 100 ms: the share
of time a kernel ran, in %; the model work's over its timed steps, the loop's over the steps its long run adds to
the short one, as its time is); without ``nvidia-smi`` it is left out. Give enough ``--steps`` for a few seconds
of timed steps (the driver's window is up to 1 s). ``--pad-to-max-length`` pads every batch to
``--max-seq-length`` (the length a FLOP count assumes) instead of to its longest row.

Usage: python bench/loop_overhead.py [--shape tiny|bert-base] [--batch-size 32] [--max-seq-length 128]
       [--steps 40] [--warmup 5] [--repeats 3] [--threads N] [--device cpu|cuda] [--mixed-precision no|bf16|fp16]
       [--compile] [--pad-to-max-length] [--tokenizer DIR] [--no-inline] [--num-workers N] [--collation-only]
The last line printed is a JSON object with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, DataCollatorWithPadding  # noqa: E402

from distill.config import TaskConfig, TrainConfig  # noqa: E402
from distill.tasks.data import collator, load_task_data, task_spec, tokenize  # noqa: E402
from distill.method.objective import DistillationObjective  # noqa: E402
from distill.method.trainer import EpochBatchSampler, _optimizer, train  # noqa: E402
from teachers.models import resolve_model  # noqa: E402

SHAPES = {  # (teacher, student): layers, hidden, FFN, heads
    "tiny": ((4, 128, 512, 4), (2, 64, 256, 4)),
    "bert-base": ((12, 768, 3072, 12), (4, 312, 1200, 12)),
}


def model(shape: tuple[int, int, int, int], vocab_size: int, seed: int) -> BertForSequenceClassification:
    layers, hidden, ffn, heads = shape
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=ffn,
                        num_attention_heads=heads, num_labels=2)
    return BertForSequenceClassification(config)


class GpuUtilisation:
    """The GPU's utilisation while a block runs: ``nvidia-smi --query-gpu=utilization.gpu --loop-ms=PERIOD`` in a
    subprocess, its lines read by a thread. Each sample is the percentage of the driver's own recent window (1/6 s to
    1 s, depending on the GPU) in which one or more kernels ran (0-100); ``--loop-ms`` sets how often it is read.
    ``percent`` is the mean over the samples taken, None when ``nvidia-smi`` is missing, fails or gave no sample.
    ``seconds`` is how long the block ran.

    Use: ``with GpuUtilisation(index) as gpu: ...`` then ``gpu.percent``; ``index`` as ``nvidia-smi -i`` takes it.
    """

    def __init__(self, index: int | str = 0, period_ms: int = 100, command: str = "nvidia-smi"):
        self.index, self.period_ms, self.command = index, period_ms, command
        self.samples: list[float] = []
        self.percent: float | None = None
        self.seconds = 0.0
        self._process = self._reader = None

    def __enter__(self) -> "GpuUtilisation":
        self._start = time.perf_counter()
        if shutil.which(self.command) is None:
            return self
        self._process = subprocess.Popen(
            [self.command, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"--id={self.index}",
             f"--loop-ms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:  # "[N/A]" or a message: not a sample
                continue

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._reader.join(timeout=5)
        self.percent = statistics.fmean(self.samples) if self.samples else None


def utilisation(device: torch.device) -> GpuUtilisation:
    """A :class:`GpuUtilisation` of ``device`` on CUDA; one that reads nothing on any other device. The CUDA ordinal
    is mapped through ``CUDA_VISIBLE_DEVICES`` (an index or UUID ``nvidia-smi -i`` takes), which ``nvidia-smi``
    does not read."""
    if device.type != "cuda":
        return GpuUtilisation(command="")  # shutil.which("") is None: reads nothing
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    return GpuUtilisation(visible[ordinal] if ordinal < len(visible) else ordinal)


def busy_percent(short: GpuUtilisation, long: GpuUtilisation) -> float | None:
    """The GPU's utilisation over the steps the long run adds to the short one, as the loop's time is: busy time
    (utilisation x duration) of the long run less the short one's, over the difference of their durations; the
    set-up and the final checkpoint both runs pay drop out. None without samples from both."""
    if short.percent is None or long.percent is None or long.seconds <= short.seconds:
        return None
    busy = long.percent * long.seconds - short.percent * short.seconds
    return min(100.0, max(0.0, busy / (long.seconds - short.seconds)))


def bench_collator(tokenizer, spec, args):
    """The task's collator (pads to the longest row of a batch), or with ``--pad-to-max-length`` one that pads every
    batch to ``--max-seq-length`` (rows are already cut to it)."""
    if args.pad_to_max_length:
        return DataCollatorWithPadding(tokenizer, padding="max_length", max_length=args.max_seq_length,
                                       return_tensors="pt")
    return collator(tokenizer, spec)


def objective(args, vocab_size: int) -> DistillationObjective:
    teacher_shape, student_shape = SHAPES[args.shape]
    teacher, student = model(teacher_shape, vocab_size, 0), model(student_shape, vocab_size, 1)
    step = teacher_shape[0] // student_shape[0]
    layer_map = [step * (m + 1) for m in range(student_shape[0])]
    target = DistillationObjective(teacher, student, {"embedding": 1.0, "hidden": 1.0, "attention": 1.0}, layer_map)
    if args.compile:  # the student's forward and backward through torch.compile (the loss terms stay eager)
        target.trainable["student"] = torch.compile(target.trainable["student"])
    return target


def time_loop(args, data, collate, vocab_size: int, device: torch.device, prefetch: bool = True
              ) -> tuple[float, float | None]:
    """Seconds per step of :func:`train`: the difference of a short and a long run over the extra steps; and the
    GPU's utilisation (%) over those extra steps (:func:`busy_percent`; None off CUDA)."""
    seconds, gpus = [], []
    for steps in ((args.warmup,) if args.compile else ()) + (args.warmup, args.warmup + args.steps):  # compile once
        config = TrainConfig(max_steps=steps, batch_size=args.batch_size, learning_rate=1e-4, save_steps=10**6,
                             log_steps=10, seed=0, mixed_precision=args.mixed_precision,
                             num_workers=args.num_workers)
        with tempfile.TemporaryDirectory() as folder:
            target = objective(args, vocab_size)
            synchronize(device)
            with utilisation(device) as gpu:
                start = time.perf_counter()
                train(target, data, collate, config, folder, "bench", "loop", device=device, prefetch=prefetch)
                synchronize(device)
                seconds.append(time.perf_counter() - start)
            gpus.append(gpu)
    return (seconds[-1] - seconds[-2]) / args.steps, busy_percent(gpus[-2], gpus[-1])


def time_collation(args, data, collate) -> None:
    """Prints the milliseconds a batch takes to collate in this process, as the loop's ``DataLoader`` collates it
    (the rows fetched together, ``Dataset.__getitems__``, then the collator), median of ``--repeats`` passes over
    ``--steps`` batches, and the fetch alone."""
    batches = [list(range(i * args.batch_size, (i + 1) * args.batch_size)) for i in range(args.steps)
               if (i + 1) * args.batch_size <= len(data)]
    fetch, total = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        rows = [data.__getitems__(batch) for batch in batches]
        middle = time.perf_counter()
        for batch in rows:
            collate(batch)
        end = time.perf_counter()
        fetch.append((middle - start) / len(batches) * 1000)
        total.append((end - start) / len(batches) * 1000)
    print(f"collation, batch {args.batch_size}: {statistics.median(total):.1f} ms a batch "
          f"(fetching the rows {statistics.median(fetch):.1f} ms), median of {args.repeats} passes over "
          f"{len(batches)} batches, {torch.get_num_threads()} torch threads")
    print(json.dumps({"batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                      "pad_to_max_length": args.pad_to_max_length, "collate_ms": statistics.median(total),
                      "fetch_ms": statistics.median(fetch)}))


def time_model_work(args, data, collate, vocab_size: int, device: torch.device) -> tuple[float, float | None]:
    """Seconds per step of forward, backward and AdamW on batches collated beforehand and already on the device; and
    the GPU's utilisation (%) while they ran (None off CUDA)."""
    sampler, indices, epoch = EpochBatchSampler(len(data), args.batch_size, 0), [], 0
    while len(indices) < args.warmup + args.steps:  # as many epochs as the steps need, as the loop takes them
        sampler.set_position(epoch, 0)
        indices += list(sampler)
        epoch += 1
    indices = indices[: args.warmup + args.steps]
    batches = [{k: v.to(device) for k, v in collate([data[i] for i in batch]).items()} for batch in indices]
    target = objective(args, vocab_size).to(device).train()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.mixed_precision)
    gpu = utilisation(device)
    seconds = bare_step_seconds(target, batches, args.warmup, device, dtype,
                                fused=device.type in ("cpu", "cuda") and args.mixed_precision != "fp16", monitor=gpu)
    return seconds, gpu.percent


def bare_step_seconds(target, batches: list[dict], warmup: int, device: torch.device, dtype: torch.dtype | None = None,
                      fused: bool = False, monitor: GpuUtilisation | None = None) -> float:
    """Seconds per step of ``target``'s forward, backward, clipping and AdamW over ``batches[warmup:]`` (after
    ``batches[:warmup]`` untimed), in a bare loop: no collation, no checks, no logging. Each step gets a shallow copy
    of its batch (an objective may take entries out of it, as the teacher-output cache's do). ``monitor``, when
    given, is entered around the timed steps only."""
    config = TrainConfig(learning_rate=1e-4)
    optimizer = _optimizer(target.trainable, config, fused=fused)
    # fp16 on CUDA: loss scaling as the loop has it (accelerate's GradScaler), so that its cost is in both.
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 and device.type == "cuda" else None

    def step(batch):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss, _ = target(dict(batch))
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(target.trainable.parameters(), config.max_grad_norm)
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(target.trainable.parameters(), config.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:warmup]:
        step(batch)
    synchronize(device)
    with monitor if monitor is not None else contextlib.nullcontext():
        start = time.perf_counter()
        for batch in batches[warmup:]:
            step(batch)
        synchronize(device)
        seconds = time.perf_counter() - start
    return seconds / (len(batches) - warmup)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default="no")
    parser.add_argument("--compile", action="store_true", help="run the student through torch.compile (compare "
                        "with a run without: the model-work times of the two runs)")
    parser.add_argument("--pad-to-max-length", action="store_true", help="pad every batch to --max-seq-length")
    parser.add_argument("--tokenizer", default="minilm", help="tokenizer folder (default: the bundled MiniLM's; a "
                        "folder of its tokenizer files where the package is not installed)")
    parser.add_argument("--num-workers", type=int, default=0, help="the loop collates in this many DataLoader "
                        "worker processes (TrainConfig.num_workers) instead of its background thread")
    parser.add_argument("--collation-only", action="store_true", help="time the collation of --steps batches in "
                        "this process, as the loop's DataLoader does it, and nothing else")
    parser.add_argument("--no-inline", action="store_true", help="skip the loop with collation in the training "
                        "thread (loop_inline_ms), to save time where the prefetch is not in question")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.tokenizer))
    # On CUDA, whole batches only (9,984 rows: 39 x 256, 312 x 32): a last short batch would make torch.compile
    # compile again inside a timed run. The CPU figures in docs/performance.md were taken on all 10,000.
    cap = (10_000 // 256) * 256 if device.type == "cuda" else None
    task = TaskConfig(name="sst2", max_seq_length=args.max_seq_length, max_train_examples=cap)
    spec = task_spec(task)
    data = tokenize(load_task_data(task, spec)["train"], tokenizer, spec, args.max_seq_length)
    collate = bench_collator(tokenizer, spec, args)
    if args.collation_only:
        time_collation(args, data, collate)
        return
    if device.type == "cuda":  # one untimed run first: the CUDA context, cuBLAS handles and first kernel loads
        time_model_work(argparse.Namespace(**{**vars(args), "steps": 1}), data, collate, tokenizer.vocab_size, device)
    rows = []
    for repeat in range(args.repeats):
        loop, loop_gpu = time_loop(args, data, collate, tokenizer.vocab_size, device)
        work, work_gpu = time_model_work(args, data, collate, tokenizer.vocab_size, device)
        rows.append({"loop_ms": 1000 * loop, "model_work_ms": 1000 * work, "ratio": loop / work,
                     "throughput_ratio": work / loop})
        inline_text = ""
        if not args.no_inline:
            inline, _ = time_loop(args, data, collate, tokenizer.vocab_size, device, prefetch=False)
            rows[-1].update(loop_inline_ms=1000 * inline, ratio_inline=inline / work)
            inline_text = f" (collating inline {1000 * inline:.1f})"
        gpu = ""
        if loop_gpu is not None and work_gpu is not None:
            rows[-1].update(gpu_util_loop=loop_gpu, gpu_util_model_work=work_gpu)
            gpu = f"; GPU busy {loop_gpu:.0f}% in the loop, {work_gpu:.0f}% in the model work"
        print(f"repeat {repeat + 1}: loop {1000 * loop:.1f} ms/step{inline_text}, model work {1000 * work:.1f} "
              f"ms/step, ratio {loop / work:.3f} (throughput {work / loop:.3f}){gpu}", flush=True)
        if args.compile:  # the same model work without torch.compile: what compiling buys
            eager, _ = time_model_work(argparse.Namespace(**{**vars(args), "compile": False}), data, collate,
                                       tokenizer.vocab_size, device)
            rows[-1].update(model_work_eager_ms=1000 * eager, compile_speedup=eager / work)
            print(f"repeat {repeat + 1}: model work without torch.compile {1000 * eager:.1f} ms/step, compiled "
                  f"{eager / work:.2f}x faster", flush=True)
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0] if all(key in r for r in rows)}
    inline_text = "" if args.no_inline else (f" (collating inline {summary['loop_inline_ms']:.1f}; ratio "
                                             f"{summary['ratio_inline']:.3f})")
    print(f"median over {args.repeats}: loop {summary['loop_ms']:.1f} ms/step{inline_text}, model work "
          f"{summary['model_work_ms']:.1f} ms/step, ratio {summary['ratio']:.3f} (target on a CPU: <= 1.10), "
          f"throughput {summary['throughput_ratio']:.3f} of the model work's (target on a GPU: >= 0.85)"
          + (f"; GPU busy {summary['gpu_util_loop']:.0f}% in the loop, {summary['gpu_util_model_work']:.0f}% in the "
             "model work" if "gpu_util_loop" in summary else ""))
    print(json.dumps({"shape": args.shape, "device": str(device), "mixed_precision": args.mixed_precision,
                      "compile": args.compile, "pad_to_max_length": args.pad_to_max_length,
                      "num_workers": args.num_workers,
                      "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                      "threads": torch.get_num_threads(), "repeats": rows, "median": summary}))


if __name__ == "__main__":
    main()
