"""General distillation (Jiao et al., 2020, §3.4 and §4.1): a pre-trained (not fine-tuned) teacher encoder
supervises a student encoder on unlabelled text through the intermediate-layer losses only: embedding, hidden states
and attention scores (Eq. 7-9), no prediction term.

The result is a bare encoder (``AutoModel``: no classifier), its tokenizer (the teacher's) and the learnt projections
W_e, W_h (``projections.safetensors``): the starting point of task distillation, ``pipeline --student DIR``, where
the projections are loaded again.

Layout of the output folder: the student checkpoint and tokenizer, ``projections.safetensors``, ``corpus/`` (the
packed corpus, unless streamed), ``log.jsonl``, ``checkpoints/`` while running, ``stage.json`` when done.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate import PartialState
from safetensors.torch import save_file
from transformers import AutoModel, set_seed

from distill.publish.card import encoder_card
from distill.method.checkpoint import mark_stage_done, mark_stage_started, stage_done, write_json_atomic
from distill.config import ConfigError, GeneralConfig, PipelineConfig, fingerprint, hashed_dict
from distill.job.corpus import corpus_fingerprint, corpus_sources, load_packed_corpus
from distill.tasks.data import collator
from distill.method.fingerprints import content_or_name
from distill.device import run_device
from distill.method.layer_map import build_layer_map
from distill.method.objective import DistillationObjective, intermediate_terms
from distill.method.processes import (FAILED_FILE, failure_marked, from_this_launch, is_main_process, launch_marker,
                               on_main, several_processes, wait_for)
from distill.method.trainer import train
from students import build_student, student_shape
from teachers.models import load_config as load_model_config
from teachers.models import load_tokenizer, resolve_model

logger = logging.getLogger(__name__)

PROJECTIONS_FILE = "projections.safetensors"


def load_encoder(name_or_path: str):
    """The pre-trained encoder of a checkpoint (any head is dropped), frozen and in eval mode.

    Raises:
        ModelError: the checkpoint cannot be found or loaded.
    """
    config = load_model_config(name_or_path)
    if any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
        logger.warning("general distillation teacher %s is a fine-tuned classifier; the paper uses a pre-trained "
                       "encoder. Its encoder is used as it is.", name_or_path)
    return AutoModel.from_pretrained(resolve_model(name_or_path)).eval().requires_grad_(False)


# Left out of the run id: where and whether the stage runs, and how the corpus is named (it is in by content,
# through corpus_fingerprint, so the same text at another path keeps the id).
NOT_IN_RUN_ID = ("enabled", "cache_dir", "corpus")


def general_config(config: PipelineConfig, for_pipeline: bool = True) -> GeneralConfig:
    """The general distillation a pipeline config asks for, with its teacher named: ``general.teacher``, else the
    task teacher (``teacher.model``'s encoder, else ``teacher.base_model``). In the pipeline (``for_pipeline``) the
    student is the task's ``student``; ``distill --stage general`` uses ``general.student``."""
    general = config.general
    teacher = general.teacher or config.teacher.model or config.teacher.base_model
    student = config.student if for_pipeline else general.student
    return dataclasses.replace(general, teacher=teacher, student=student)


def general_run_id(config: GeneralConfig) -> tuple[str, str]:
    """Fingerprints of a general distillation (its settings and the corpus) and of its packed corpus.

    A teacher given as a local folder counts by its files' bytes
    (:func:`distill.method.fingerprints.content_or_name`), so two different teachers saved at the same path
    (``runs/teacher`` of two projects) get two cache entries, and a copy of the same teacher elsewhere finds the entry
    again; a hub name or ``minilm`` counts by its name."""
    teacher = content_or_name(config.teacher)
    corpus = corpus_fingerprint(corpus_sources(config.corpus), teacher, config.max_seq_length, config.corpus_column)
    settings = {k: v for k, v in hashed_dict(config).items() if k not in NOT_IN_RUN_ID}
    settings["teacher"] = teacher
    return fingerprint(settings, corpus), corpus


def cache_folder(config: GeneralConfig, run_id: str) -> Path:
    """Where the pipeline keeps the general-distilled student of ``config``: ``<cache>/<teacher>-<shape>-<run id>``
    under ``general.cache_dir`` (default ``$TINYDISTILL_CACHE/general``, ``~/.cache/tinydistill/general``)."""
    from teachers.assets import cache_dir

    root = Path(config.cache_dir) if config.cache_dir else cache_dir() / "general"
    shape = student_shape(config.student, load_model_config(config.teacher))
    name = f"{Path(config.teacher).name}-{shape['num_hidden_layers']}l{shape['hidden_size']}-{run_id}"
    return root / name


# How many times this process has entered :func:`exclusive` for a folder: the processes of a launch enter in step, so
# the count tells the holder file of this entry from that of the previous one (a sweep's next student).
_ENTRIES: dict[str, int] = {}


@contextmanager
def exclusive(folder: Path):
    """Hold an exclusive lock on ``folder`` (a ``.lock`` file beside it) while the block runs: two pipelines that
    need the same general stage make it once, the second waits and then reuses it.

    Under a multi-process launch the main process takes the lock for all of the job's processes (each process's own
    lock would wait for the main one, which waits for them inside the stage) and, once it holds it, says so in
    ``<folder>.holder`` (:func:`distill.method.processes.launch_marker`, with this entry's count); the others wait for
    that by reading the file, not at a collective barrier: another job may hold the lock for longer than a process
    group's timeout (30 minutes). The block must keep the main process in it until the others are in (its first step a
    barrier, as in :func:`distill.job.stage_distill.general_stage`): the holder file goes with the lock.

    Raises:
        ProcessFailedError: (a process other than the main one) the main process stopped before it held the lock, or
            in the block before this one had read the holder file.
    """
    import fcntl

    holder = folder.with_name(folder.name + ".holder")
    entry = _ENTRIES[str(folder)] = _ENTRIES.get(str(folder), 0) + 1
    if several_processes() and not is_main_process():
        wait_for(folder, lambda: _held(holder, entry))
        yield
        return
    handle, held = None, False
    try:
        # The others may still be waiting for the holder file (gone with the lock if this process fails): a failure
        # here, before or after it is written, must stop them.
        with failure_marked(folder):
            folder.parent.mkdir(parents=True, exist_ok=True)
            handle = open(folder.with_name(folder.name + ".lock"), "w")
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = True
            (folder / FAILED_FILE).unlink(missing_ok=True)  # an earlier launch's, now out of date
            if several_processes():
                write_json_atomic(holder, launch_marker(entry=entry))
            yield
    finally:
        if held:
            holder.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)
        if handle is not None:
            handle.close()


def _held(holder: Path, entry: int) -> dict | None:
    """The holder file's marker when this launch's main process wrote it for this ``entry``; else None."""
    marker = from_this_launch(holder)
    return marker if marker is not None and marker.get("entry") == entry else None


def run_general_distillation(config: GeneralConfig, output_dir: str | Path, device: torch.device | None = None) -> dict:
    """Distil ``config.teacher`` into a new student encoder on ``config.corpus``; resume if interrupted.

    Args:
        config: teacher, corpus, student shape and initialisation, layer map, loss weights, training schedule.
        output_dir: where the student, tokenizer, projections and logs are written.
        device: where it trains (None: :func:`distill.device.run_device`).

    Returns:
        The stage record: run id, layer map, steps, samples seen, seconds, final per-term losses.

    Raises:
        ConfigError: an impossible student shape. DataError: a missing or empty corpus.
        ModelError: a teacher that cannot be loaded. CheckpointError: the folder holds another run's output.
    """
    out = Path(output_dir)
    run_id, corpus_id = general_run_id(config)
    if (record := stage_done(out, run_id)) is not None:
        logger.info("general distillation: done (%d steps), skipping", record["steps"])
        return record
    start = time.perf_counter()
    teacher_config = load_model_config(config.teacher)
    try:
        shape = student_shape(config.student, teacher_config)
    except ValueError as error:
        raise ConfigError(f"general.student: {error}") from None
    try:  # before the teacher is loaded and the corpus packed
        layer_map = build_layer_map(config.layer_map, teacher_config.num_hidden_layers, shape["num_hidden_layers"])
    except ValueError as error:
        raise ConfigError(f"general.layer_map: {error}") from None
    tokenizer = load_tokenizer(config.teacher)
    teacher = load_encoder(config.teacher)
    processes = PartialState()  # under `accelerate launch`: one process packs and saves, the others wait and read
    mark_stage_started(out)  # (in the main process) its record's seconds count from here
    pack = functools.partial(load_packed_corpus, config.corpus, tokenizer, config.max_seq_length, config.streaming,
                             cache_dir=out / "corpus", column=config.corpus_column, cache_id=corpus_id)
    if not config.streaming:  # one process packs and saves it; the others wait for it (by its record), then read it
        on_main(out / "corpus", corpus_id, pack)
    corpus = pack()
    set_seed(config.train.seed)  # student weights and projections are drawn from the global RNG
    student = build_student(teacher, config.student, layer_map, encoder_only=True)
    objective = DistillationObjective(teacher, student, intermediate_terms(config.weights), layer_map,
                                      share_projection=config.share_projection, relation_heads=config.relation_heads,
                                      hidden_loss=config.hidden_loss)
    device = device if device is not None else run_device()
    state = train(objective, corpus, collator(tokenizer), config.train, out, run_id, "general distillation",
                  device=device)
    if processes.is_main_process:
        student.save_pretrained(out)
        tokenizer.save_pretrained(out)
        save_projections(objective, out)
        recipe = [f"student: {shape}, init {config.student.init}",
                  f"layer map (student 0..M -> teacher): {[0, *layer_map]}",
                  f"losses: {intermediate_terms(config.weights)} (embedding, hidden states, attention scores)",
                  f"{state.step} steps of batch {config.train.batch_size} x {config.max_seq_length} tokens, lr "
                  f"{config.train.learning_rate:g}"]
        encoder_card(name=out.name, teacher=config.teacher, corpus=config.corpus, recipe=recipe,
                     command=f"python run_distill.py distill --stage general --teacher {config.teacher} --corpus "
                             f"{' '.join(config.corpus)} --max-steps {state.step}").save(out / "README.md")
    processes.wait_for_everyone()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    final = {k: v for k, v in log[-1].items() if k.startswith("loss")} if log else {}
    record = {
        "teacher": config.teacher, "corpus": config.corpus, "layer_map": [0, *layer_map], "steps": state.step,
        "samples": state.samples, "final": final, "device": str(device),
    }
    if processes.is_main_process:
        record = mark_stage_done(out, run_id, record)  # adds seconds (from mark_stage_started) and resumed
        # Only now: a kill before the marker finds the checkpoints and resumes instead of starting again.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    processes.wait_for_everyone()
    record.setdefault("seconds", round(time.perf_counter() - start, 1))  # other processes: their own wall time
    return {**record, "run_id": run_id}


def save_projections(objective: DistillationObjective, folder: Path) -> None:
    """Write the objective's learnt projections W (h_S -> h_T) next to the student, if it has any."""
    projections = {k: v.contiguous() for k, v in objective.trainable["projections"].state_dict().items()}
    if projections:
        save_file(projections, folder / PROJECTIONS_FILE)
