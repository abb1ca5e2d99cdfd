"""AdamW's default implementation against its fused kernel, in the training loop's own optimizer, timed side by side.

For each model (the MiniLM-L6 teacher's shape with a 2-label head, as teacher fine-tuning trains it, and the 3-layer/384
student cut from it, as a prediction step trains it; random weights of the real shapes, 30,522-word embedding tables
included, since the loop trains them too) it times full training steps (forward, backward, the optimizer step of
:func:`distill.method.trainer._optimizer`) at batch 32 and ``--seq-length`` tokens, interleaved: one step with the default
AdamW, then one with the fused one, ``--repeats`` times after warm-up. It prints per model

- ``step_speedup``: the median over pairs of (default step time / fused step time), with the quartiles of the pairs;
- ``optimizer_share_default`` / ``optimizer_share_fused``: the median share of a step spent in ``optimizer.step()``;
- ``max_abs_difference``: the largest difference of any parameter between two copies trained ``--repeats`` + 2 steps
  on the same batches and dropout masks, one with each kernel (the same update to rounding).

Usage: python bench/adamw_step.py [--repeats 12] [--seq-length 64] [--threads N]
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


def quartiles(values: list[float]) -> list[float]:
    return [round(q, 3) for q in statistics.quantiles(values, n=4)]


def measure(shape: dict, repeats: int, seq_length: int, batch_size: int = 32) -> dict:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, num_attention_heads=12, num_labels=2, **shape)
    models = {"default": BertForSequenceClassification(config).train()}
    models["fused"] = copy.deepcopy(models["default"])
    train = TrainConfig(learning_rate=5e-5)
    optimizers = {name: _optimizer(model, train, fused=name == "fused") for name, model in models.items()}
    batches = [(torch.randint(1000, 30522, (batch_size, seq_length)), torch.randint(0, 2, (batch_size,)))
               for _ in range(repeats + 2)]

    def step(name: str, batch, seed: int) -> tuple[float, float]:
        model, optimizer = models[name], optimizers[name]
        torch.manual_seed(seed)  # the same dropout masks for both copies of a step
        start = time.perf_counter()
        model(input_ids=batch[0], labels=batch[1]).loss.backward()
        before = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        return end - start, end - before

    for number, batch in enumerate(batches[:2]):  # warm-up, both kinds
        step("default", batch, number), step("fused", batch, number)
    times = {"default": [], "fused": []}
    for number, batch in enumerate(batches[2:], 2):
        for name in ("default", "fused"):
            times[name].append(step(name, batch, number))
    ratios = [d[0] / f[0] for d, f in zip(times["default"], times["fused"])]
    difference = max((a - b).abs().max().item() for a, b in zip(models["default"].parameters(),
                                                                 models["fused"].parameters()))
    return {
        "parameters_millions": round(sum(p.numel() for p in models["default"].parameters()) / 1e6, 2),
        "step_speedup": round(statistics.median(ratios), 3),
        "step_speedup_quartiles": quartiles(ratios),
        "step_ms_default": round(statistics.median(t for t, _ in times["default"]) * 1000, 1),
        "step_ms_fused": round(statistics.median(t for t, _ in times["fused"]) * 1000, 1),
        "optimizer_share_default": round(statistics.median(o / t for t, o in times["default"]), 3),
        "optimizer_share_fused": round(statistics.median(o / t for t, o in times["fused"]), 3),
        "max_abs_difference": difference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=12, help="timed pairs of steps per model")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {"threads": torch.get_num_threads(), "batch_size": 32, "seq_length": args.seq_length,
               "torch": torch.__version__, "models": {}}
    for name, shape in SHAPES.items():
        result = measure(shape, args.repeats, args.seq_length)
        results["models"][name] = result
        print(f"{name}: step {result['step_ms_default']} ms default, {result['step_ms_fused']} ms fused; speedup "
              f"{result['step_speedup']} (quartiles {result['step_speedup_quartiles']}); optimizer share "
              f"{result['optimizer_share_default']} -> {result['optimizer_share_fused']}; max |difference| "
              f"{result['max_abs_difference']:.2e}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
