"""Training batches grouped by length against random batches, on a real task's training set, timed side by side.

For a GLUE task folder (MRPC by default) tokenized with the teacher's tokenizer, one epoch's batches are drawn twice
from the training loop's own sampler (:class:`distill.method.trainer.EpochBatchSampler`, batch 32): a seeded shuffle, and the
same shuffle grouped by length (``group_by_length: true``). It prints

- ``padding``: the tokens each way pads to, over the real tokens of the epoch (no model runs);
- ``step_speedup``: the time of full intermediate-step distillation steps (MiniLM-L6 teacher forward, 4-layer/312
  student forward and backward, embedding, hidden-state and attention losses, AdamW step) over random batches, divided
  by their time over grouped batches, per example. The batches timed are the 2nd to ``--steps``+1th of each order
  (the grouped order puts its longest batch first; after it both orders are shuffles, so both samples are
  representative), interleaved one random then one grouped, after warm-up on the last batches.

Usage: python bench/group_by_length.py [--data-dir ../shared/data/glue/MRPC] [--task mrpc] [--steps 20]
       [--max-seq-length 128] [--threads N]
The last line printed is a JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed  # noqa: E402

from distill.config import StudentConfig, TaskConfig  # noqa: E402
from distill.tasks.data import collator, load_task_data, task_spec, tokenize  # noqa: E402
from distill.method.layer_map import build_layer_map  # noqa: E402
from distill.method.objective import DistillationObjective  # noqa: E402
from distill.method.trainer import EpochBatchSampler, example_lengths  # noqa: E402
from students import build_student  # noqa: E402
from teachers.models import resolve_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="mrpc")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue" / "MRPC"))
    parser.add_argument("--teacher", default="minilm")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="timed steps each way")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    set_seed(0)

    task = TaskConfig(name=args.task, data_dir=args.data_dir, max_seq_length=args.max_seq_length)
    spec = task_spec(task)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.teacher))
    train_set = tokenize(load_task_data(task, spec)["train"], tokenizer, spec, args.max_seq_length)
    lengths = example_lengths(train_set)
    plain = EpochBatchSampler(len(train_set), args.batch_size, seed=0).global_batches(0)
    grouped = EpochBatchSampler(len(train_set), args.batch_size, seed=0, lengths=lengths).global_batches(0)

    def padded(batches):
        return sum(max(lengths[i] for i in b) * len(b) for b in batches) / sum(lengths)

    teacher = AutoModelForSequenceClassification.from_pretrained(resolve_model(args.teacher),
                                                                 num_labels=spec.num_labels).eval()
    student = build_student(teacher, StudentConfig(preset="tinybert-4l-312")).train()
    layer_map = build_layer_map("uniform", teacher.config.num_hidden_layers, student.config.num_hidden_layers)
    objective = DistillationObjective(teacher.requires_grad_(False), student,
                                      {"embedding": 1, "hidden": 1, "attention": 1}, layer_map).train()
    optimizer = torch.optim.AdamW([p for p in objective.trainable.parameters() if p.requires_grad], lr=1e-5)
    collate = collator(tokenizer)
    columns = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in train_set.column_names]
    rows = train_set.select_columns(columns)

    def step(indices) -> tuple[float, int]:
        batch = collate([rows[i] for i in indices])
        start = time.perf_counter()
        loss, _ = objective(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, len(indices)

    steps = min(args.steps, len(plain) - 1 - args.warmup)  # timed: batches 1..steps; warm-up: the last ones
    for indices in plain[len(plain) - args.warmup:] + grouped[len(grouped) - args.warmup:]:
        step(indices)
    seconds = {"random": 0.0, "grouped": 0.0}
    examples = {"random": 0, "grouped": 0}
    for k in range(steps):
        for name, batches in (("random", plain), ("grouped", grouped)):
            took, n = step(batches[k + 1])
            seconds[name] += took
            examples[name] += n
        print(f"step {k + 1}/{steps}: random {seconds['random']:.1f} s, grouped {seconds['grouped']:.1f} s",
              flush=True)
    per_example = {name: seconds[name] / examples[name] for name in seconds}
    result = {
        "task": args.task, "train_examples": len(train_set), "mean_tokens": round(sum(lengths) / len(lengths), 1),
        "padding_random": round(padded(plain), 3), "padding_grouped": round(padded(grouped), 3),
        "ms_per_example_random": round(1000 * per_example["random"], 2),
        "ms_per_example_grouped": round(1000 * per_example["grouped"], 2),
        "step_speedup": round(per_example["random"] / per_example["grouped"], 3),
        "steps": steps, "threads": torch.get_num_threads(),
    }
    print(f"{args.task}: random batches pad to {result['padding_random']}x the real tokens, grouped ones to "
          f"{result['padding_grouped']}x; a distillation step per example is {result['step_speedup']}x faster grouped")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
