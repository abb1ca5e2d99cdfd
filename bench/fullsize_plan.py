"""The full-size job on paper: the work of each stage for full SST-2 and MNLI with a BERT-base teacher, and what it
takes on this CPU against one GPU, from FLOP counts and this machine's measured throughput.

Setting (TinyBERT's task distillation, Jiao et al., 2020): a BERT-base teacher (12 layers, hidden 768, FFN 3072)
fine-tuned 3 epochs; every training example augmented with N = 20 copies (p = 0.4, K = 15, a BERT-base masked LM);
the 4-layer/312 student (FFN 1200) trained 10 epochs of the intermediate step and 3 of the prediction step on the
augmented set, batch 32; teacher logits cached once. General distillation is left out (a one-time cost per teacher
and student shape, not per task). SQuAD v1.1 (extractive QA) is planned without augmentation, as the paper ran it:
the teacher fine-tuned 2 epochs (BERT's SQuAD recipe), then the same 10 + 3 epochs of the two steps over the training
features (a question and its context cut to 384 pieces, windows sharing 128, as ``configs/squad_minilm.yaml`` cuts
them at its own length).

What is measured here, and what is assumed:
- rows and tokens: SST-2 from the full GLUE train set (../shared/data/glue/SST-2), tokenized with the uncased WordPiece
  vocabulary of BERT-base (MiniLM's); tokens per batch are those of length-sorted-free random batches of 32 padded to
  their longest example, as the loop pads. The copies kept per augmented example and the single-piece words per
  example (one masked-LM row each) are measured on the first 1,000 SST-2 examples. MNLI's 392,702 training pairs are
  not on this machine: its tokens per pair are taken as those of the STS-B training pairs measured here, a stated
  stand-in.
- FLOPs: 2 per multiply-add; a forward pass of a BERT-style encoder over T tokens costs per layer 8·T·H² (Q, K, V, O
  projections) + 4·T·H·F (FFN) + 4·T²·H (scores and weighted values); a training step costs 3 forwards.
- this CPU's throughput: the distillation step of ``bench/distill_throughput.py --teacher mpnet`` (a 12-layer, 768-wide
  teacher, the 4-layer/312 student, batch 32, length 128), its FLOPs divided by its measured time (the saved run's
  JSON, ``--measured FILE``); for augmentation, whose rows are short, the masked-LM throughput measured by
  ``bench/augment_speed.py`` (``--augment-gflops``, 110 GFLOP/s on this machine).
- the GPU: one NVIDIA H200 as ``bench/gpu_loop.sh`` measured the same step through the training loop (a 12-layer,
  768-wide teacher, the 4-layer/312 student, length 128): at batch 256 in bf16 it ran at ``--gpu-tflops`` (132.5
  TFLOP/s through the loop, collating in two worker processes; 79.8 in the prefetch thread in the same run); at batch
  32 a step took ``--gpu-step-ms`` (51.4 ms in fp32, about the same in bf16 and fp16), because the host, not the GPU, set its pace. A training stage of batch-32 steps is taken to cost the longer
  of its steps times that floor and its FLOPs at that rate; augmentation and the teacher's logits, batched large,
  their FLOPs at that rate. A projection from those two measurements, not a measured job.

Usage: python bench/fullsize_plan.py --measured runs/bench_mpnet_1.txt [--gpu-tflops 132.5] [--gpu-step-ms 51.4]
       python bench/fullsize_plan.py --cpu-gflops 225.6 --copies-per-example 14.9   (the throughput as measured before)
       [--teacher-cache]   (the intermediate step's teacher run once, its pass giving the logits; the cache's disk)
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data" / "glue"
QA_DATA = ROOT.parent / "shared" / "data" / "qa" / "squad-v1.1"
TEACHER = {"layers": 12, "hidden": 768, "ffn": 3072, "heads": 12}  # BERT-base
STUDENT = {"layers": 4, "hidden": 312, "ffn": 1200}  # TinyBERT-4
MASKED_LM_HEAD = 2 * 768 * 30522  # FLOPs of the MLM head at the one masked position of a row
EPOCHS = {"teacher": 3, "intermediate": 10, "prediction": 3}
BATCH = 32


def forward_flops(model: dict, tokens_per_sequence: float) -> float:
    """FLOPs of one forward pass over one sequence of ``tokens_per_sequence`` tokens."""
    t, h, f = tokens_per_sequence, model["hidden"], model["ffn"]
    return model["layers"] * (8 * t * h * h + 4 * t * h * f + 4 * t * t * h)


def padded_tokens(lengths: list[int], seed: int = 0) -> float:
    """Mean padded length of random batches of 32 (each padded to its longest example)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    batches = [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
    return statistics.mean(max(lengths[j] for j in batch) for batch in batches)


def read_tsv(path: Path, columns: list[str]) -> list[list[str]]:
    with path.open(encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        index = [header.index(c) for c in columns]
        return [[row[i] for i in index] for row in reader if len(row) == len(header)]


def measure(tokenizer, stopwords: frozenset[str]) -> dict:
    """Rows, tokens and augmentation statistics measured on the local GLUE files."""
    from distill.tasks.words import split_words

    sst2 = read_tsv(DATA / "SST-2" / "train.tsv", ["sentence"])
    sst2_lengths = [len(ids) for ids in tokenizer([r[0] for r in sst2])["input_ids"]]
    stsb = read_tsv(DATA / "STS-B" / "train.tsv", ["sentence1", "sentence2"])
    stsb_lengths = [len(ids) for ids in tokenizer([r[0] for r in stsb], [r[1] for r in stsb])["input_ids"]]
    sample = [r[0] for r in sst2[:1000]]
    single = 0
    for text in sample:
        for start, end in split_words(text):
            word = text[start:end]
            if word.isalpha() and word.lower() not in stopwords:
                single += len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1
    return {
        "sst2": {"rows": len(sst2), "tokens": statistics.mean(sst2_lengths), "padded": padded_tokens(sst2_lengths),
                 "single_piece_words": single / len(sample)},
        "mnli": {"rows": 392_702, "tokens": statistics.mean(stsb_lengths), "padded": padded_tokens(stsb_lengths),
                 "single_piece_words": 2 * single / len(sample)},  # two texts a pair
        "squad": squad_features(tokenizer),
    }


def squad_features(tokenizer, max_seq_length: int = 384, doc_stride: int = 128) -> dict:
    """Features of the SQuAD v1.1 training questions (../shared/data/qa/squad-v1.1) as the QA task type cuts them:
    rows are features, tokens their pieces; no augmentation (``single_piece_words`` 0)."""
    from distill.tasks.question_answering import read_squad

    rows = read_squad(QA_DATA / "train.json")
    encoded = tokenizer([q.lstrip() for q in rows["question"]], list(rows["context"]), truncation="only_second",
                        max_length=max_seq_length, stride=doc_stride, return_overflowing_tokens=True)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    return {"rows": len(lengths), "questions": len(rows), "tokens": statistics.mean(lengths),
            "padded": padded_tokens(lengths), "single_piece_words": 0.0, "teacher_epochs": 2, "augment": False}


def cache_bytes(task: dict, copies_per_example: float, bytes_per_value: int = 2) -> float:
    """Disk of the intermediate step's teacher-output cache (``distill.teacher_cache``): per augmented row of T real
    tokens, hidden states (T, 768) of the embeddings and the 4 mapped layers and scores (12, T, T) of those layers."""
    rows = task["rows"] * (1 + copies_per_example) if task.get("augment", True) else task["rows"]
    tokens, layers = task["tokens"], STUDENT["layers"]
    values = (1 + layers) * tokens * TEACHER["hidden"] + layers * TEACHER["heads"] * tokens * tokens
    return rows * values * bytes_per_value


def plan(task: dict, copies_per_example: float, cpu_flops_per_s: float, gpu_flops_per_s: float,
         augment_flops_per_s: float, teacher_cache: bool = False, gpu_step_s: float = 0.0) -> list[dict]:
    """Rows, tokens, FLOPs and time of each stage of the full-size job for one task; with ``teacher_cache``, the
    intermediate step's teacher runs one pass (the cache) instead of one per epoch (reading the cache not counted),
    and the prediction step's teacher logits come from that pass.
    On the GPU a training stage (batches of ``BATCH``) takes at least ``gpu_step_s`` seconds a step."""
    rows, padded = task["rows"], task["padded"]
    augmented = rows * (1 + copies_per_example) if task.get("augment", True) else rows
    teacher_forward, student_forward = forward_flops(TEACHER, padded), forward_flops(STUDENT, padded)
    # Augmentation: one masked-LM row per single-piece word, the masked text and the original as a pair (2T tokens).
    mlm_rows = rows * task["single_piece_words"]
    epochs = task.get("teacher_epochs", EPOCHS["teacher"])
    stages = [
        ("teacher fine-tuning", rows * epochs, 3 * teacher_forward * rows * epochs, 0.0),
        ("augmentation (masked LM)", mlm_rows, mlm_rows * (forward_flops(TEACHER, 2 * task["tokens"]) + MASKED_LM_HEAD),
         0.0),
        ("intermediate step", augmented * EPOCHS["intermediate"],
         augmented * (1 if teacher_cache else EPOCHS["intermediate"]) * teacher_forward,
         augmented * EPOCHS["intermediate"] * 3 * student_forward),
        # With the cache, its build keeps the logits of the same forward pass: no second teacher pass.
        ("teacher logits (in the cache)", augmented, 0.0, 0.0) if teacher_cache else
        ("teacher logits (cached once)", augmented, augmented * teacher_forward, 0.0),
        ("prediction step", augmented * EPOCHS["prediction"], 0.0, augmented * EPOCHS["prediction"] * 3 * student_forward),
    ]
    training = ("teacher fine-tuning", "intermediate step", "prediction step")
    out = []
    for name, sequences, teacher_flops, student_flops in stages:
        total = teacher_flops + student_flops
        rate = augment_flops_per_s if name.startswith("augmentation") else cpu_flops_per_s
        floor = sequences / BATCH * gpu_step_s if name in training else 0.0
        out.append({"stage": name, "sequences": sequences, "tokens": sequences * padded, "teacher_flops": teacher_flops,
                    "student_flops": student_flops, "cpu_hours": total / rate / 3600,
                    "gpu_hours": max(total / gpu_flops_per_s, floor) / 3600,
                    "gpu_hours_flops": total / gpu_flops_per_s / 3600})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measured", help="saved output of bench/distill_throughput.py --teacher mpnet")
    parser.add_argument("--cpu-gflops", type=float, help="this CPU's distillation throughput, instead of --measured")
    parser.add_argument("--gpu-tflops", type=float, default=132.5, help="the GPU's sustained throughput in the "
                        "distillation step (H200, bf16, batch 256, two collation workers, through the loop: "
                        "bench/gpu_loop.sh)")
    parser.add_argument("--gpu-step-ms", type=float, default=51.4, help="the least time of a batch-32 training step "
                        "on the GPU (H200, batch 32, length 128, through the loop: bench/gpu_loop.sh)")
    parser.add_argument("--augment-gflops", type=float, default=110.0,
                        help="masked-LM throughput of the augmenter on this CPU (bench/augment_speed.py)")
    parser.add_argument("--teacher-cache", action="store_true", help="plan the intermediate step with the "
                        "teacher-output cache (one teacher pass, not one per epoch) and print the cache's size")
    parser.add_argument("--copies-per-example", type=float, help="augmented rows kept per example (default: measured "
                        "from runs/sst2_mpnet/augmented/stage.json, 1,000 examples augmented)")
    args = parser.parse_args()
    from augment.augmenter import load_stopwords
    from teachers.models import load_tokenizer

    if (args.measured is None) == (args.cpu_gflops is None):
        parser.error("give one of --measured and --cpu-gflops")
    if args.measured:
        bench = next(json.loads(line) for line in reversed(Path(args.measured).read_text().splitlines())
                     if line.startswith("{"))
        step_flops = forward_flops(TEACHER, bench["seq_length"]) * bench["batch_size"] + \
            3 * forward_flops(STUDENT, bench["seq_length"]) * bench["batch_size"]
        cpu = step_flops / (bench["ms"]["distillation"] / 1000)
        source = (f"{bench['num_threads']} threads; {bench['ms']['distillation']:.0f} ms for "
                  f"{step_flops / 1e12:.2f} TFLOP")
    else:
        cpu, source = args.cpu_gflops * 1e9, "given"
    gpu = args.gpu_tflops * 1e12
    copies = args.copies_per_example
    if copies is None:
        record = json.loads((ROOT / "runs" / "sst2_mpnet" / "augmented" / "stage.json").read_text())
        copies = record["num_augmented"] / 1000
    measured = measure(load_tokenizer("minilm"), load_stopwords())
    print(f"this CPU: {cpu / 1e9:.1f} GFLOP/s sustained in a distillation step ({source}); GPU: {gpu / 1e12:g} TFLOP/s, "
          f"at least {args.gpu_step_ms:g} ms a batch-{BATCH} training step; {copies:.1f} augmented copies kept "
          "per example")
    result = {"cpu_gflops": cpu / 1e9, "gpu_tflops": gpu / 1e12, "gpu_step_ms": args.gpu_step_ms, "copies_per_example": copies, "tasks": {}}
    for task in ("sst2", "mnli", "squad"):
        stats = measured[task]
        what = (f"{stats['rows']:,} features of {stats['questions']:,} questions" if "questions" in stats else
                f"{stats['rows']:,} training examples")
        print(f"\n{task}: {what}, {stats['tokens']:.1f} tokens each on average, "
              f"{stats['padded']:.1f} per padded row, {stats['single_piece_words']:.1f} single-piece words each")
        print(f"{'stage':30s} {'sequences':>12s} {'tokens':>10s} {'teacher PFLOP':>14s} {'student PFLOP':>14s} "
              f"{'CPU hours':>10s} {'GPU hours':>10s}")
        rows = plan(stats, copies, cpu, gpu, args.augment_gflops * 1e9, args.teacher_cache, args.gpu_step_ms / 1000)
        for row in rows:
            print(f"{row['stage']:30s} {row['sequences']:12,.0f} {row['tokens'] / 1e9:9.2f}B "
                  f"{row['teacher_flops'] / 1e15:14.1f} {row['student_flops'] / 1e15:14.1f} {row['cpu_hours']:10.1f} "
                  f"{row['gpu_hours']:10.2f}")
        total_cpu, total_gpu = sum(r["cpu_hours"] for r in rows), sum(r["gpu_hours"] for r in rows)
        total_flops = sum(r["gpu_hours_flops"] for r in rows)
        print(f"{'total':30s} {'':>12s} {'':>10s} {'':>14s} {'':>14s} {total_cpu:10.1f} {total_gpu:10.2f}")
        print(f"GPU hours at {gpu / 1e12:g} TFLOP/s with no floor on a step (batches large enough): {total_flops:.2f}")
        result["tasks"][task] = {"stats": stats, "stages": rows, "cpu_hours": total_cpu, "gpu_hours": total_gpu,
                                 "gpu_hours_flops": total_flops}
        if args.teacher_cache:
            size = cache_bytes(stats, copies)
            result["tasks"][task]["teacher_cache_bytes"] = size
            print(f"teacher-output cache (float16): {size / 1e9:,.0f} GB of disk")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
