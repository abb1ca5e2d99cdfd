"""Deployable files for a student: ONNX Runtime graphs (fp32 and int8) beside the PyTorch checkpoint, checked against
the PyTorch model on the dev set; and the int8 / ONNX machinery the benchmark shares.

``export_student(folder, ...)`` writes ``folder/onnx/``: ``model.onnx`` (``torch.onnx.export``, dynamo exporter,
dynamic batch and length), ``model_quantized.onnx`` (ONNX Runtime dynamic quantization, int8 weights), the model's
``config.json`` and the tokenizer files, and ``export.json``: for each file its size, the largest absolute difference
of its logits from PyTorch's over the dev set, the fraction of dev predictions equal to PyTorch's, and its dev
metrics; plus a hash of the weights it was made from and of the dev set it was checked on (texts, labels, task,
metrics, sequence length), so an unchanged student checked on the same dev set is not exported twice, a check on another
dev set is made anew (its numbers are never reported for a dev set they were not measured on), and the benchmark can
time these files instead of making its own; the longest input the graphs take (``max_seq_length``); and what the task
type keeps for serving (:meth:`distill.tasks.TaskType.serving_config`: a QA reader's windows, ``question_answering``,
which :class:`distill.tasks.question_answering.QuestionAnswerer` reads). A student saved without those gets them in
its own ``config.json`` too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from distill.method.checkpoint import write_json_atomic
from distill.tasks.data import TaskSpec, tokenize
from distill.tasks.evaluate import compute_metrics, predict
from distill.publish.report import weight_files
from distill.publish.runtime import OnnxClassifier, quantize_torch  # noqa: F401  (also imported from here)
from distill.tasks import check_model_head, record_serving, saved_settings

logger = logging.getLogger(__name__)

ONNX_FOLDER = "onnx"
EXPORT_FILE = "export.json"
FILES = {"onnx": "model.onnx", "onnx-int8": "model_quantized.onnx"}


def input_names(model: torch.nn.Module) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return names + ["token_type_ids"] if getattr(model.config, "type_vocab_size", 0) > 1 else names


def output_names(model: torch.nn.Module, probe: dict) -> list[str]:
    """The names of the head's outputs, as the model returns them (``logits``; ``start_logits``, ``end_logits``)."""
    with torch.no_grad():
        return [name for name in model(**probe).keys() if name not in ("hidden_states", "attentions")]


def graph_module(model: torch.nn.Module) -> torch.nn.Module:
    """What of ``model`` an ONNX file holds: the model, or the part it names as its ``graph_module`` (a sentence
    encoder with a map after its pooling: the encoder, as sentence-transformers' ONNX backend runs it)."""
    return getattr(model, "graph_module", model)


def around(model: torch.nn.Module, session):
    """``session`` (an ONNX Runtime runner of :func:`graph_module`) with what ``model`` runs after that part, so its
    outputs are scored as the model's."""
    return model.around(session) if hasattr(model, "around") else session


def export_onnx(model: torch.nn.Module, path: Path, max_length: int, task_type) -> float:
    """Export a model with a head to ONNX with dynamic batch size and length, its outputs named as the model names
    them (:func:`output_names`, as Optimum and ``pipeline()`` expect); returns the largest absolute difference of its
    logits from PyTorch's on a probe batch (a check that the graph is the model). ``task_type`` (the task's
    :class:`distill.tasks.TaskType`) gives the probe inputs of its layout and reads the head's logits.

    Raises:
        RuntimeError: the exported graph's logits differ from the model's by more than 1e-3.
    """
    model = model.eval()
    names = input_names(model)
    probe = task_type.example_inputs(model.config, 2, 16, torch.Generator().manual_seed(0))
    # every dimension of the type's input layout dynamic (batch, sequence; a multiple-choice type's choices too)
    axes = {dim: torch.export.Dim("length" if dim == "sequence" else dim, min=2 if dim == "sequence" else 1,
                                  max=max_length if dim == "sequence" else 4096) for dim in task_type.input_dims}
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet_exporter():
        torch.onnx.export(model, (), kwargs=probe, f=str(path), input_names=names,
                          output_names=output_names(model, probe),
                          dynamic_shapes={name: {i: axes[dim] for i, dim in enumerate(task_type.input_dims)}
                                          for name in names}, dynamo=True,
                          external_data=False, verbose=False)
    padded = {name: value.clone() for name, value in probe.items()}
    if "attention_mask" in padded:  # the second row padded: the graph must mask as the model does, not assume none
        padded["attention_mask"][1, ..., 10:] = 0
    session, difference = OnnxClassifier(path), 0.0
    for inputs in (probe, padded):
        with torch.no_grad():
            expected = task_type.logits(model(**inputs)).numpy()
        found = task_type.logits(session(**inputs)).numpy()
        keep = np.broadcast_to(_real_positions(inputs, expected.shape, task_type.per_token), expected.shape)
        difference = max(difference, float(np.abs(found - expected)[keep].max()))
    if difference > 1e-3:
        raise RuntimeError(f"the ONNX export of {path.name} differs from the PyTorch model by {difference:.2e}")
    return difference


def write_metadata(path: Path, entries: dict) -> None:
    """Put ``entries`` (what the model is served with: a multi-label ``decision_threshold``, a QA reader's windows) in
    the ONNX file's ``metadata_props``, each value as JSON (ONNX Runtime reads them as
    ``session.get_modelmeta().custom_metadata_map``). Nothing to write leaves the file as it is."""
    if not entries:
        return
    import onnx

    model = onnx.load(str(path))
    kept = {prop.key: prop.value for prop in model.metadata_props if prop.key not in entries}
    del model.metadata_props[:]
    for key, value in {**kept, **{key: json.dumps(value) for key, value in entries.items()}}.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def _real_positions(inputs: dict, shape: tuple, per_token: bool) -> np.ndarray:
    """Where logits of shape (B, C) or, ``per_token``, (B, T, C) are read: every row, and for per-token logits the
    real tokens only (a padded position's logits are never read)."""
    if not per_token or "attention_mask" not in inputs:
        return np.ones((shape[0],) + (1,) * (len(shape) - 1), dtype=bool)
    mask = inputs["attention_mask"].numpy().astype(bool)
    return mask.reshape(mask.shape + (1,) * (len(shape) - 2))


@contextmanager
def _quiet_exporter():
    """The exporter's own chatter off while it runs: about 36 INFO lines of ``onnx_ir``'s initializer deduplication,
    WARNING lines of ``torch.onnx`` (``torchvision is not installed``) and Python warnings about torch internals
    (dynamic axis names, a deprecated pytree class). None of them is actionable by a user of this package, and the
    export is checked by its logits instead (:func:`export_onnx`)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def quantize_onnx(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic quantization: int8 weights (``QuantType.QInt8``).

    The graph is quantized from a copy without its intermediate shape annotations (``graph.value_info``): ONNX Runtime
    infers them again before quantizing and stops with ``InferenceError`` when an annotation disagrees with what it
    infers, which ONNX Runtime 1.30 does for the annotations of the dynamo exporter (torch 2.11). The weights and the
    graph's inputs and outputs are unchanged.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    del model.graph.value_info[:]
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # it logs advice on pre-processing through the root logger
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".quantize-") as work:
            plain = Path(work) / source.name
            onnx.save(model, str(plain))
            quantize_dynamic(str(plain), str(target), weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def weights_hash(folder: Path) -> str:
    """SHA-256 (first 16 hex digits) of a checkpoint's weight files (and of a sentence-transformers Dense module's,
    which the model runs after the pooling): what an export was made from."""
    digest = hashlib.sha256()
    for path in weight_files(folder):
        if path.name == "projections.safetensors":
            continue
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def dev_set_hash(spec: TaskSpec, dev, max_seq_length: int) -> str:
    """SHA-256 (first 16 hex digits) of what an export's dev numbers depend on besides the weights: the task, its
    metrics, the dev texts and labels, and the sequence length they were cut to."""
    columns = {name: list(dev[name]) for name in (*spec.text_columns, "label")}
    text = json.dumps([spec.name, list(spec.metrics), max_seq_length, columns], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reusable_export(folder: Path, checked_on: str | None = None) -> dict | None:
    """The ``export.json`` record of ``folder/onnx`` when it was made from the weights now in ``folder`` (and, given
    ``checked_on``, a :func:`dev_set_hash`, checked on that dev set), else None."""
    record_path = folder / ONNX_FOLDER / EXPORT_FILE
    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("weights") != weights_hash(folder):
        return None
    if checked_on is not None and record.get("checked_on") != checked_on:
        return None
    if not all((folder / ONNX_FOLDER / name).is_file() for name in record["files"]):
        return None
    return record


def export_student(folder: Path, spec: TaskSpec, dev, max_seq_length: int, int8: bool = True) -> dict:
    """Write ``folder/onnx/`` (see the module docstring) and return its ``export.json`` record; reuse it when it was
    made from the same weights and checked on the same dev set.

    Args:
        folder: a classifier checkpoint with its tokenizer (a pipeline's ``student/``).
        spec, dev: the task and its dev split (text columns and ``label``), to check the files on.
        max_seq_length: tokens per dev example; the graphs accept any length up to max(128, this).
        int8: also write ``model_quantized.onnx``.

    Raises:
        RuntimeError: the fp32 graph's logits differ from PyTorch's by more than 1e-3 on a probe batch.
        ModelError: the student's head does not fit the task (:func:`distill.tasks.check_model_head`).
    """
    check_model_head(folder, spec, "student")
    checked_on = dev_set_hash(spec, dev, max_seq_length)
    record = reusable_export(folder, checked_on)
    if record is not None and any(set(spec.metrics) - set(entry.get("dev", {})) for entry in record["files"].values()):
        record = None  # checked by an older scorer (a metric the task names now is missing): check again
    if record is not None and (not int8 or FILES["onnx-int8"] in record["files"]):
        logger.info("export: %s/%s is up to date (same weights, same %d dev examples)", folder, ONNX_FOLDER, len(dev))
        return record
    out = folder / ONNX_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    model = spec.type.model_class(spec).from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    before = model.config.to_json_string()
    serving = record_serving(model, spec, max_seq_length, keep=True)  # a QA reader's windows, kept if saved
    if model.config.to_json_string() != before:  # a student saved without them gets them beside its weights
        model.config.save_pretrained(folder)
    tuned = saved_settings(model.config, spec)  # a multi-label decision threshold, chosen on dev's tuning half
    export_onnx(graph_module(model), out / FILES["onnx"], max(128, max_seq_length), spec.type)
    names = [FILES["onnx"]]
    if int8:
        quantize_onnx(out / FILES["onnx"], out / FILES["onnx-int8"])
        names.append(FILES["onnx-int8"])
    else:  # an int8 file of earlier weights must not ship (or be uploaded) beside the new graph
        (out / FILES["onnx-int8"]).unlink(missing_ok=True)
    for name in names:  # the graph carries what it is served with, for a reader of the .onnx file alone
        write_metadata(out / name, {**serving, **tuned})
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    encoded = tokenize(dev, tokenizer, spec, max_seq_length)
    reference = predict(model, encoded, tokenizer, task_type=spec.type, device="cpu")
    labels = encoded["labels"]  # (N,), per example (T_i,) for token classification, a record per QA feature
    files = {}
    for name in names:
        logits = predict(around(model, OnnxClassifier(out / name)), encoded, tokenizer, task_type=spec.type,
                         device="cpu")
        same = spec.type.same_prediction(logits, reference, spec, labels)
        difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(logits, reference))
        files[name] = {"size_mb": (out / name).stat().st_size / 1e6,
                       "max_abs_logit_difference": difference,
                       "same_prediction": float(same.mean()),
                       "dev": compute_metrics(spec, logits, labels, settings=tuned)}  # at the saved threshold
        logger.info("export: %s, max |logit difference| %.2e, dev %s", name, files[name]["max_abs_logit_difference"],
                    files[name]["dev"])
    record = {"weights": weights_hash(folder), "checked_on": checked_on, "num_dev_examples": len(dev),
              "pytorch": {"dev": compute_metrics(spec, reference, labels, settings=tuned)}, "files": files,
              "max_seq_length": max(128, max_seq_length), **serving, **tuned}
    write_json_atomic(out / EXPORT_FILE, record)
    return record


# The folders of a pipeline run (or of a sweep's student) that hold a model: a model folder named by one of these inside
# a run folder was made with that run's config.
MODEL_STAGES = ("teacher", "student", "student_intermediate", "pruned")


def pipeline_folder_of(model: Path) -> Path | None:
    """The pipeline output folder whose config a model folder was made with: ``model`` itself when it is one (its
    ``config.json`` is the run's config, not a model's), the run whose stage folder it is (``teacher/``,
    ``student/``, ``student_intermediate/``, ``pruned/``), or for a sweep's student (``<run>/students/<name>/`` or a
    stage folder in it) the sweep's folder, whose config names it among its ``sweep`` entries; else None.

    Returns:
        The run folder, absolute (``.`` and ``..`` resolved as the working folder gives them, links kept).
    """
    model = Path(os.path.abspath(model))
    if _run_config(model) is not None:
        return model
    if model.name in MODEL_STAGES and _run_config(model.parent) is not None:
        return model.parent
    entry = model.parent if model.name in MODEL_STAGES else model  # <sweep>/students/<name>
    if entry.parent.name == "students":
        sweep = _run_config(entry.parent.parent)
        if sweep is not None and entry.name in {e.get("name") for e in sweep.get("sweep") or []}:
            return entry.parent.parent
    return None


def _run_config(folder: Path) -> dict | None:
    """The pipeline config saved in ``folder/config.json``, or None (none there, or a model's config)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and {"task", "teacher", "student"} <= set(config) else None
