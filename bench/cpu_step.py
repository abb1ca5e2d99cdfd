"""A training step on a CPU three ways, timed side by side: fp32 with AdamW's default implementation, fp32 with its fused
kernel (the loop's choice on a CPU), and bf16 autocast with the fused kernel (``mixed_precision: bf16``).

For each model (the MiniLM-L6 teacher's shape with a 2-label head, as teacher fine-tuning trains it, and the 3-layer/384
student cut from it, as a prediction step trains it; random weights of the real shapes, 30,522-word embedding tables
included, since the loop trains them too) it times full training steps (forward, backward, the optimizer step of
:func:`distill.method.trainer._optimizer`) at batch 32 and ``--seq-length`` tokens, interleaved: one step of each way in
turn, ``--repeats`` times after warm-up, each way on its own copy of the model, the same batches and dropout masks. It
prints per model and way

- ``speedup``: the median over rounds of (the first way's step time / this way's), with the quartiles;
- ``optimizer_share``: the median share of a step spent in ``optimizer.step()``;
- ``max_abs_difference``: the largest difference of any parameter from the first way's copy after the last step
  (the fused kernel: rounding; bf16: the precision of its matrix products).

bf16 autocast pays only on a CPU that multiplies bf16 natively (AVX512-BF16 or AMX: recent AMD EPYC and Ryzen, Intel
Xeon since Cooper Lake); elsewhere PyTorch emulates it and it is slower than fp32. The JSON says which this CPU has.

Usage: python bench/cpu_step.py [--repeats 12] [--seq-length 64] [--threads N]
The last line printed is a JSON object with every number.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import BertConfig, BertForSequenceClassification  # noqa: E402

from distill.config import TrainConfig  # noqa: E402
from distill.method.trainer import _optimizer  # noqa: E402

SHAPES = {  # MiniLM-L6 (all-MiniLM-L6-v2) and the recipes' teacher-half student cut from it
    "teacher (6 layers, 384)": dict(num_hidden_layers=6, hidden_size=384, intermediate_size=1536),
    "student (3 layers, 384)": dict(num_hidden_layers=3, hidden_size=384, intermediate_size=1536),
}
WAYS = {"fp32, default AdamW": (False, False), "fp32, fused AdamW": (True, False), "bf16, fused AdamW": (True, True)}


def quartiles(values: list[float]) -> list[float]:
    return [round(q, 3) for q in statistics.quantiles(values, n=4)]


def measure(shape: dict, repeats: int, seq_length: int, batch_size: int = 32) -> dict:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, num_attention_heads=12, num_labels=2, **shape)
    first = BertForSequenceClassification(config).train()
    models = {way: copy.deepcopy(first) for way in WAYS}
    train = TrainConfig(learning_rate=5e-5)
    optimizers = {way: _optimizer(models[way], train, fused=fused) for way, (fused, _) in WAYS.items()}
    batches = [(torch.randint(1000, 30522, (batch_size, seq_length)), torch.randint(0, 2, (batch_size,)))
               for _ in range(repeats + 2)]

    def step(way: str, batch, seed: int) -> tuple[float, float]:
        model, optimizer, bf16 = models[way], optimizers[way], WAYS[way][1]
        torch.manual_seed(seed)  # the same dropout masks for every way of a step
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=batch[0], labels=batch[1]).loss
        loss.float().backward()
        before = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        return end - start, end - before

    times = {way: [] for way in WAYS}
    for number, batch in enumerate(batches):
        for way in WAYS:
            timed = step(way, batch, number)
            if number >= 2:  # the first two rounds warm up
                times[way].append(timed)
    reference = next(iter(WAYS))
    result = {"parameters_millions": round(sum(p.numel() for p in first.parameters()) / 1e6, 2), "ways": {}}
    for way in WAYS:
        ratios = [r[0] / t[0] for r, t in zip(times[reference], times[way])]
        difference = max((a - b).abs().max().item() for a, b in zip(models[reference].parameters(),
                                                                     models[way].parameters()))
        result["ways"][way] = {
            "step_ms": round(statistics.median(t for t, _ in times[way]) * 1000, 1),
            "speedup": round(statistics.median(ratios), 3), "speedup_quartiles": quartiles(ratios),
            "optimizer_share": round(statistics.median(o / t for t, o in times[way]), 3),
            "max_abs_difference": difference,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=12, help="timed rounds (one step of each way) per model")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    native_bf16 = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    results = {"threads": torch.get_num_threads(), "batch_size": 32, "seq_length": args.seq_length,
               "torch": torch.__version__, "native_bf16": native_bf16, "models": {}}
    for name, shape in SHAPES.items():
        result = measure(shape, args.repeats, args.seq_length)
        results["models"][name] = result
        for way, numbers in result["ways"].items():
            print(f"{name}, {way}: step {numbers['step_ms']} ms, faster by {numbers['speedup']} (quartiles "
                  f"{numbers['speedup_quartiles']}), optimizer share {numbers['optimizer_share']}, max |difference| "
                  f"{numbers['max_abs_difference']:.2e}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
