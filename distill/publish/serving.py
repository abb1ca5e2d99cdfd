"""Serving an extractive QA reader: :class:`QuestionAnswerer` answers from a student folder, a pushed checkpoint or its
ONNX file with the windows the model was scored with (``transformers`` 5 has no question-answering pipeline)."""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from pathlib import Path

import datasets
import torch

from distill.tasks.qa_postprocess import MAX_ANSWER_LENGTH, answers
from distill.tasks.question_answering import (DEFAULT_MAX_SEQ_LENGTH, QUESTION_ANSWERING, WINDOWS_KEY, doc_stride,
                                              reader_windows, tokenize_questions)

logger = logging.getLogger(__name__)


class QuestionAnswerer:
    """Answers questions from their contexts with an extractive QA checkpoint or its ONNX file, the way the
    evaluation reads answers (features over long contexts, the best valid span). ``transformers`` 5 removed its
    ``question-answering`` pipeline; a saved student is a plain ``...ForQuestionAnswering`` checkpoint, which that
    pipeline of ``transformers`` 4 reads as it is.

    The windows (``max_seq_length``, ``doc_stride``, ``max_answer_length``) are those the model was scored with: given
    here, else read from the model (its ``config.json``'s ``question_answering`` entry, written when a student is
    saved or exported; an ONNX file's ``export.json``; the config of the pipeline run a student folder is in). A model
    that records none is read with ``run_qa.py``'s 384 / 128 / 30, with a warning: other windows than the evaluation's
    give other answers.

    Args:
        model: a checkpoint folder, an ``.onnx`` file (its folder holds the tokenizer, as a student's ``onnx/``
            does), or a loaded ``...ForQuestionAnswering`` model with ``tokenizer``.
        tokenizer: the model's tokenizer (default: the one saved beside it).
        max_seq_length: pieces per feature (question, context window and special tokens); default: the model's.
        doc_stride: pieces shared by two windows of one context; default: the model's, or a third of a given
            ``max_seq_length``.
        max_answer_length: the longest answer, in pieces; default: the model's.
        device: where a PyTorch model runs (default: where its weights are; ONNX files run on the CPU).
        progress: show the tokenizing and evaluating progress bars (default: quiet).

    Call with a question and a context, a list of questions and one context they share, or lists of both (one
    context per question); returns {"answer", "start", "end", "score"} (characters of the context, end exclusive;
    score as in :func:`answers`), or a list of them. Raises ValueError for other shapes.
    """

    def __init__(self, model, tokenizer=None, max_seq_length: int | None = None, doc_stride: int | None = None,
                 max_answer_length: int | None = None, device=None, progress: bool = False):
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        from distill.device import model_device
        from distill.publish.runtime import OnnxClassifier

        if isinstance(model, (str, Path)):
            path, what = Path(model), str(model)
            onnx = path.suffix == ".onnx"
            folder = path.parent if onnx else path
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(folder))
            model = OnnxClassifier(path) if onnx else AutoModelForQuestionAnswering.from_pretrained(what).eval()
            # A checkpoint's own config (a folder, or a hub repository the student was pushed to), else its files
            saved = (None if onnx else getattr(model.config, WINDOWS_KEY, None)) or saved_windows(folder)
        else:
            saved = getattr(getattr(model, "config", None), WINDOWS_KEY, None)
            what = f"the {type(model).__name__} given"
        if tokenizer is None:
            raise ValueError("QuestionAnswerer: give the tokenizer of a model passed as an object")
        self.model, self.tokenizer, self.progress = model, tokenizer, progress
        self.windows = _windows(saved, what, max_seq_length, doc_stride, max_answer_length)
        self.max_seq_length = self.windows["max_seq_length"]
        self.device = torch.device(device) if device is not None else (model_device(model) or torch.device("cpu"))

    def __call__(self, question: str | list[str], context: str | list[str]) -> dict | list[dict]:
        from distill.logs import no_progress_bars
        from distill.tasks.evaluate import predict

        single = isinstance(question, str)
        if single and not isinstance(context, str):
            raise ValueError("one question takes one context (a str); for several contexts give a question for each")
        questions = [question] if single else list(question)
        contexts = [context] * len(questions) if isinstance(context, str) else list(context)
        if len(questions) != len(contexts):
            raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts: give one context for each "
                             "question, or one context (a str) that they all share")
        if not questions:
            return []
        rows = datasets.Dataset.from_dict({"question": questions, "context": contexts,
                                           "label": [{"text": [""], "answer_start": [0]}] * len(questions)})
        with no_progress_bars() if not self.progress else nullcontext():
            features = tokenize_questions(rows, self.tokenizer, self.windows["max_seq_length"],
                                          self.windows["doc_stride"])
            outputs = predict(self.model, features, self.tokenizer, device=self.device, progress=self.progress,
                              task_type=QUESTION_ANSWERING)
        found = answers(outputs, features["labels"], self.windows["max_answer_length"])
        results = [{k: v for k, v in found[i].items() if k != "gold"} for i in range(len(questions))]
        return results[0] if single else results


def _windows(saved: dict | None, what: str, max_seq_length: int | None, stride: int | None,
             max_answer_length: int | None) -> dict[str, int]:
    """The windows a :class:`QuestionAnswerer` reads with: those given, else the model's ``saved`` ones (a stride
    from a given ``max_seq_length`` when only that is given), else ``run_qa.py``'s, with a warning naming ``what``
    records none."""
    if saved is None and max_seq_length is None:
        logger.warning("QuestionAnswerer: %s records no windows (the max_seq_length, doc_stride and max_answer_length "
                       "it was scored with, in its config.json's %r entry); reading with %d / %d / %d, whose answers "
                       "may differ from its evaluation's: pass max_seq_length=... (and doc_stride=...), or export the "
                       "student again (run_distill.py export --student DIR) to record them", what, WINDOWS_KEY,
                       DEFAULT_MAX_SEQ_LENGTH, doc_stride(DEFAULT_MAX_SEQ_LENGTH), MAX_ANSWER_LENGTH)
    if max_seq_length is not None:  # the model's answer length is kept; the stride follows the length given
        windows = {**reader_windows(max_seq_length), **{k: v for k, v in (saved or {}).items()
                                                         if k == "max_answer_length"}}
    elif saved is not None:
        windows = {**reader_windows(int(saved["max_seq_length"])), **saved}
    else:
        windows = reader_windows(DEFAULT_MAX_SEQ_LENGTH)
    for name, value in (("doc_stride", stride), ("max_answer_length", max_answer_length)):
        if value is not None:
            windows[name] = value
    return {name: int(windows[name]) for name in ("max_seq_length", "doc_stride", "max_answer_length")}


def saved_windows(folder: Path) -> dict | None:
    """The windows a QA model folder records (:func:`reader_windows`): its ``config.json``'s :data:`WINDOWS_KEY`
    entry, else an ONNX folder's ``export.json`` one, else those of the ``task.max_seq_length`` of the pipeline run
    whose student (or its ``onnx/``) the folder is; None when none does."""
    for name in ("config.json", "export.json"):
        try:
            entry = json.loads((folder / name).read_text(encoding="utf-8")).get(WINDOWS_KEY)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(entry, dict) and "max_seq_length" in entry:
            return entry
    length = _trained_length(folder)
    return reader_windows(length) if length is not None else None


def _trained_length(folder: Path) -> int | None:
    """The ``task.max_seq_length`` of the pipeline run whose student (or its ``onnx/``) ``folder`` is, else None."""
    from distill.publish.export import pipeline_folder_of

    for candidate in (folder, folder.parent):
        run = pipeline_folder_of(candidate)
        if run is not None:
            return int(json.loads((run / "config.json").read_text(encoding="utf-8"))["task"]["max_seq_length"])
    return None
