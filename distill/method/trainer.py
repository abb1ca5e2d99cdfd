"""The one training loop used by every stage: teacher fine-tuning, MLM adaptation and both distillation steps.

It runs through `accelerate` (CPU, one GPU, or several processes under ``accelerate launch``), checkpoints every
``save_steps`` optimizer steps and at the end, and resumes exactly: model, projections, optimizer, scheduler, RNG
states, the data position and (fp16) the loss scale are restored, so on CPU an interrupted and resumed run ends with
the same weights as an uninterrupted one.

Data is either an indexable dataset (shuffled per epoch by a seeded sampler; the position is epoch and batch) or a
streamed ``datasets.IterableDataset`` read in order (split across processes with ``split_dataset_by_node``; the
position is the dataset's own ``state_dict``). Logs go to the progress bar, ``log.jsonl`` and, when the
``tensorboard`` package is installed, ``tensorboard/`` through accelerate's tracker.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import multiprocessing
import random
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import datasets
import numpy as np
import pyarrow.compute
import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import gather_object, is_tensorboard_available
from datasets.distributed import split_dataset_by_node
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from safetensors.torch import load_file

from distill.method.checkpoint import (
    CheckpointError,
    load_latest_good_checkpoint,
    save_checkpoint,
    save_file_atomic,
    untie,
    write_atomic,
)
from distill.config import ConfigError, TrainConfig

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """A loss term became NaN or infinite, or exactly 0 while the values it compares differ (its value was lost to
    rounding or overflow); the last good checkpoint is kept."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training after a finished step, and a checkpoint of that step was written.

    Attributes:
        signal_number: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``).
    """

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


@contextmanager
def stop_on_signal():
    """While active, SIGINT and SIGTERM set ``flag["signal"]`` instead of stopping the process, so the loop can finish
    its step and checkpoint; a second signal interrupts at once. Outside the main thread (where handlers cannot be
    set) the flag is never set. The previous handlers are restored on exit."""
    flag: dict = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signal_number, frame):
        if flag["signal"] is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signal_number).name}")
        flag["signal"] = signal_number
        logger.warning("%s received: finishing the current step and writing a checkpoint (send it again to stop at "
                       "once)", signal.Signals(signal_number).name)

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


# With group_by_length: examples are sorted by length within groups of this many global batches of the epoch's shuffle.
LENGTH_GROUP_BATCHES = 50


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of a seeded permutation per epoch, starting at a given batch: the data position is resumable.

    With several processes each takes its share of every global batch (rank::world_size), so the global batch is
    ``batch_size · world_size`` examples and the plain data order does not depend on the number of processes.

    With ``lengths`` (tokens per example) the batches are grouped by length, as ``group_by_length`` does in the
    Hugging Face Trainer: the epoch's permutation is cut into groups of :data:`LENGTH_GROUP_BATCHES` global batches,
    each group is sorted by length (longest first) and cut into batches, and the full batches are shuffled, the one
    holding the longest example first (an out-of-memory error shows at the first step); a short last batch stays last.
    An epoch still visits every example once, in batches of the same sizes; a batch pads to a length close to its
    examples' own, where a random batch pads to the longest of 32 random examples (1.5x the real tokens on MRPC, 2.5x
    on STS-B, 3x on SST-2 with MiniLM's tokenizer). The groups are global batches, so the grouped order depends on
    the number of processes: resume a grouped run with the same number.
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 lengths: Sequence[int] | None = None):
        if lengths is not None and len(lengths) != num_examples:
            raise ValueError(f"lengths: {len(lengths)} values for {num_examples} examples")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.lengths = None if lengths is None else torch.as_tensor(lengths, dtype=torch.long)
        self.epoch, self.start_batch = 0, 0

    def set_position(self, epoch: int, start_batch: int) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch() - self.start_batch)

    def batches_per_epoch(self) -> int:
        return math.ceil(self.num_examples / (self.batch_size * self.world_size))

    def global_batches(self, epoch: int) -> list[list[int]]:
        """Every global batch of ``epoch`` in order (example indices), a pure function of seed and epoch."""
        generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        order = torch.randperm(self.num_examples, generator=generator)
        global_batch = self.batch_size * self.world_size
        if self.lengths is None:
            return [order[b : b + global_batch].tolist() for b in range(0, self.num_examples, global_batch)]
        group = global_batch * LENGTH_GROUP_BATCHES
        batches = []
        for g in range(0, self.num_examples, group):
            members = order[g : g + group]
            # Longest first; ties keep their shuffled order (a stable sort), so the batches depend on the seed only.
            members = members[torch.sort(self.lengths[members], descending=True, stable=True).indices]
            batches += [members[b : b + global_batch].tolist() for b in range(0, len(members), global_batch)]
        if not batches:
            return []
        longest = max(range(len(batches)), key=lambda b: int(self.lengths[batches[b][0]]))
        short = len(batches) - 1 if len(batches[-1]) < global_batch and longest != len(batches) - 1 else None
        rest = [b for b in range(len(batches)) if b not in (longest, short)]
        rest = [rest[i] for i in torch.randperm(len(rest), generator=generator).tolist()]
        return [batches[b] for b in [longest, *rest, *([short] if short is not None else [])]]

    def __iter__(self):
        for chunk in self.global_batches(self.epoch)[self.start_batch :]:
            yield chunk[self.rank :: self.world_size] or chunk[:1]


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # current epoch
    batch_in_epoch: int = 0  # micro-batches of the current epoch already consumed
    samples: int = 0  # examples seen (all processes)
    best_metric: float | None = None  # with an evaluation: the best dev metric so far ...
    best_step: int = 0  # ... and the step whose weights gave it (kept in best/)
    evaluations: list = dataclasses.field(default_factory=list)  # [step, metric] of every evaluation


BEST_FOLDER = "best"  # the best weights so far, when training selects on a dev metric


@dataclass
class Selection:
    """Keep the weights that score best on a dev metric instead of the last ones.

    Attributes:
        evaluate: () -> the dev metric (higher is better), run in eval mode with no gradients.
        eval_steps: evaluate every this many optimizer steps; None: at the end of every epoch. Always at the end.
    """

    evaluate: Callable[[], float]
    eval_steps: int | None = None


def _optimizer(trainable: nn.Module, config: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices only (not biases and LayerNorm weights); ``fused``: its fused kernel
    (one pass over every parameter instead of several per tensor; the same update to rounding), which :func:`train`
    asks for on a CPU and on CUDA without fp16 loss scaling (a fused AdamW skips an overflowed step inside its kernel,
    so accelerate would not see the skip and the schedule would advance); elsewhere (fp16 scaling, MPS) the default
    implementation. On a 2-core CPU the default's per-tensor loops cost about a quarter of a MiniLM-L6 training step,
    the fused kernel a few percent (``bench/cpu_step.py``, docs/performance.md)."""
    decay, no_decay = [], []
    for name, parameter in trainable.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 else decay).append(parameter)  # biases and LayerNorm weights
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.learning_rate, **({"fused": True} if fused else {}))


def total_steps(config: TrainConfig, num_examples: int, world_size: int = 1) -> int:
    """Optimizer steps of a run: ``max_steps``, or ``num_epochs`` passes over ``num_examples`` but at least
    ``min_steps``."""
    if config.max_steps is not None:
        return config.max_steps
    batches = math.ceil(num_examples / (config.batch_size * world_size))
    return max(1, math.ceil(config.num_epochs * batches / config.gradient_accumulation_steps), config.min_steps or 0)


def _rng_state() -> dict:
    """Every generator a step draws from: dropout on a GPU draws from the CUDA generators, not the CPU one."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])  # another GPU count: the CPU part resumes, dropout masks differ


def train(
    objective: nn.Module,
    dataset: Dataset,
    collate_fn: Callable[[list], dict],
    config: TrainConfig,
    output_dir: str | Path,
    run_id: str,
    description: str = "train",
    accelerator: Accelerator | None = None,
    device: torch.device | None = None,
    selection: Selection | None = None,
    prefetch: bool = True,
    lengths: list[int] | None = None,
) -> TrainState:
    """Optimise ``objective.trainable`` on ``dataset``; resume from ``output_dir/checkpoints`` when present.

    Args:
        objective: module with ``trainable`` (ModuleDict) and ``forward(batch) -> (loss, terms)``.
        dataset: indexable dataset of examples; ``collate_fn`` turns a list of them into a batch of tensors.
        config: steps, batch size, learning rate, schedule, checkpointing.
        output_dir: the stage folder; checkpoints go to ``checkpoints/``, logs to ``log.jsonl``.
        run_id: fingerprint of what is being trained; a checkpoint with another run_id is refused.
        description: progress-bar label.
        accelerator: the accelerate object to run through (default: a new one for ``config.mixed_precision``).
        device: the run's device (:func:`distill.device.run_device`); None: the accelerator's. It must be of the
            accelerator's device type: accelerate decides the device, the stages share its decision.
        selection: score a dev metric as training goes and end with the best weights (kept in ``best/``, and in
            the state: ``best_step``, ``best_metric``, ``evaluations``), not the last.
        prefetch: collate the next batches of an indexable dataset ahead of the step, in ``config.num_workers``
            worker processes (:func:`resolve_num_workers`: ``auto``, two on CUDA) or else a background thread
            (:func:`prefetched`; pinned for a CUDA device). Off for a ``collate_fn`` that draws from the global RNG (the masked-LM collator's masks), whose draws must stay
            in order with the step's for exact resume.
        lengths: tokens per example for ``group_by_length`` (the task type's count for its input layout,
            :meth:`distill.tasks.TaskType.example_lengths`); None: :func:`example_lengths` of ``input_ids``.

    Returns:
        The final :class:`TrainState`; ``objective.trainable`` holds the trained (or, with ``selection``, the best)
        weights.

    Raises:
        CheckpointError: a checkpoint in ``output_dir`` belongs to another run.
        NonFiniteLossError: a loss term became NaN or infinite (names step, term and batch).
        TrainingInterrupted: SIGINT/SIGTERM arrived; the step in progress was finished and checkpointed.
        ConfigError: ``mixed_precision: fp16`` on a device where accelerate runs no fp16 (a CPU), before any step;
            a ``device`` of another type than the accelerator's; ``group_by_length`` on data without token ids to
            measure (not a tokenized ``datasets.Dataset``, or a streamed one).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if accelerator is None:
        _allow_new_mixed_precision(config.mixed_precision)
    # Unused parameters are normal here (the student's classifier in the intermediate step), so DDP must look for them.
    accelerator = accelerator or Accelerator(
        mixed_precision=config.mixed_precision,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        log_with="tensorboard" if is_tensorboard_available() else None,
        project_dir=str(output_dir),
    )
    if config.mixed_precision == "fp16" and accelerator.scaler is None and accelerator.device.type == "cpu":
        # accelerate turns fp16 into plain fp32 on a CPU without a word; say so instead of training in another precision.
        raise ConfigError(f"{description}: mixed_precision: fp16 needs a GPU (accelerate runs fp16 only there, with "
                          "loss scaling); on a CPU use mixed_precision: bf16 or no")
    device = torch.device(device) if device is not None else accelerator.device
    if device.type != accelerator.device.type:
        raise ConfigError(f"{description}: asked to train on {device}, but accelerate runs this process on "
                          f"{accelerator.device}; the stages must share accelerate's device")
    torch.manual_seed(config.seed)
    world = accelerator.num_processes
    data = _Batches(dataset, collate_fn, config, accelerator.process_index, world,
                    prefetch=PREFETCH_BATCHES if prefetch else 0, pin=device.type == "cuda", lengths=lengths,
                    device_type=device.type)
    steps = total_steps(config, data.num_examples, world)
    objective.to(device)
    trainable = objective.trainable
    # The accelerate optimizer applies fp16 loss scaling (and skips steps whose gradients overflowed). The scheduler
    # stays ours: total_steps already counts global batches.
    fused = device.type in ("cpu", "cuda") and accelerator.scaler is None
    optimizer = accelerator.prepare_optimizer(_optimizer(trainable, config, fused))
    scheduler = get_linear_schedule_with_warmup(optimizer.optimizer, int(config.warmup_ratio * steps), steps)
    # Under DDP the whole objective is wrapped, so its forward (student, teacher, losses) runs through the wrapper
    # and gradients are all-reduced; the frozen teacher inside has no gradients to reduce.
    model = accelerator.prepare_model(objective) if world > 1 else objective

    state = TrainState()
    restored = load_latest_good_checkpoint(output_dir / "checkpoints", run_id, trainable, optimizer, scheduler)
    if restored is not None:
        checkpoint, saved = restored
        state = TrainState(**saved["state"])
        _set_rng_state(saved["rng"])
        data.resume(saved["extra"].get("data_state"), checkpoint)
        if accelerator.scaler is not None and "scaler" in saved["extra"]:
            accelerator.scaler.load_state_dict(saved["extra"]["scaler"])
        logger.info("%s: resuming from %s (step %d of %d)", description, checkpoint, state.step, steps)
        if accelerator.is_main_process:  # the one writer of the log (another's rewrite would orphan its open file)
            _truncate_log(output_dir / "log.jsonl", state.step)
    if state.step < steps:
        objective.train()
        if accelerator.log_with:
            accelerator.init_trackers("tensorboard", config={k: v for k, v in vars(config).items() if v is not None})
        progress = tqdm(total=steps, initial=state.step, desc=description, disable=not accelerator.is_main_process)
        with (output_dir / "log.jsonl").open("a", encoding="utf-8") as log_file, stop_on_signal() as stop:
            run = _Run(model=model, objective=objective, optimizer=optimizer, scheduler=scheduler, data=data,
                       state=state, steps=steps, config=config, accelerator=accelerator, device=device,
                       output_dir=output_dir, run_id=run_id, description=description, log_file=log_file,
                       progress=progress, stop=stop, selection=selection)
            try:
                _loop(run)
            finally:
                progress.close()
                for tracker in accelerator.trackers:  # not end_training(): that also ends the process group
                    tracker.finish()
        if stop["signal"] is not None:  # it came during the last step, its scoring or its checkpoint: all saved
            name = signal.Signals(stop["signal"]).name
            raise TrainingInterrupted(
                f"{description}: stopped by {name} during its last step; all {steps} steps are done and checkpointed "
                f"in {output_dir / 'checkpoints'}. Re-run the same command to go on from there.", stop["signal"])
    if selection is not None and (output_dir / BEST_FOLDER / BEST_FILE).is_file():
        trainable.load_state_dict(load_file(output_dir / BEST_FOLDER / BEST_FILE))
        logger.info("%s: keeping the weights of step %d (dev %.4f), the best of %s", description, state.best_step,
                    state.best_metric, [round(m, 4) for _, m in state.evaluations])
    return state


BEST_FILE = "trainable.safetensors"


@dataclass
class _Run:
    """Everything one run of the loop works with (see :func:`train`)."""

    model: nn.Module  # the objective, wrapped by DDP under several processes
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    data: "_Batches"
    state: TrainState
    steps: int
    config: TrainConfig
    accelerator: Accelerator
    device: torch.device
    output_dir: Path
    run_id: str
    description: str
    log_file: object
    progress: object
    stop: dict
    selection: Selection | None

    def checkpoint(self) -> Path:
        extra = {"data_state": self.data.position(self.accelerator)}
        if self.accelerator.scaler is not None:  # fp16: the loss scale it has reached, or a resume starts it anew
            extra["scaler"] = self.accelerator.scaler.state_dict()
        path = self.output_dir / "checkpoints" / f"step-{self.state.step:06d}"
        if self.accelerator.is_main_process:
            save_checkpoint(self.output_dir / "checkpoints", self.run_id, self.objective.trainable, self.optimizer,
                            self.scheduler, self.state, _rng_state(), extra, config=dataclasses.asdict(self.config))
        self.accelerator.wait_for_everyone()
        return path

    def evaluate(self) -> None:
        """Score the dev metric; when it is the best so far, keep these weights in ``best/`` (before the checkpoint
        of this step is written, so a checkpoint never points at a best it has not seen)."""
        state = self.state
        if state.evaluations and state.evaluations[-1][0] == state.step:
            return  # this step was scored already (an epoch ended on the last step)
        self.objective.eval()
        with torch.no_grad():
            metric = float(self.selection.evaluate())
        self.objective.train()
        state.evaluations.append([state.step, metric])
        if state.best_metric is None or metric > state.best_metric:
            state.best_metric, state.best_step = metric, state.step
            if self.accelerator.is_main_process:
                weights = {k: v.detach().contiguous().cpu() for k, v in self.objective.trainable.state_dict().items()}
                save_file_atomic(untie(weights), self.output_dir / BEST_FOLDER / BEST_FILE)
            self.accelerator.wait_for_everyone()
        record = {"step": state.step, "epoch": state.epoch, "dev_metric": metric, "best_dev_metric": state.best_metric}
        if self.accelerator.is_main_process:
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()
        logger.info("%s: step %d, dev %.4f (best %.4f at step %d)", self.description, state.step, metric,
                    state.best_metric, state.best_step)


def _loop(run: _Run) -> None:
    """Optimizer steps from ``run.state`` to ``run.steps``, logging, evaluating and checkpointing; see :func:`train`."""
    state, config, accelerator = run.state, run.config, run.accelerator
    world = accelerator.num_processes
    accumulate = config.gradient_accumulation_steps
    window = {"start": time.perf_counter(), "samples": 0}
    every = run.selection.eval_steps if run.selection is not None else None
    interval = check_interval(run.device, config)
    watch = _TermWatch(run.description)
    read = watch.last
    micro = 0
    while state.step < run.steps:
        for batch in run.data.epoch(state.epoch, state.batch_in_epoch):
            # Pinned by the prefetch thread on CUDA, so the copy need not block; elsewhere (MPS) a non-blocking copy
            # from unpinned memory may read it after it is freed.
            batch = {k: v.to(run.device, non_blocking=run.device.type == "cuda") for k, v in batch.items()}
            micro += 1
            sync = micro % accumulate == 0  # the last micro-batch of an optimizer step all-reduces gradients
            with nullcontext() if sync or world == 1 else run.model.no_sync():
                with accelerator.autocast():
                    loss, terms = run.model(batch)
                watch.add(loss, terms, getattr(run.objective, "inputs_differ", None), state)
                accelerator.backward(loss / accumulate)
            state.batch_in_epoch += 1
            size = len(batch["input_ids"]) * world
            state.samples += size
            window["samples"] += size
            if not sync:
                continue
            if config.max_grad_norm > 0:
                accelerator.clip_grad_norm_(run.objective.trainable.parameters(), config.max_grad_norm)
            run.optimizer.step()
            if not accelerator.optimizer_step_was_skipped:
                run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
            state.step += 1
            logged = state.step % config.log_steps == 0 or state.step == run.steps
            scored = run.selection is not None and (state.step == run.steps or (every and state.step % every == 0))
            saved = state.step % config.save_steps == 0 or state.step == run.steps
            stopping = _stop_requested(run.stop, accelerator) and state.step < run.steps
            if logged or scored or saved or stopping or state.step % interval == 0:
                # one host synchronisation for the steps since the last read; the checks run before anything is kept
                read = watch.flush()
                # the bar redraws at its own interval
                run.progress.set_postfix({k: f"{v:.4f}" for k, v in read[1].items()}, refresh=False)
            run.progress.update(1)
            if logged:
                _log(run.log_file, state, read, run.scheduler, window, accelerator)
            if scored:
                run.evaluate()
            if saved:
                path = run.checkpoint()
            if stopping:
                path = path if saved else run.checkpoint()
                name = signal.Signals(run.stop["signal"] or signal.SIGTERM).name
                raise TrainingInterrupted(
                    f"{run.description}: stopped by {name} after step {state.step} of {run.steps}; checkpoint "
                    f"written to {path}. Re-run the same command to resume from it.",
                    run.stop["signal"] or signal.SIGTERM)
            if state.step >= run.steps:
                break
        else:
            state.epoch += 1
            state.batch_in_epoch = 0
            if run.selection is not None and every is None and state.step < run.steps:
                watch.flush()  # checked before the best weights may be kept
                run.evaluate()  # the end of an epoch (not yet checkpointed: a resume re-scores it, same result)


def _stop_requested(stop: dict, accelerator: Accelerator) -> bool:
    """Whether any process received SIGINT/SIGTERM (all processes agree, so they checkpoint and stop together)."""
    if accelerator.num_processes == 1:
        return stop["signal"] is not None
    flag = torch.tensor([0.0 if stop["signal"] is None else 1.0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def _allow_new_mixed_precision(mixed_precision: str) -> None:
    """accelerate keeps one mixed-precision setting per process and refuses another; stages of one pipeline may
    differ (an fp32 teacher fine-tune, then a bf16 distillation), so the setting is reset between them. The process
    group (PartialState) is kept."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)


def example_lengths(dataset) -> list[int]:
    """Tokens per example of a tokenized dataset (its ``input_ids``), for ``group_by_length``.

    Raises:
        ConfigError: the dataset has no ``input_ids`` to measure.
    """
    if not isinstance(dataset, datasets.Dataset) or "input_ids" not in dataset.column_names:
        what = "has no input_ids column" if isinstance(dataset, datasets.Dataset) else "is not a tokenized Dataset"
        raise ConfigError(f"group_by_length: the training data {what} to group by; set group_by_length: false for "
                          "this step")
    column = dataset.with_format("arrow")["input_ids"]
    return pyarrow.compute.list_value_length(column).to_pylist()


# Batches collated ahead of the step by the background thread (:func:`prefetched`).
PREFETCH_BATCHES = 2
# Collation processes that ``num_workers: auto`` starts on a CUDA device. Measured on one H200 (docs/performance.md,
# bench/gpu_loop.sh): bf16 at batch 256, length 128, two workers made a step 50.4 ms against 83.7 with the thread (1.66x
# faster, the model work alone 49.5); at batch 32 the same within the repeats' spread.
AUTO_WORKERS_CUDA = 2


def resolve_num_workers(num_workers: int | str, device_type: str) -> int:
    """The collation processes that ``TrainConfig.num_workers`` asks for on a device of type ``device_type``
    ("cuda", "cpu", "mps"): an integer as it is; ``"auto"``: :data:`AUTO_WORKERS_CUDA` on CUDA where workers fork
    (:func:`forks`: Linux), else 0 (the prefetch thread: on a CPU the workers would take the cores the
    step's kernels use, and a spawned worker would pickle the dataset and start an interpreter of its own)."""
    if num_workers != "auto":
        return int(num_workers)
    return AUTO_WORKERS_CUDA if device_type == "cuda" and forks() else 0


def forks() -> bool:
    """Whether collation workers start by fork here: on Linux, where fork is available whatever the default start
    method (Python 3.14 made it forkserver, which would pickle the dataset and the collate function), the loader asks
    for it; elsewhere (macOS, Windows) they start as the platform's default says."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


class _End:
    """The end of a prefetched iterator, or the error it raised (``error``)."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


def prefetched(iterator, depth: int, pin: bool = False):
    """The items of ``iterator``, made up to ``depth`` ahead by a background thread (batches of tensors: collation
    from Python lists, its Python work, overlaps the step, whose kernels release the GIL). Same items, same order;
    an error in the thread is raised here; closing the generator early stops the thread.

    Args:
        iterator: batches (dicts of tensors) of one epoch; it must draw nothing from the global RNG, which the main
            thread's step draws from (dropout), or the draws would interleave differently from run to run.
        depth: how many batches may wait ready.
        pin: pin each batch's tensors in page-locked memory (a CUDA device copies them without blocking).
    """
    import queue

    if depth < 1:
        raise ValueError(f"prefetched: depth must be >= 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in iterator:
                if pin:
                    item = {k: v.pin_memory() for k, v in item.items()}
                if not put(item):
                    return
            put(_End())
        except BaseException as error:  # handed to the consumer, raised in the training thread
            put(_End(error))

    thread = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        thread.join()


class _Batches:
    """The batches of each epoch from an indexable dataset (seeded shuffle; collated ahead in a background thread
    when ``prefetch`` > 0) or a streamed one (in order, collated in the training thread: the stream's saved position
    must be that of the batches trained on)."""

    def __init__(self, dataset, collate_fn: Callable[[list], dict], config: TrainConfig, rank: int, world: int,
                 prefetch: int = 0, pin: bool = False, lengths: list[int] | None = None, device_type: str = "cpu"):
        self.dataset, self.collate_fn, self.config = dataset, collate_fn, config
        self.rank, self.world = rank, world
        self.prefetch, self.pin = prefetch, pin
        self.streaming = isinstance(dataset, datasets.IterableDataset)
        self.stream, self.resume_state, self.workers = None, None, 0
        if self.streaming:
            if config.num_workers not in (0, "auto"):
                logger.info("num_workers: %d ignored, a streamed dataset is collated in order in the training process",
                            config.num_workers)
            if config.max_steps is None:
                raise ValueError("a streamed dataset has no length: set max_steps for this training run")
            if config.group_by_length:
                raise ConfigError("group_by_length: a streamed dataset is read in order and cannot be grouped by "
                                  "length; set group_by_length: false for this step")
            self.num_examples = 0
            return
        self.num_examples = len(dataset)
        if config.group_by_length:
            lengths = lengths if lengths is not None else example_lengths(dataset)
            if len(lengths) != len(dataset):
                raise ValueError(f"group_by_length: {len(lengths)} lengths for {len(dataset)} examples")
        else:
            lengths = None
        self.sampler = EpochBatchSampler(len(dataset), config.batch_size, config.seed, rank, world, lengths)
        # Worker processes collate only where collation may run ahead (prefetch): the batch order stays the sampler's,
        # drawn in this process, so the batches are the same as in this process.
        self.workers = resolve_num_workers(config.num_workers, device_type) if prefetch else 0
        if config.num_workers not in (0, "auto") and not self.workers:
            logger.info("num_workers: %d ignored, this step's collate function draws from the global RNG and collates "
                        "in the training process", config.num_workers)
        # As many batches ahead in all as the thread makes (prefetch_factor counts per worker); the workers stay up
        # from epoch to epoch (the sampler, read in this process, still sets each epoch's order and start).
        workers = {"num_workers": self.workers, "pin_memory": pin, "persistent_workers": True,
                   "prefetch_factor": max(1, prefetch // self.workers),
                   "multiprocessing_context": "fork" if forks() else None} if self.workers else {}
        # A private generator: creating an iterator must not draw from the global RNG, or a resumed run would diverge.
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, collate_fn=collate_fn, generator=torch.Generator(),
                                 **workers)

    def resume(self, data_state: list | None, checkpoint: Path) -> None:
        """Continue a streamed dataset from the position saved in a checkpoint (one state per process)."""
        if not self.streaming:
            return
        if data_state is None or len(data_state) != self.world:
            found = "no stream position" if data_state is None else f"positions for {len(data_state)} processes"
            raise CheckpointError(
                f"checkpoint {checkpoint} holds {found}, this run streams with {self.world} process(es); resume with "
                "the same data and number of processes, or delete the checkpoints folder to restart"
            )
        self.resume_state = data_state[self.rank]

    def epoch(self, epoch: int, start_batch: int):
        """Yield the batches of ``epoch`` from ``start_batch`` (indexable) or from the saved position (streamed)."""
        if not self.streaming:
            self.sampler.set_position(epoch, start_batch)
            threaded = self.prefetch and not self.workers
            yield from prefetched(iter(self.loader), self.prefetch, self.pin) if threaded else self.loader
            return
        # A fresh stream per epoch: a loaded position applies to the first pass after resuming only.
        self.stream = split_dataset_by_node(self.dataset, self.rank, self.world) if self.world > 1 else self.dataset
        if self.resume_state is not None:
            self.stream.load_state_dict(self.resume_state)
            self.resume_state = None
        self.stream.set_epoch(epoch)
        chunk = []
        for example in self.stream:
            chunk.append(example)
            if len(chunk) == self.config.batch_size:
                yield self.collate_fn(chunk)
                chunk = []
        if chunk:
            yield self.collate_fn(chunk)

    def position(self, accelerator: Accelerator) -> list | None:
        """Every process's stream position (None for an indexable dataset: epoch and batch say where it is)."""
        if not self.streaming:
            return None
        return gather_object([self.stream.state_dict()]) if self.world > 1 else [self.stream.state_dict()]


def _truncate_log(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint we resume from (they will be written again), and a last line cut
    short by a full disk or a kill, which would otherwise stop the resume it is meant to allow."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and record.get("step", step + 1) <= step:
            kept.append(line)
    write_atomic(path, lambda handle: handle.write("".join(line + "\n" for line in kept)), mode="w")


def check_interval(device: torch.device, config: TrainConfig) -> int:
    """Optimizer steps between reads of the loss terms from the device: every step on a CPU (reading costs nothing
    there), every ``log_steps`` (at most 100) on an accelerator, where each read stops the host until the device has finished the
    step, so the next step's kernels cannot be queued behind it."""
    return 1 if device.type == "cpu" else min(config.log_steps, 100)


class _TermWatch:
    """The loss terms of the micro-batches since the last read, kept on the device, checked by :func:`_check_terms`
    in order when read (:meth:`flush`): an error names the first bad micro-batch's step. The loop reads before any
    checkpoint, evaluation, log line or the end, so a checkpoint never holds weights updated from a bad loss."""

    def __init__(self, description: str):
        self.description = description
        self.pending: list[tuple] = []
        self.last: tuple[float, dict[str, float]] = (0.0, {})

    def add(self, loss: torch.Tensor, terms: dict, inputs_differ: dict | None, state: TrainState) -> None:
        names = list(terms)
        differ = inputs_differ or {}
        flagged = [name for name in names if name in differ]
        values = torch.stack([loss.detach().float(), *[terms[n].detach().float() for n in names],
                              *[differ[n].float() for n in flagged]])
        where = f"at optimizer step {state.step + 1} (epoch {state.epoch}, batch {state.batch_in_epoch})"
        self.pending.append((names, flagged, values, where))

    def flush(self) -> tuple[float, dict[str, float]]:
        """Read every pending micro-batch's values in one host synchronisation and check them in order; returns the
        last one's ``(total, {term: value})``."""
        if self.pending:
            values = torch.cat([entry[2] for entry in self.pending]).tolist()
            at = 0
            for names, flagged, tensor, where in self.pending:
                row = values[at:at + len(tensor)]
                at += len(tensor)
                self.last = _check_terms(row, names, flagged, where, self.description)
            self.pending.clear()
        return self.last


def _check_terms(values: list[float], names: list[str], flagged: list[str], where: str,
                 description: str) -> tuple[float, dict[str, float]]:
    """Stop on a loss term that is NaN or infinite, or exactly 0 while the values it compares differ.

    Args:
        values: one micro-batch's total loss, its terms (``names``' order) and the ``inputs_differ`` flags of the
            terms in ``flagged``, read from the device together (:class:`_TermWatch`).
        where: the step, epoch and batch, for the message.

    Returns:
        ``(total, {term name: value})`` as Python floats, for the progress bar and the log.
    """
    total, term_values, differ_values = values[0], values[1 : 1 + len(names)], values[1 + len(names):]
    for name, value in [*zip(names, term_values), ("total", total)]:
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"{description}: loss term {name!r} is {value} {where}; stopping. The last good checkpoint is kept; "
                "lower the learning rate or check the data, then re-run to resume."
            )
    flagged = dict(zip(flagged, differ_values))
    for name, value in zip(names, term_values):
        if value == 0.0 and flagged.get(name, 0.0) > 0:
            raise NonFiniteLossError(
                f"{description}: loss term {name!r} is exactly 0 {where} while the student's and teacher's values it "
                "compares differ: its sum or count was lost to rounding or overflow (e.g. accumulated in fp16), and "
                "training on it would be wrong. Stopping; the last good checkpoint is kept. Train in fp32 or bf16 "
                "(mixed_precision: no | bf16) and report the case."
            )
    return total, dict(zip(names, term_values))


def _log(log_file, state: TrainState, read: tuple[float, dict[str, float]], scheduler, window: dict,
         accelerator: Accelerator) -> None:
    elapsed = time.perf_counter() - window["start"]
    record = {
        "step": state.step,
        "epoch": state.epoch,
        "loss": read[0],
        **{f"loss/{name}": value for name, value in read[1].items()},
        "learning_rate": scheduler.get_last_lr()[0],
        "samples_per_s": window["samples"] / max(elapsed, 1e-9),
    }
    window["start"], window["samples"] = time.perf_counter(), 0
    if accelerator.is_main_process:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
    if accelerator.log_with:
        accelerator.log({k: v for k, v in record.items() if k != "step"}, step=state.step)
