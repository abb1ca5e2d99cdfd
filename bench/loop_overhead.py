"""The training loop's overhead: per-step time of the real loop against the same model work alone, side by side.

Job: the intermediate step of task distillation (embedding, hidden-state and attention losses, AdamW) on the bundled
SST-2 sample tokenized with the MiniLM tokenizer, for a teacher and student built from configs (random weights, no
download): by default a tiny pair (teacher 4 layers of 128, student 2 of 64), the regime where host work dominates;
``--shape bert-base`` is a BERT-base-shaped teacher (12 layers, 768) and the TinyBERT 4-layer/312 student.

- ``loop``: :func:`distill.trainer.train` as the distillation steps run it (batches collated from the dataset ahead
  of the step by its prefetch thread, moved to the device, the loss checks, logging, the progress bar, the scheduler);
  ``loop_inline``: the same with collation in the training thread (``prefetch=False``), what the prefetch hides. Two runs of ``--warmup`` and ``--warmup`` +
  ``--steps`` steps in fresh folders; the per-step time is their difference over ``--steps``, so the set-up and the
  final checkpoint, which both runs pay, drop out.
- ``model_work``: the same batches, collated beforehand and already on the device, through the same objective's
  forward, backward, gradient clipping (as the loop's ``max_grad_norm``) and AdamW step in a bare ``for`` loop (no
  collation, no checks, no logging; no fp16 loss scaling).

Repeated ``--repeats`` times, interleaved; it prints each repeat and the medians, and ``ratio`` = loop / model work
(the CPU target: at most 1.10), ``ratio_inline`` = loop_inline / model work.

Usage: python bench/loop_overhead.py [--shape tiny|bert-base] [--batch-size 32] [--max-seq-length 128]
       [--steps 40] [--warmup 5] [--repeats 3] [--threads N] [--device cpu|cuda] [--mixed-precision no|bf16|fp16]
       [--compile]
The last line printed is a JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification  # noqa: E402

from distill.config import TaskConfig, TrainConfig  # noqa: E402
from distill.data import collator, load_task_data, task_spec, tokenize  # noqa: E402
from distill.objective import DistillationObjective  # noqa: E402
from distill.trainer import EpochBatchSampler, _optimizer, train  # noqa: E402
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


def objective(args, vocab_size: int) -> DistillationObjective:
    teacher_shape, student_shape = SHAPES[args.shape]
    teacher, student = model(teacher_shape, vocab_size, 0), model(student_shape, vocab_size, 1)
    step = teacher_shape[0] // student_shape[0]
    layer_map = [step * (m + 1) for m in range(student_shape[0])]
    target = DistillationObjective(teacher, student, {"embedding": 1.0, "hidden": 1.0, "attention": 1.0}, layer_map)
    if args.compile:  # the student's forward and backward through torch.compile (the loss terms stay eager)
        target.trainable["student"] = torch.compile(target.trainable["student"])
    return target


def time_loop(args, data, collate, vocab_size: int, device: torch.device, prefetch: bool = True) -> float:
    """Seconds per step of :func:`train`: the difference of a short and a long run over the extra steps."""
    seconds = []
    for steps in ((args.warmup,) if args.compile else ()) + (args.warmup, args.warmup + args.steps):  # compile once
        config = TrainConfig(max_steps=steps, batch_size=args.batch_size, learning_rate=1e-4, save_steps=10**6,
                             log_steps=10, seed=0, mixed_precision=args.mixed_precision)
        with tempfile.TemporaryDirectory() as folder:
            target = objective(args, vocab_size)
            synchronize(device)
            start = time.perf_counter()
            train(target, data, collate, config, folder, "bench", "loop", device=device, prefetch=prefetch)
            synchronize(device)
            seconds.append(time.perf_counter() - start)
    return (seconds[-1] - seconds[-2]) / args.steps


def time_model_work(args, data, collate, vocab_size: int, device: torch.device) -> float:
    """Seconds per step of forward, backward and AdamW on batches collated beforehand and already on the device."""
    sampler = EpochBatchSampler(len(data), args.batch_size, 0)
    sampler.set_position(0, 0)
    indices = list(sampler)[: args.warmup + args.steps]
    batches = [{k: v.to(device) for k, v in collate([data[i] for i in batch]).items()} for batch in indices]
    target = objective(args, vocab_size).to(device).train()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.mixed_precision)
    return bare_step_seconds(target, batches, args.warmup, device, dtype,
                             fused=device.type == "cuda" and args.mixed_precision != "fp16")


def bare_step_seconds(target, batches: list[dict], warmup: int, device: torch.device, dtype: torch.dtype | None = None,
                      fused: bool = False) -> float:
    """Seconds per step of ``target``'s forward, backward, clipping and AdamW over ``batches[warmup:]`` (after
    ``batches[:warmup]`` untimed), in a bare loop: no collation, no checks, no logging. Each step gets a shallow copy
    of its batch (an objective may take entries out of it, as the teacher-output cache's do)."""
    config = TrainConfig(learning_rate=1e-4)
    optimizer = _optimizer(target.trainable, config, fused=fused)

    def step(batch):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss, _ = target(dict(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.trainable.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:warmup]:
        step(batch)
    synchronize(device)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    synchronize(device)
    return (time.perf_counter() - start) / (len(batches) - warmup)


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    task = TaskConfig(name="sst2", max_seq_length=args.max_seq_length)
    spec = task_spec(task)
    data = tokenize(load_task_data(task, spec)["train"], tokenizer, spec, args.max_seq_length)
    collate = collator(tokenizer, spec)
    rows = []
    for repeat in range(args.repeats):
        loop = time_loop(args, data, collate, tokenizer.vocab_size, device)
        work = time_model_work(args, data, collate, tokenizer.vocab_size, device)
        inline = time_loop(args, data, collate, tokenizer.vocab_size, device, prefetch=False)
        rows.append({"loop_ms": 1000 * loop, "loop_inline_ms": 1000 * inline, "model_work_ms": 1000 * work,
                     "ratio": loop / work, "ratio_inline": inline / work})
        print(f"repeat {repeat + 1}: loop {1000 * loop:.1f} ms/step (collating inline {1000 * inline:.1f}), model "
              f"work {1000 * work:.1f} ms/step, ratio {loop / work:.3f} (inline {inline / work:.3f})", flush=True)
        if args.compile:  # the same model work without torch.compile: what compiling buys
            eager = time_model_work(argparse.Namespace(**{**vars(args), "compile": False}), data, collate,
                                    tokenizer.vocab_size, device)
            rows[-1].update(model_work_eager_ms=1000 * eager, compile_speedup=eager / work)
            print(f"repeat {repeat + 1}: model work without torch.compile {1000 * eager:.1f} ms/step, compiled "
                  f"{eager / work:.2f}x faster", flush=True)
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print(f"median over {args.repeats}: loop {summary['loop_ms']:.1f} ms/step (collating inline "
          f"{summary['loop_inline_ms']:.1f}), model work {summary['model_work_ms']:.1f} ms/step, ratio "
          f"{summary['ratio']:.3f} (inline {summary['ratio_inline']:.3f}; target on a CPU: <= 1.10)")
    print(json.dumps({"shape": args.shape, "device": str(device), "mixed_precision": args.mixed_precision,
                      "compile": args.compile,
                      "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                      "threads": torch.get_num_threads(), "repeats": rows, "median": summary}))


if __name__ == "__main__":
    main()
