"""What a benchmark row or an exported student runs on besides the PyTorch model: an ONNX Runtime session with a
model's calling convention, and PyTorch's dynamic int8 quantization. Light to import (no data or training code), so
that a fresh process measuring a row's memory (:mod:`distill.publish.memory`) starts in the time torch takes to import.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


class OnnxClassifier:
    """An ONNX Runtime session with the calling convention of a `transformers` model with a head, so that evaluation
    and timing treat it like any model: ``model(**inputs)`` has the graph's outputs as float tensors, ``logits``
    ((B, C) or (B, T, C)) or ``start_logits`` and ``end_logits`` (B, T) of a QA head.

    Args:
        path: an ``.onnx`` file with inputs ``input_ids``, ``attention_mask`` (and ``token_type_ids``) of shape
            (B, T) int64, and the head's outputs (:func:`output_names`).
        num_threads: ONNX Runtime intra-op threads (None: its default, all cores).
    """

    def __init__(self, path: str | Path, num_threads: int | None = None):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # ONNX Runtime's worker threads spin after a run by default; interleaved with PyTorch rows they steal the
        # cores PyTorch runs on (measured here: a PyTorch forward of 18 ms took 43 ms right after an ONNX one).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if num_threads:
            options.intra_op_num_threads = num_threads
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, **inputs: torch.Tensor) -> SimpleNamespace:
        feed = {}
        for name in self.input_names:
            value = inputs.get(name)
            if value is None:  # e.g. token_type_ids that the batch leaves out: BERT's default is all zeros
                value = torch.zeros_like(inputs["input_ids"])
            feed[name] = value.cpu().numpy().astype(np.int64)
        outputs = self.session.run(self.output_names, feed)
        return SimpleNamespace(**{name: torch.from_numpy(value) for name, value in zip(self.output_names, outputs)})

    def eval(self) -> "OnnxClassifier":
        return self

    def to(self, device) -> "OnnxClassifier":
        return self


def quantize_torch(model: torch.nn.Module) -> torch.nn.Module:
    """PyTorch dynamic int8 quantization of every ``nn.Linear`` (a copy; the model is unchanged)."""
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)
