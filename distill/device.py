"""The one device decision every stage uses.

The training loop runs through `accelerate`, which picks this process's device (its GPU under ``accelerate launch``,
else the first CUDA / MPS / XPU device, else the CPU; ``ACCELERATE_USE_CPU=1`` forces the CPU). Every other stage,
teacher evaluation, the teacher-logit cache, the augmenter's masked LM and word-vector search, and the benchmark's
accelerator rows, takes the same device from :func:`run_device`, so a GPU machine never runs inference on the CPU
while its GPU idles. Stages are handed the device as an argument; none picks its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def run_device() -> torch.device:
    """This process's device: accelerate's choice (``PartialState().device``).

    ``ACCELERATE_USE_CPU`` is passed on as ``PartialState(cpu=True)``: ``PartialState`` alone does not read it (only
    ``Accelerator`` does), so on a GPU machine the stages would be handed the GPU and the training loop's
    ``Accelerator`` would then refuse the CPU it was asked for.
    """
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU")).device


def is_accelerator(device: torch.device) -> bool:
    """Whether ``device`` is an accelerator (anything but the CPU)."""
    return torch.device(device).type != "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (for timing); nothing to wait for on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def model_device(model: torch.nn.Module) -> torch.device | None:
    """The device of a model's first parameter or buffer (None for a model without any, e.g. an ONNX session)."""
    for tensor in (*model.parameters(), *model.buffers()) if isinstance(model, torch.nn.Module) else ():
        return tensor.device
    return None


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether tensors on ``a`` live on ``b``: the same type and, where both name one, the same index (``cpu`` and a
    CPU device with an index are the same memory)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    return a.type == "cpu" or a.index is None or b.index is None or a.index == b.index


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads (None: leave as it is), then put the previous count back,
    so a timing setting never slows the training stages that run after it in the same process (e.g. the next seed)."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
