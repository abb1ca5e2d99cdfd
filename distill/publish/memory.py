"""Peak inference memory of one benchmark row, measured in a fresh process (:func:`distill.publish.benchmark.peak_memory`
starts it). This module imports only what loading and running a row needs (torch, transformers, ONNX Runtime), not
the data or training code, so that each row's process starts in a few seconds.
"""

from __future__ import annotations

import gc
import importlib
from pathlib import Path

import torch

from distill.publish.runtime import OnnxClassifier, quantize_torch
from distill.tasks import load_head_model


def memory_worker(variant: str, artefact: str, source: str, inputs: dict, threads: int | None, queue) -> None:
    """In a fresh process: load one row's model, run one inference, report resident memory above the start (MB)."""
    import ctypes

    import psutil

    if threads:
        torch.set_num_threads(threads)
    _import_code(variant, source)  # the libraries' code is not the model's memory
    process = psutil.Process()
    gc.collect()
    start = process.memory_info().rss
    if variant == "pytorch":
        model = load_head_model(artefact).eval()
    elif variant == "int8":
        model = quantize_torch(load_head_model(source).eval())
        model.load_state_dict(torch.load(artefact, weights_only=False))
    else:
        model = OnnxClassifier(artefact, threads)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed load-time buffers back, so they do not count
    except OSError:
        pass
    loaded = process.memory_info().rss
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current resident size
        f.write("5")
    with torch.no_grad():
        model(**inputs)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    peak = int(status["VmHWM"].strip().split()[0]) * 1024
    queue.put({"model_mb": (loaded - start) / 1e6, "peak_mb": (max(peak, loaded) - start) / 1e6})


def _import_code(variant: str, source: str) -> None:
    """Import, before the start is measured, the code that loading the row's model imports on its way: ONNX Runtime,
    or the model family's ``transformers`` modules (imported lazily by ``from_pretrained``)."""
    if variant not in ("pytorch", "int8"):
        import onnxruntime  # noqa: F401
        return
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto  # noqa: F401

    family = AutoConfig.from_pretrained(source).model_type.replace("-", "_")
    try:
        importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError:  # a family laid out otherwise: its import is then counted with the model
        pass
