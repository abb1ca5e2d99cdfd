"""Extractive question answering (SQuAD v1.1): the answer is a span of the context, predicted as a start and an end.

Shapes: N questions, F features, B batch, T word pieces (padded), 2 = (start, end).

A question and its context are tokenised as a pair; a context longer than ``max_seq_length`` pieces becomes several
features (windows of the context that overlap by ``doc_stride`` pieces), as Hugging Face's ``run_qa.py`` does. Each
feature keeps what scoring needs: its question's index, the character span of every context piece (other pieces have
none), the context and the gold answers. A feature whose window does not hold the whole first answer is trained to
point at [CLS] (position 0), the usual convention.

The model's two outputs are stacked into one (B, T, 2) tensor, so the rest of the code (teacher-logit cache, padding,
ONNX checks) treats them like per-token logits with two columns (:meth:`QuestionAnswering.logits`).

The prediction loss is soft cross-entropy over start positions and over end positions (TinyBERT Eq. 10 applied to
each), averaged: (L_start + L_end) / 2, the scale of the model's own QA loss. Both softmaxes run over the positions
that can hold an answer, the context pieces and [CLS], for teacher and student alike; the question, [SEP] and padding
are left out (as TextBrewer masks positions outside the context; Hugging Face's DistilBERT script keeps them). Those
positions are never predicted, and leaving them in would spend the student's capacity matching the teacher's
arbitrary scores there. The temperature divides both sides' logits as for classification (t = 1 by default, as in
TinyBERT; ``distill.temperature`` and ``temperature_squared`` give DistilBERT's T = 2 with T² scaling).

Answers are read as the best valid span over each question's features: the ``n_best`` highest starts and ends among
each feature's context pieces, an end not before its start, at most ``max_answer_length`` pieces, scored by start
plus end logit. Exact match and F1 are those of the official SQuAD v1.1 script (answer text normalised: lower case, no
punctuation, no articles, single spaces; the maximum over the gold answers), computed by ``torchmetrics``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from distill.tasks.base import DataError, TaskSpec, TaskType, deep, pad_rows, register_task, register_task_type
from distill.tasks.qa_postprocess import MAX_ANSWER_LENGTH, NO_SPAN, answers, best_span  # noqa: F401

logger = logging.getLogger(__name__)

QA_METRICS = ("f1", "exact_match")  # F1 first: the primary metric, as the SQuAD leaderboard ranks


# The model config's entry (and the ONNX record's) with the windows a reader was scored with (reader_windows).
WINDOWS_KEY = "question_answering"
# The windows of run_qa.py's defaults: what QuestionAnswerer reads with when a model records none, with a warning.
DEFAULT_MAX_SEQ_LENGTH = 384


def doc_stride(max_seq_length: int) -> int:
    """Pieces shared by two consecutive windows of a long context: a third of the window (``run_qa.py``'s 128 of
    384), so an answer cut by one window's edge lies whole inside the next."""
    return max_seq_length // 3


def reader_windows(max_seq_length: int) -> dict[str, int]:
    """How a reader trained and scored with ``max_seq_length`` cuts and reads: ``max_seq_length`` (pieces per feature),
    ``doc_stride`` (pieces shared by consecutive windows, :func:`doc_stride`) and ``max_answer_length`` (pieces); saved
    in a QA model's ``config.json`` under :data:`WINDOWS_KEY` and in its ONNX record, for :class:`QuestionAnswerer`."""
    return {"max_seq_length": max_seq_length, "doc_stride": doc_stride(max_seq_length),
            "max_answer_length": MAX_ANSWER_LENGTH}


def read_squad(path: str | Path, spec=None) -> datasets.Dataset:
    """A SQuAD v1.1 JSON file (``data[].paragraphs[].qas[]``, each answer ``text`` and ``answer_start``).

    Returns:
        One row per question: ``id``, ``question``, ``context`` (str) and ``label``, the gold answers as
        ``{"text": [str, ...], "answer_start": [int, ...]}`` (the layout of the hub's ``squad``).

    Raises:
        DataError: the file is missing or not JSON, lacks the SQuAD layout, a question has no answer, or an
            answer's text is not at its ``answer_start`` in the context; the message names the file's line (and the
            character of a file of one line, as the official files are) and the question's id.
    """

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a SQuAD v1.1 JSON file (data[].paragraphs[].qas[])")
    try:
        text = path.read_text(encoding="utf-8")
        articles = json.loads(text)["data"]
    except json.JSONDecodeError as error:
        raise DataError(f"{path}, line {error.lineno}, column {error.colno}: not valid JSON ({error.msg})") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start}); save the file as UTF-8") from None
    except (KeyError, TypeError):
        raise DataError(f"{path} has no top-level 'data' list; a SQuAD file is {{\"data\": [{{\"paragraphs\": "
                        "[{\"context\": ..., \"qas\": [...]}]}]}}") from None
    rows: dict[str, list] = {"id": [], "question": [], "context": [], "label": []}
    qa: dict = {}
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = qa["answers"]
                    if not answers:
                        raise DataError(f"{path}, {_question_at(text, qa)}: no answer; SQuAD v1.1 questions all have "
                                        "one (unanswerable questions, as in SQuAD 2.0, are not supported)")
                    for answer in answers:
                        start = answer["answer_start"]
                        if context[start:start + len(answer["text"])] != answer["text"]:
                            raise DataError(f"{path}, {_question_at(text, qa)}: answer {answer['text']!r} is not at "
                                            f"answer_start {start} of its context; fix answer_start")
                    rows["id"].append(str(qa["id"]))
                    rows["question"].append(qa["question"])
                    rows["context"].append(context)
                    rows["label"].append({"text": [a["text"] for a in answers],
                                          "answer_start": [int(a["answer_start"]) for a in answers]})
    except (KeyError, TypeError) as error:
        where = f", {_question_at(text, qa)}" if isinstance(qa, dict) and "id" in qa else ""
        raise DataError(f"{path}{where}: not the SQuAD layout (missing {error}); each paragraph has 'context' and "
                        "'qas', each question 'id', 'question' and 'answers' with 'text' and 'answer_start'") from None
    if not rows["id"]:
        raise DataError(f"{path} holds no question")
    return datasets.Dataset.from_dict(rows)


def _question_at(text: str, qa: dict) -> str:
    """Where a question is in its file's text, for messages: ``line N (question 'ID')`` at its ``"id"`` field, with
    the character in the line where the file is one line long (the official SQuAD files are)."""
    name = f"question {qa['id']!r}"
    for spelled in dict.fromkeys((json.dumps(qa["id"]), json.dumps(qa["id"], ensure_ascii=False))):
        found = re.search(r'"id"\s*:\s*' + re.escape(spelled), text)
        if found is not None:
            line = text.count("\n", 0, found.start()) + 1
            column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
            one_line = "\n" not in text.rstrip("\n")
            return f"line {line}" + (f", character {column}" if one_line else "") + f" ({name})"
    return name


def tokenize_questions(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                       doc_stride: int) -> datasets.Dataset:
    """Features of questions with their contexts: (question, context) pairs cut into windows of the context.

    Args:
        dataset: ``question``, ``context`` and ``label`` (gold answers, see :func:`read_squad`).
        max_seq_length: pieces per feature, question and special tokens included.
        doc_stride: pieces shared by two consecutive windows of one context.

    Returns:
        Per feature: ``input_ids``, ``attention_mask`` (``token_type_ids`` for BERT), ``start_positions`` and
        ``end_positions`` (the first answer's first and last piece; 0, [CLS], when the window does not hold it),
        ``context_mask`` (T,) 1 at the pieces that may hold an answer (the context's and [CLS]), and ``labels``:
        ``{"example": question index, "offsets": [[char_start, char_end] per piece, [-1, -1] outside the context],
        "context": str, "answers": [str]}`` for scoring.

    A question longer than ``max_seq_length`` leaves room for (more than ``doc_stride`` context pieces a window) is
    cut to its first pieces that fit, as BERT's ``run_squad.py`` cuts questions to ``max_query_length``, and the cut
    is logged; every other question is kept whole. (The check is per question: one long question does not stop the
    others, and the windowing needs it, since a window no longer than its stride would never advance.)

    Raises:
        DataError: a slow tokenizer (no offsets), or ``max_seq_length`` too short to hold the special tokens, one
            question piece and more than ``doc_stride`` context pieces.
    """

    if not tokenizer.is_fast:
        raise DataError(f"question answering needs a fast tokenizer (offset mapping); {type(tokenizer).__name__} is "
                        "not one: load the model's tokenizer with use_fast=True")

    specials = tokenizer.num_special_tokens_to_add(pair=True)
    longest_question = max_seq_length - specials - doc_stride - 1  # pieces; the context then gets doc_stride + 1
    if longest_question < 1:
        raise DataError(f"max_seq_length {max_seq_length} holds {specials} special tokens and the doc_stride "
                        f"{doc_stride} that windows share, with no room for a question: raise task.max_seq_length "
                        "(run_qa.py: 384 with a stride of 128)")

    def encode(batch: dict, indices: list[int]) -> dict:
        questions = [q.lstrip() for q in batch["question"]]  # leading spaces only waste pieces (run_qa.py)
        cut = _cut_questions(questions, tokenizer, longest_question)
        if cut:
            logger.warning("%d question(s) longer than %d pieces cut to their first %d (max_seq_length %d, "
                           "doc_stride %d; run_squad.py's max_query_length does the same)", cut, longest_question,
                           longest_question, max_seq_length, doc_stride)
        encoded = tokenizer(questions, batch["context"], truncation="only_second", max_length=max_seq_length,
                            stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True)
        features: dict[str, list] = {"start_positions": [], "end_positions": [], "context_mask": [], "labels": []}
        for i, offsets in enumerate(encoded["offset_mapping"]):
            row = encoded["overflow_to_sample_mapping"][i]
            sequence = encoded.sequence_ids(i)
            cls = encoded["input_ids"][i].index(tokenizer.cls_token_id) if tokenizer.cls_token_id in \
                encoded["input_ids"][i] else 0
            spans = [list(span) if part == 1 else list(NO_SPAN) for span, part in zip(offsets, sequence)]
            answers = batch["label"][row]
            start, end = _answer_pieces(spans, answers["answer_start"][0], len(answers["text"][0]), cls)
            features["start_positions"].append(start)
            features["end_positions"].append(end)
            features["context_mask"].append([int(part == 1 or k == cls) for k, part in enumerate(sequence)])
            features["labels"].append({"example": indices[row], "offsets": spans, "context": batch["context"][row],
                                       "answers": list(answers["text"])})
        encoded.pop("offset_mapping")
        encoded.pop("overflow_to_sample_mapping")
        return {**encoded, **features}

    return dataset.map(encode, batched=True, with_indices=True, remove_columns=dataset.column_names, desc="tokenize")


def _cut_questions(questions: list[str], tokenizer: PreTrainedTokenizerBase, limit: int) -> int:
    """Cut, in place, each question of more than ``limit`` pieces at the end of its ``limit``-th piece's characters
    (again, one piece shorter, where the cut text tokenises longer); returns how many were cut."""
    cut = 0
    for k, offsets in enumerate(tokenizer(questions, add_special_tokens=False,
                                          return_offsets_mapping=True)["offset_mapping"]):
        keep = limit
        while len(offsets) > limit and keep > 0:
            questions[k] = questions[k][:offsets[keep - 1][1]]
            offsets = tokenizer(questions[k], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            keep -= 1
        cut += keep < limit
    return cut


def _answer_pieces(spans: list[list[int]], char_start: int, length: int, cls: int) -> tuple[int, int]:
    """The first and last piece of the answer's characters [char_start, char_start + length) in one feature, or
    (cls, cls) when the feature's window does not hold all of it."""
    char_end = char_start + length
    inside = [k for k, (s, e) in enumerate(spans) if (s, e) != NO_SPAN]
    if length <= 0 or not inside or spans[inside[0]][0] > char_start or spans[inside[-1]][1] < char_end:
        return cls, cls  # no answer to point at (a reader's question), or not all of it in this window
    start = next((k for k in inside if spans[k][1] > char_start), None)
    end = next((k for k in reversed(inside) if spans[k][0] < char_end), None)
    if start is None or end is None or end < start:  # the answer lies in whitespace between pieces
        return cls, cls
    return start, end


def span_soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, context_mask: torch.Tensor,
                            temperature: float = 1.0) -> torch.Tensor:
    """L_pred for span extraction: −softmax(z_T / t) · log_softmax(z_S / t) over the positions of ``context_mask``,
    for the start and for the end, averaged over both and the batch (TinyBERT Eq. 10 per output; the masking is ours,
    see the module docstring). Accumulates in float32.

    Args:
        student_logits, teacher_logits: (B, T, 2), start and end logits stacked.
        context_mask: (B, T), nonzero where an answer may start or end ([CLS] and the context).
        temperature: t > 0.

    Returns:
        Scalar, in nats per output; 0 for an empty batch.
    """
    allowed = context_mask.bool().unsqueeze(-1)  # (B, T, 1)
    student = student_logits.float().masked_fill(~allowed, float("-inf")) / temperature
    teacher = teacher_logits.float().masked_fill(~allowed, float("-inf")) / temperature
    targets = F.softmax(teacher, dim=1)
    log_probs = F.log_softmax(student, dim=1).masked_fill(~allowed, 0.0)  # 0 · −inf would be NaN
    per_output = -(targets * log_probs).sum(dim=1)  # (B, 2)
    return per_output.mean() if per_output.numel() else per_output.sum()


def span_cross_entropy(student_logits: torch.Tensor, start_positions: torch.Tensor, end_positions: torch.Tensor,
                       context_mask: torch.Tensor) -> torch.Tensor:
    """The hard-label term: cross-entropy of the gold start and end positions over the same positions as
    :func:`span_soft_cross_entropy`, (L_start + L_end) / 2, float32.

    Args:
        student_logits: (B, T, 2). start_positions, end_positions: (B,). context_mask: (B, T).
    """
    allowed = context_mask.bool()
    logits = student_logits.float().masked_fill(~allowed.unsqueeze(-1), float("-inf"))
    return (F.cross_entropy(logits[..., 0], start_positions) + F.cross_entropy(logits[..., 1], end_positions)) / 2


def squad_metrics(outputs: list[np.ndarray], labels: list[dict]) -> dict[str, float]:
    """Exact match and F1 of the official SQuAD v1.1 script (``torchmetrics.functional.text.squad``), as fractions in
    [0, 1] (the script prints them × 100). One known difference: where prediction and gold both normalise to nothing
    (a gold answer "the"), torchmetrics scores F1 1 (SQuAD 2.0's rule) and the v1.1 script 0; two of the 9,380 shared
    dev questions have such a gold answer.

    Args:
        outputs: per feature (T_i, 2) start and end logits. labels: per feature, see :func:`tokenize_questions`.

    Returns:
        ``f1`` and ``exact_match``, means over the questions.
    """
    from torchmetrics.functional.text import squad

    predicted = answers(outputs, labels)
    if not predicted:
        return {"f1": 0.0, "exact_match": 0.0}
    ids = sorted(predicted)
    preds = [{"prediction_text": predicted[q]["answer"], "id": str(q)} for q in ids]
    target = [{"answers": {"text": predicted[q]["gold"], "answer_start": [0] * len(predicted[q]["gold"])},
               "id": str(q)} for q in ids]
    scores = squad(preds, target)
    return {"f1": float(scores["f1"]) / 100, "exact_match": float(scores["exact_match"]) / 100}


class QuestionAnsweringCollator:
    """Pad tokenized features into a batch: the inputs by the tokenizer, ``context_mask`` with 0, cached
    ``teacher_logits`` (T_i, 2) with 0 (never read: masked), positions moved by the padding on a left-padding
    tokenizer.

    Returns (when called):
        ``input_ids``, ``attention_mask`` (``token_type_ids``) (B, T) int64, ``start_positions`` and
        ``end_positions`` (B,) int64, ``context_mask`` (B, T) int64 and, when the features carry them,
        ``teacher_logits`` (B, T, 2) float32.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:

        inputs = [{k: f[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in f} for f in features]
        batch = dict(self.tokenizer.pad(inputs, return_tensors="pt"))
        length = batch["input_ids"].shape[1]
        left = self.tokenizer.padding_side == "left"
        shift = torch.tensor([length - len(f["input_ids"]) if left else 0 for f in features])
        for name in ("start_positions", "end_positions"):
            if name in features[0]:
                batch[name] = torch.tensor([f[name] for f in features], dtype=torch.long) + shift
        batch["context_mask"] = pad_rows([f["context_mask"] for f in features], length, 0, torch.long, left)
        if features[0].get("teacher_logits") is not None:
            batch["teacher_logits"] = pad_rows([f["teacher_logits"] for f in features], length, 0.0, torch.float32,
                                               left)
        return batch


def squad_spec(config):
    """The :class:`~distill.tasks.data.TaskSpec` of a user's SQuAD-layout files (``task.train_file``, ``dev_file``).

    Raises:
        DataError: no dev file, or metrics other than ``f1`` / ``exact_match``.
    """

    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    metrics = tuple(config.metrics or QA_METRICS)
    if not set(metrics) <= set(QA_METRICS):
        raise DataError(f"task.metrics: question answering scores {', '.join(QA_METRICS)}; got {list(metrics)}")
    return TaskSpec(config.name, ("question", "context"), "answers", ("start", "end"), metrics, hub=None,
                    dev_file=config.dev_file, train_file=config.train_file, task_type="question_answering")


class QuestionAnswering(TaskType):
    """Extractive question answering: the answer is a span of the context, given by start and end logits stacked
    into (T, 2) per feature (:mod:`distill.tasks.question_answering`: SQuAD v1.1 JSON, features over long contexts,
    span post-processing, the official EM and F1). TinyBERT's augmentation is not used, as in the paper's SQuAD
    runs: replacing context words would move or change the answers."""

    name = "question_answering"
    metric_names = QA_METRICS
    per_token = True  # one (start, end) pair of logits per piece
    labels_are_classes = False  # a row's labels are answers, spans of the context
    pipeline_tag = "question-answering"
    architecture = "ForQuestionAnswering"
    description = "question-answering reader"
    supports_augmentation = False
    augmentation_refusal = "(answers and their offsets)"

    def model_class(self, spec):
        from transformers import AutoModelForQuestionAnswering

        return AutoModelForQuestionAnswering

    def read_split(self, path, spec):
        return read_squad(path, spec)

    def user_spec(self, config):
        return squad_spec(config)

    def sniff_file(self, path):
        """A JSON file whose top level holds a ``data`` list of articles with ``paragraphs`` (SQuAD's layout)."""
        if path.suffix != ".json":
            return None
        try:
            top = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        data = top.get("data") if isinstance(top, dict) else None
        return {} if isinstance(data, list) and data and isinstance(data[0], dict) and "paragraphs" in data[0] \
            else None

    def read_user_split(self, path, spec, split="train"):
        return self.read_split(path, spec)  # one file a split

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        return tokenize_questions(dataset, tokenizer, max_seq_length, doc_stride(max_seq_length))

    def collator(self, tokenizer):
        return QuestionAnsweringCollator(tokenizer)

    def row_examples(self, labels):
        return [label["example"] for label in labels]  # a question's windows are rows of one example

    def compute_metrics(self, spec, outputs, labels, context=None):
        metrics = squad_metrics(outputs, labels)
        return {name: metrics[name] for name in spec.metrics}

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        if "context_mask" not in batch:
            raise ValueError("question answering: the prediction loss needs the batch's context_mask (which "
                             "positions may hold an answer)")
        loss = span_soft_cross_entropy(student_logits, teacher_logits, batch["context_mask"], temperature)
        if temperature_squared:
            loss = loss * temperature**2
        if hard_label_weight > 0:
            loss = loss + hard_label_weight * span_cross_entropy(
                student_logits, batch["start_positions"], batch["end_positions"], batch["context_mask"])
        return loss

    def prediction_inputs_differ(self, spec, student_logits, teacher_logits, batch):
        if "context_mask" not in batch:
            raise ValueError("question answering: comparing the prediction inputs needs the batch's context_mask "
                             "(which positions may hold an answer)")
        allowed = batch["context_mask"].bool()  # (B, T): [CLS] and the context, where the loss reads both outputs
        return (student_logits[allowed].float() != teacher_logits[allowed].float()).any()

    def recipe(self, spec, teacher_layers=None):
        if deep(teacher_layers):
            return "squad_12layer.yaml", "the recipe for extractive question answering from a 12-layer teacher"
        return "squad_minilm.yaml", "the recipe for extractive question answering"

    def serving_config(self, spec, max_seq_length):
        return {WINDOWS_KEY: reader_windows(max_seq_length)}  # read by QuestionAnswerer

    def chance(self, spec, dev_labels=None):
        # A reader that has learnt nothing finds no answer: EM and F1 0 (a random span scores a few points of F1,
        # which the refusal margin covers).
        return {"metric": spec.metrics[0], "value": 0.0, "basis": "no answer found"}

    def usage(self, model, spec=None):
        # transformers 5 has no question-answering pipeline (transformers 4's reads the checkpoint as it is).
        return ('# pip install tinydistill  (the package that made this reader: it reads answers as they were scored)\n'
                f'from distill import QuestionAnswerer\n\nanswer = QuestionAnswerer("{model}")  # or "{model}/onnx/'
                'model.onnx"\nprint(answer(question="Where is the Empire State Building?", context="The Empire State '
                'Building is a skyscraper in Midtown Manhattan, New York City."))')

    def same_prediction(self, outputs, reference, spec, labels=None):
        if labels is None:  # per feature: the same start and end piece
            return np.array([np.array_equal(np.asarray(a).argmax(0), np.asarray(b).argmax(0))
                             for a, b in zip(outputs, reference)], dtype=bool)
        # per question: the same answer span, the best over its features (a losing window may differ freely)
        ours, theirs = answers(outputs, labels), answers(reference, labels)
        return np.array([(ours[q]["start"], ours[q]["end"]) == (theirs[q]["start"], theirs[q]["end"])
                         for q in sorted(ours)], dtype=bool)

    def logits(self, outputs):
        start = getattr(outputs, "start_logits", None)  # the head's two outputs stacked: (B, T, 2)
        return None if start is None else torch.stack((start, outputs.end_logits), dim=-1)

    def describe_labels(self, spec):
        return "answers, spans of the context"


SQUAD = TaskSpec("squad", ("question", "context"), "answers", ("start", "end"), QA_METRICS, ("squad",),
                          train_file="train.json", dev_file="dev.json", task_type="question_answering",
                          hub_label_column="answers")

QUESTION_ANSWERING = register_task_type(QuestionAnswering())
register_task(SQUAD)
