"""An intermediate-step epoch with the teacher-output cache against one without, side by side in one run.

Job: the intermediate step of task distillation (embedding, hidden-state and attention losses, AdamW) of the TinyBERT
4-layer/312 student (BERT) from a 12-layer MPNet teacher (all-mpnet-base-v2's shape: hidden 768, 12 heads; built
from its config with random weights, no download: the time does not depend on the weights), uniform 4-of-12 map
(teacher layers 3, 6, 9, 12), on the first ``--examples`` sentences of the bundled SST-2 sample tokenized with the
MiniLM tokenizer (its ids fit MPNet's vocabulary) at ``--max-seq-length``, as ``configs/sst2_mpnet.yaml`` runs it.

- ``uncached``: :func:`distill.method.trainer.train` as the step runs without a cache (the teacher's forward every step);
- ``cached``: the same loop reading the teacher's outputs from the cache (:mod:`distill.method.teacher_cache`), built once
  beforehand (``build``: its one teacher pass over the examples and the write, timed apart);
- ``student_only``: the cached batches collated beforehand, through the objective's forward, backward, clipping and
  AdamW in a bare loop: the student's share, what the cached step cannot go below; ``cached`` over it is what reading
  and padding the cache adds.

Per-step times are the difference of a run of ``--warmup`` steps and one of ``--warmup + --steps`` (set-up and the
final checkpoint drop out); the epoch is ``examples / batch_size`` steps. Repeated ``--repeats`` times, interleaved;
it prints each repeat, the medians and ``ratio`` = cached / uncached (the target: at most 0.35).

Usage: python bench/teacher_cache.py [--examples 1024] [--batch-size 32] [--max-seq-length 64] [--steps 16]
       [--warmup 3] [--repeats 2] [--dtype float16] [--threads N]
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
sys.path.insert(0, str(ROOT / "bench"))

from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification  # noqa: E402
from transformers import MPNetConfig, MPNetForSequenceClassification  # noqa: E402

from distill.config import TaskConfig, TrainConfig  # noqa: E402
from distill.tasks.data import collator, load_task_data, task_spec, tokenize  # noqa: E402
from distill.method.objective import DistillationObjective  # noqa: E402
from distill.method.teacher_cache import (  # noqa: E402
    STORAGE_DTYPES,
    CacheLayout,
    TeacherCache,
    build_teacher_cache,
    with_cache_index,
)
from distill.method.trainer import EpochBatchSampler, train  # noqa: E402
from teachers.models import resolve_model  # noqa: E402
from loop_overhead import bare_step_seconds  # noqa: E402  (bench/loop_overhead.py)

LAYER_MAP = [3, 6, 9, 12]
TERMS = {"embedding": 1.0, "hidden": 1.0, "attention": 1.0}


def objective(vocab_size: int) -> DistillationObjective:
    torch.manual_seed(0)
    teacher = MPNetForSequenceClassification(MPNetConfig(vocab_size=vocab_size, num_labels=2))
    torch.manual_seed(1)
    student = BertForSequenceClassification(BertConfig(vocab_size=vocab_size, num_hidden_layers=4, hidden_size=312,
                                                       intermediate_size=1200, num_attention_heads=12, num_labels=2))
    return DistillationObjective(teacher, student, TERMS, LAYER_MAP)


def time_loop(args, data, collate, vocab_size: int) -> float:
    """Seconds per step of :func:`train`: the difference of a short and a long run over the extra steps."""
    seconds = []
    for steps in (args.warmup, args.warmup + args.steps):
        config = TrainConfig(max_steps=steps, batch_size=args.batch_size, learning_rate=1e-4, save_steps=10**6,
                             log_steps=10, seed=0)
        with tempfile.TemporaryDirectory() as folder:
            target = objective(vocab_size)
            start = time.perf_counter()
            train(target, data, collate, config, folder, "bench", "loop", device=torch.device("cpu"))
            seconds.append(time.perf_counter() - start)
    return (seconds[1] - seconds[0]) / args.steps


def time_student_only(args, data, collate, vocab_size: int) -> float:
    """Seconds per step of forward, backward and AdamW on cached batches collated beforehand."""
    sampler = EpochBatchSampler(len(data), args.batch_size, 0)
    sampler.set_position(0, 0)
    indices = list(sampler)[: args.warmup + args.steps]
    batches = [collate([data[i] for i in batch]) for batch in indices]
    return bare_step_seconds(objective(vocab_size).train(), batches, args.warmup, torch.device("cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=16, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(STORAGE_DTYPES), default="float16", help="cache storage dtype")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    vocab_size = MPNetConfig().vocab_size  # 30527, above the MiniLM tokenizer's 30522 ids
    task = TaskConfig(name="sst2", max_seq_length=args.max_seq_length, max_train_examples=args.examples)
    spec = task_spec(task)
    data = tokenize(load_task_data(task, spec)["train"], tokenizer, spec, args.max_seq_length)
    collate = collator(tokenizer, spec)
    with tempfile.TemporaryDirectory() as folder:
        builder = objective(vocab_size)
        layout = CacheLayout.of(builder.teacher_reads, builder.teacher.config)
        start = time.perf_counter()
        record = build_teacher_cache(builder.teacher, data, collate, layout, Path(folder) / "cache", "bench",
                                     STORAGE_DTYPES[args.dtype], device=torch.device("cpu"))
        build = time.perf_counter() - start
        cache = TeacherCache(Path(folder) / "cache")
        cached_data, cached_collate = with_cache_index(data), cache.collator(collate)
        rows = []
        for repeat in range(args.repeats):
            uncached = time_loop(args, data, collate, vocab_size)
            cached = time_loop(args, cached_data, cached_collate, vocab_size)
            student = time_student_only(args, cached_data, cached_collate, vocab_size)
            rows.append({"uncached_ms": 1000 * uncached, "cached_ms": 1000 * cached, "student_only_ms": 1000 * student,
                         "ratio": cached / uncached, "cached_over_student_only": cached / student})
            print(f"repeat {repeat + 1}: uncached {1000 * uncached:.0f} ms/step, cached {1000 * cached:.0f} ms/step "
                  f"(student alone {1000 * student:.0f}), ratio {cached / uncached:.3f}", flush=True)
    summary = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    steps = -(-len(data) // args.batch_size)
    print(f"median over {args.repeats}: an epoch of {len(data)} examples ({steps} steps): uncached "
          f"{summary['uncached_ms'] * steps / 1000:.1f} s, cached {summary['cached_ms'] * steps / 1000:.1f} s "
          f"(student alone {summary['student_only_ms'] * steps / 1000:.1f} s), ratio {summary['ratio']:.3f} (target "
          f"<= 0.35); the cache: built once in {build:.1f} s, {record['bytes'] / 2**20:.1f} MiB in {args.dtype}")
    print(json.dumps({"examples": len(data), "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                      "dtype": args.dtype, "threads": torch.get_num_threads(), "build_s": build,
                      "cache_bytes": record["bytes"], "steps_per_epoch": steps, "repeats": rows, "median": summary}))


if __name__ == "__main__":
    main()
