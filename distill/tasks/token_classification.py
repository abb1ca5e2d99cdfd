"""Token classification (NER, slot filling, PoS): one label per word, predicted on the word's first word piece.

Shapes: N sentences, B batch, T word pieces (padded), C labels.

Data are sentences as ``tokens`` (list of words) and ``label`` (one label id per word). Word pieces are labelled the
way Hugging Face's ``run_ner.py`` does by default: a word's first piece carries the word's label, its other pieces and
the special tokens get -100 (ignored by losses and metrics). We keep that convention because a word has exactly one
prediction (its first piece's), so entity metrics count words, not pieces, and the teacher's and student's logits
are compared at exactly the positions that are scored; labelling every piece would weight long words (often rare
names, the entities themselves) by their piece count.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from distill.tasks.base import (DataError, TaskSpec, TaskType, deep, markdown_table, pad_rows, register_task,
                                register_task_type)
from distill.tasks.files import read_table, require_columns
from distill.tasks.words import only_tags, split_words

logger = logging.getLogger(__name__)

IGNORE = -100  # the label of word pieces that are not scored (continuations, special tokens, padding)


# A tag of a user's training file (no task.label_names) seen fewer times than this is refused as a likely typo: it
# would otherwise become a class of its own, which the teacher and the student then learn from one or two words.
MIN_TAG_COUNT = 3
# A tag whose entity type is one edit from that of a tag seen at least this many times as often is refused likewise
# ("B-PRE" once among many "B-PER").
NEAR_TYPE_RATIO = 10


@dataclass
class TaggedSentence:
    """One sentence of a tagged file: its words, their tags and, for each word, where it is (``line N`` of a CoNLL
    file, ``line N, word K`` of a JSONL file), for error messages."""

    words: list[str]
    tags: list[str]
    where: list[str]


def parse_conll(path: str | Path) -> list[TaggedSentence]:
    """The sentences of a CoNLL-style file: one ``word<TAB or space>...<tag>`` line per word (the tag is the last
    column), sentences separated by blank lines or by lines of whitespace only (as WNUT-17's files have);
    ``-DOCSTART-`` lines skipped. Every word line has the file's number of columns (the count most of its lines
    have), so a word holding a space (``New York B-LOC``) is refused, not read as ``New`` with ``York`` lost.

    Returns:
        The sentences, each word with its 1-based line number in the file.

    Raises:
        DataError: the file is missing, not UTF-8 or holds no sentence; a line has one column only, or another number
            of columns than the file's (the message names the file, the line and the fix).
    """

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a CoNLL file (a word and its tag on each line, a blank line "
                        "between sentences)")
    lines: list[tuple[int, list[str], str]] = []
    try:  # utf-8-sig: a byte-order mark is not part of the first word
        with path.open(encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, start=1):
                # Columns split at tabs and ASCII spaces only: a no-break space is part of a word ("10\u00a0000").
                lines.append((number, [field for field in re.split(r"[ \t]+", line.strip(" \t\r\n")) if field],
                              line.strip()))
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start}); save the file as UTF-8") from None
    words = [fields for _, fields, _ in lines if fields and fields[0] != "-DOCSTART-"]
    columns = Counter(len(fields) for fields in words).most_common(1)[0][0] if words else 2  # the first on a tie
    sentences: list[TaggedSentence] = []
    current = TaggedSentence([], [], [])
    for number, fields, text in lines:
        if not fields or fields[0] == "-DOCSTART-":
            if current.words:
                sentences.append(current)
            current = TaggedSentence([], [], [])
            continue
        if len(fields) < 2:
            raise DataError(f"{path}, line {number}: {text!r} has no tag; each line holds a word and its tag (the "
                            "last column), separated by a tab or spaces")
        if len(fields) != columns:
            why = ("a word holding a space is read as two columns: give each word a line of its own, with its tag"
                   if len(fields) > columns else "a column is missing: give every line the same columns")
            raise DataError(f"{path}, line {number}: {text!r} has {len(fields)} columns where the file's lines have "
                            f"{columns}; {why}")
        current.words.append(fields[0])
        current.tags.append(fields[-1])
        current.where.append(f"line {number}")
    if current.words:
        sentences.append(current)
    if not sentences:
        raise DataError(f"{path} holds no sentence")
    return sentences


def read_conll(path: str | Path, label_names: tuple[str, ...] | None = None, fix: str | None = None
               ) -> datasets.Dataset:
    """A CoNLL-style file (:func:`parse_conll`) as a dataset.

    Args:
        path: the file (UTF-8).
        label_names: tags in id order; None keeps the tags as strings (column ``tag_names``).
        fix: how to accept a tag outside ``label_names``, for the error (default: set ``task.label_names``).

    Returns:
        A Dataset with ``tokens`` (list of str) and ``label`` (list of int ids) or ``tag_names`` (list of str).

    Raises:
        DataError: what :func:`parse_conll` raises, or a tag not in ``label_names`` (the message names the file, the
            line of its first use and the tag).
    """
    sentences = parse_conll(path)
    if label_names is None:
        return datasets.Dataset.from_dict({"tokens": [s.words for s in sentences],
                                           "tag_names": [s.tags for s in sentences]})
    ids = check_tags(sentences, label_names, path, fix)
    return datasets.Dataset.from_dict({"tokens": [s.words for s in sentences],
                                       "label": [[ids[t] for t in s.tags] for s in sentences]})


def check_tags(sentences: list[TaggedSentence], label_names: tuple[str, ...], path: str | Path,
               fix: str | None = None) -> dict[str, int]:
    """Every tag of ``sentences`` is one of ``label_names``; returns {tag: id}.

    Raises:
        DataError: the first tag (in file order) that is not, with its file, line and ``fix``.
    """

    ids = {name: i for i, name in enumerate(label_names)}
    for sentence in sentences:
        for tag, where in zip(sentence.tags, sentence.where):
            if tag not in ids:
                raise DataError(f"{path}, {where}: tag {tag!r} is not among the task's labels {list(label_names)}; "
                                + (fix or "fix the tag, or add it to task.label_names"))
    return ids


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of two neighbours each count
    one edit ("PRE" and "PER" are one edit apart)."""
    previous2, previous = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[len(b)]


def check_tag_counts(sentences: list[TaggedSentence], path: str | Path) -> None:
    """The tags of a user's training file, read without ``task.label_names``, look like a tag set, not like typos:
    a tag seen fewer than :data:`MIN_TAG_COUNT` times, or whose entity type is one edit from (or differs only in case
    from) a type seen :data:`NEAR_TYPE_RATIO` times as often, is refused; ``task.label_names`` accepts it.

    Raises:
        DataError: the first such tag in file order, with its line, how often it is seen and the likely intended tag.
    """

    counts: Counter = Counter()
    types: Counter = Counter()
    first: dict[str, str] = {}
    for sentence in sentences:
        for tag, where in zip(sentence.tags, sentence.where):
            counts[tag] += 1
            first.setdefault(tag, where)
            if tag != "O":
                types[tag[2:]] += 1
    accept = ("fix it, or set task.label_names to every tag of the task (in id order) to keep it as a tag of its "
              "own")
    for tag in first:  # in file order
        if tag == "O":
            continue
        kind = tag[2:]
        near = [other for other in types if other != kind and types[other] >= NEAR_TYPE_RATIO * types[kind]
                and edit_distance(kind.lower(), other.lower()) <= 1]
        if near:
            raise DataError(f"{path}, {first[tag]}: tag {tag!r} (type {kind!r}, {types[kind]} time(s)) looks like a "
                            f"typo of type {near[0]!r} ({types[near[0]]} times), one edit away; {accept}")
        if counts[tag] < MIN_TAG_COUNT:
            raise DataError(f"{path}, {first[tag]}: tag {tag!r} is seen {counts[tag]} time(s) in the training file, "
                            f"under the {MIN_TAG_COUNT} a tag of its own needs (a typo would otherwise become a "
                            f"class); {accept}")


def align_labels(word_ids: list[int | None], word_labels: list[int]) -> list[int]:
    """Word labels spread over word pieces: a word's first piece gets its label, the other pieces and special tokens
    (``word_ids`` None) get :data:`IGNORE`.

    Args:
        word_ids: for each piece, the index of its word or None (the tokenizer's ``word_ids()``).
        word_labels: one label id per word.

    Returns:
        One label per piece, same length as ``word_ids``.
    """
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def _as_read(tokenizer: PreTrainedTokenizerBase, sentences: list[list[str]]) -> list[list[str]]:
    """Pre-split sentences as the tokenizer should read them. A byte-level BPE tokenizer (RoBERTa, GPT-2) made
    without add_prefix_space reads each pre-split word as if it began the text ("movie" -> "mo", "vie"); words in
    running text carry a leading space ("Ġmovie"). Giving every word its space makes the pieces those of running text,
    as add_prefix_space=True would."""
    if getattr(tokenizer, "add_prefix_space", None) is False:
        return [[" " + w for w in sentence] for sentence in sentences]
    return sentences


def scored_words(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_seq_length: int
                 ) -> list[list[str]]:
    """Per sentence of a split (``tokens``), the words :func:`tokenize_words` scores, in order: those with a first
    word piece within ``max_seq_length`` (one per label that is not :data:`IGNORE`)."""
    sentences = dataset["tokens"]
    encoded = tokenizer(_as_read(tokenizer, sentences), is_split_into_words=True, truncation=True,
                        max_length=max_seq_length)
    return [[sentence[w] for w in sorted({w for w in encoded.word_ids(i) if w is not None})]
            for i, sentence in enumerate(sentences)]


def tokenize_words(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_seq_length: int
                   ) -> datasets.Dataset:
    """Tokenize pre-split sentences (``tokens``, ``label``) into word pieces with aligned ``labels``
    (:func:`align_labels`); a sentence longer than ``max_seq_length`` pieces is cut, and its words past the cut are
    not scored (counted in the log), nor are words the tokenizer makes no piece of (counted apart).

    Returns:
        ``input_ids``, ``attention_mask`` (``token_type_ids`` for BERT) and ``labels`` (T,), unpadded.

    Raises:
        DataError: the tokenizer is not a fast one (no ``word_ids``), which alignment needs.
    """

    if not tokenizer.is_fast:
        raise DataError(f"token classification needs a fast tokenizer (word_ids); {type(tokenizer).__name__} is not "
                        "one: load the model's tokenizer with use_fast=True")

    def encode(batch: dict) -> dict:
        words = _as_read(tokenizer, batch["tokens"])
        encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_seq_length)
        labels, missing = [], {}
        for i, tags in enumerate(batch["label"]):
            word_ids = encoded.word_ids(i)
            labels.append(align_labels(word_ids, tags))
            seen = {w for w in word_ids if w is not None}
            if len(seen) < len(tags):
                missing[i] = seen
        cut, empty = [0] * len(labels), [0] * len(labels)
        if missing:  # a word without a piece was cut by the length limit, or is one the tokenizer makes nothing of
            whole = tokenizer([words[i] for i in missing], is_split_into_words=True, truncation=False)
            for j, (i, seen) in enumerate(missing.items()):
                pieces = {w for w in whole.word_ids(j) if w is not None}
                cut[i], empty[i] = len(pieces - seen), len(batch["label"][i]) - len(pieces)
        encoded["labels"] = labels
        encoded["words_cut"] = cut
        encoded["words_empty"] = empty
        return encoded

    encoded = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenize")
    words_cut = int(np.sum(encoded["words_cut"]))
    if words_cut:
        logger.warning("%d words of %d sentences fell past task.max_seq_length=%d word pieces and are not scored; "
                       "raise task.max_seq_length to keep them", words_cut, int(np.count_nonzero(encoded["words_cut"])),
                       max_seq_length)
    words_empty = int(np.sum(encoded["words_empty"]))
    if words_empty:
        logger.warning("%d words of %d sentences are no word piece in this tokenizer (e.g. a lone variation "
                       "selector, or a control character) and are not scored", words_empty,
                       int(np.count_nonzero(encoded["words_empty"])))
    return encoded.remove_columns(["words_cut", "words_empty"])


def token_soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                             temperature: float = 1.0) -> torch.Tensor:
    """L_pred per token: −softmax(z_T / t) · log_softmax(z_S / t) at every scored word piece, averaged over them
    (TinyBERT Eq. 10 applied to each token; our choice of positions: those with a label, so padding, special tokens
    and word continuations, which are neither trained nor scored, do not dilute it). Accumulates in float32.

    Args:
        student_logits, teacher_logits: (B, T, C).
        labels: (B, T) label ids, :data:`IGNORE` where not scored.
        temperature: t > 0.

    Returns:
        Scalar, in nats per scored token; 0 when the batch has no scored token.
    """
    scored = labels != IGNORE
    targets = F.softmax(teacher_logits[scored].float() / temperature, dim=-1)
    log_probs = F.log_softmax(student_logits[scored].float() / temperature, dim=-1)
    return -(targets * log_probs).sum(dim=-1).sum() / scored.sum().clamp(min=1)


def entity_mass(logits: list[np.ndarray], labels: list[np.ndarray], outside: int | None) -> np.ndarray:
    """The number of words a model expects to be part of an entity, per sentence: the sum, over the scored pieces (a
    word's first; ``labels`` not ``IGNORE``), of the probability of any tag but ``outside`` (softmax of the logits).
    A sentence the teacher reads as holding names scores high, one of plain words near 0: ranking unlabelled text
    by it (``augment.unlabelled_ranked``) gives the student more of the rare entity words it fits least.

    Args:
        logits: N arrays (T_i, C), a model's logits per word piece.
        labels: N arrays (T_i,), ``IGNORE`` where a piece is not scored.
        outside: the index of the O tag; None (no O tag): every word counts whole.

    Returns:
        (N,) float64.
    """
    scores = np.zeros(len(logits), dtype=np.float64)
    for i, (row, tags) in enumerate(zip(logits, labels)):
        row = np.asarray(row, dtype=np.float64)[np.asarray(tags) != IGNORE]
        if outside is None or not len(row):
            scores[i] = len(row)
            continue
        shifted = np.exp(row - row.max(axis=-1, keepdims=True))
        scores[i] = float(np.sum(1.0 - shifted[:, outside] / shifted.sum(axis=-1)))
    return scores


def entity_metrics(logits: list[np.ndarray] | np.ndarray, labels: list[np.ndarray] | np.ndarray,
                   label_names: tuple[str, ...], words: list[list[str]] | None = None,
                   train_surfaces: set[str] | None = None) -> dict[str, float]:
    """Entity-level precision, recall and F1, micro-averaged over entity types, as seqeval computes them, by two
    conventions, and the accuracy of word labels.

    - ``f1``, ``precision``, ``recall``: the standard convention, conlleval's (CoNLL-2000 shared task), which the
      WNUT-17 evaluation and Hugging Face's ``run_ner.py`` (seqeval's default mode) share: an ``I-x`` after ``O`` or
      after another type starts an entity. An entity counts when its type and both boundaries are right.
    - ``f1_strict``, ``precision_strict``, ``recall_strict``: seqeval's strict IOB2 mode, where only ``B-x`` starts
      an entity (a student that opens entities with ``I-`` scores lower here).

    With the scored ``words`` of each sentence (:meth:`TokenClassification.metric_context`), also WNUT-17's second
    official metric, surface-form F1 (Derczynski et al. 2017, W17-4418, section 4): precision and recall over the
    unique (words, type) pairs of the split, a pair correct when one of its mentions is found exactly
    (``surface/f1``, ``surface/precision``, ``surface/recall``); and with ``train_surfaces`` (the training set's entity
    strings, case-folded) the entity F1 of mentions whose string occurs among them and of those that do not
    (``seen/f1``, ``unseen/f1``, their ``precision``/``recall``, and the gold mention counts ``seen/entities``,
    ``unseen/entities``): a prediction belongs to the part its own string falls in, so each part's precision and
    recall are those of the standard convention restricted to it.

    Args:
        logits: per sentence (T_i, C) logits, or one (N, T, C) array.
        labels: per sentence (T_i,) label ids with :data:`IGNORE` at unscored pieces, or one (N, T) array.
        label_names: BIO tag names in id order (``O``, ``B-x``, ``I-x``).
        words: per sentence its scored words, (W_i,) with W_i the number of labels not :data:`IGNORE`; or None.
        train_surfaces: case-folded entity strings (words joined by one space) of the training set; or None.

    Returns:
        The metrics above, in [0, 1] (the counts as floats).

    Raises:
        ValueError: ``words`` do not match the scored labels of a sentence.
    """
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import get_entities
    from seqeval.scheme import IOB2

    gold, predicted = [], []
    for sentence_logits, sentence_labels in zip(logits, labels):
        sentence_labels = np.asarray(sentence_labels)
        scored = sentence_labels != IGNORE
        predictions = np.asarray(sentence_logits)[: len(sentence_labels)].argmax(axis=-1)[scored]
        gold.append([label_names[i] for i in sentence_labels[scored]])
        predicted.append([label_names[i] for i in predictions])
    metrics = {}
    for suffix, options in (("", {"zero_division": 0}), ("_strict", {"mode": "strict", "scheme": IOB2,
                                                                    "zero_division": 0})):
        metrics[f"f1{suffix}"] = float(f1_score(gold, predicted, **options))
        metrics[f"precision{suffix}"] = float(precision_score(gold, predicted, **options))
        metrics[f"recall{suffix}"] = float(recall_score(gold, predicted, **options))
    scored_words = sum(len(g) for g in gold)
    correct = sum(int(a == b) for g, p in zip(gold, predicted) for a, b in zip(g, p))
    metrics["accuracy"] = correct / scored_words if scored_words else 0.0
    # each entity type's precision, recall and F1 by the standard convention (``type/<type>/recall``, ...)
    by_type: dict[str, tuple[set, set]] = {}
    for i, (g, p) in enumerate(zip(gold, predicted)):
        for which, tags in ((0, g), (1, p)):
            for kind, start, end in get_entities(list(tags)):
                by_type.setdefault(kind, (set(), set()))[which].add((i, start, end))
    for kind, (kind_true, kind_guessed) in sorted(by_type.items()):
        metrics.update(_prf(f"type/{kind}", kind_true, kind_guessed, kind_true & kind_guessed))
    if words is None:
        return metrics

    def mentions(tag_lists):  # {(sentence, type, start, end): words}, conlleval's chunks
        found = {}
        for i, (tags, sentence) in enumerate(zip(tag_lists, words)):
            if len(sentence) != len(tags):
                raise ValueError(f"sentence {i}: {len(sentence)} words for {len(tags)} scored labels")
            for kind, start, end in get_entities(list(tags)):
                found[(i, kind, start, end)] = tuple(sentence[start:end + 1])
        return found

    if len(words) != len(gold):
        raise ValueError(f"{len(words)} sentences of words for {len(gold)} of labels")
    true, guessed = mentions(gold), mentions(predicted)
    hits = true.keys() & guessed.keys()
    metrics.update(_prf("surface", {(w, k[1]) for k, w in true.items()}, {(w, k[1]) for k, w in guessed.items()},
                        {(true[k], k[1]) for k in hits}))
    if train_surfaces is not None:
        for part, wanted in (("seen", True), ("unseen", False)):
            def keep(found):
                return {k for k, w in found.items() if (" ".join(w).casefold() in train_surfaces) == wanted}
            part_true, part_guessed = keep(true), keep(guessed)
            metrics.update(_prf(part, part_true, part_guessed, part_true & part_guessed))
            metrics[f"{part}/entities"] = float(len(part_true))
    return metrics


def _prf(prefix: str, true: set, guessed: set, correct: set) -> dict[str, float]:
    """``{prefix}/precision``, ``/recall``, ``/f1`` of ``correct`` among ``guessed`` and ``true`` (0 where empty)."""
    precision = len(correct) / len(guessed) if guessed else 0.0
    recall = len(correct) / len(true) if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {f"{prefix}/precision": precision, f"{prefix}/recall": recall, f"{prefix}/f1": f1}


def entity_surfaces(dataset: datasets.Dataset, label_names: tuple[str, ...]) -> set[str]:
    """The case-folded strings (words joined by one space) of every entity in a tagged split (``tokens``, ``label``),
    entities found by the standard convention (:func:`entity_metrics`)."""
    from seqeval.metrics.sequence_labeling import get_entities

    surfaces = set()
    for sentence, tags in zip(dataset["tokens"], dataset["label"]):
        for _, start, end in get_entities([label_names[t] for t in tags]):
            surfaces.add(" ".join(sentence[start:end + 1]).casefold())
    return surfaces


def constant_guess(spec, dev_labels=None) -> dict:
    """Chance on a token-classification task: what the best constant guess, one tag for every word, scores on the
    primary metric (``spec.metrics[0]``, an entity metric: :func:`user_spec` refuses word accuracy first) of these dev
    labels, as :func:`entity_metrics` scores it. Tagging every word ``O`` finds no entity: 0. Tagging every word
    ``B-x`` finds each one-word entity of type x; tagging every word ``I-x`` (which opens an entity under the standard
    scorer, not under strict IOB2) finds each whole sentence that is one entity of type x; where those are common the
    guess scores above 0.

    Args:
        spec: the task (its tags, :attr:`TaskSpec.label_names`, and metrics).
        dev_labels: per dev sentence its word tags as ids, (W_i,); None: 0, every word tagged ``O``.

    Returns:
        {"metric", "value", "basis" (the guess, in words)}, as :func:`teachers.finetune.chance`.
    """
    metric = spec.metrics[0]
    best = {"metric": metric, "value": 0.0, "basis": "every word tagged O (no entity found)"}
    sentences = [np.asarray(labels, dtype=np.int64) for labels in ([] if dev_labels is None else dev_labels)]
    for tag_id, tag in enumerate(spec.label_names if any(len(s) for s in sentences) else ()):
        if tag == "O":
            continue
        guess = [np.eye(len(spec.label_names))[np.full(len(s), tag_id)] for s in sentences]
        value = entity_metrics(guess, sentences, spec.label_names)[metric]
        if value > best["value"]:
            best = {"metric": metric, "value": value, "basis": f"every word tagged {tag!r}"}
    return best


class TokenCollator:
    """Pad a list of tokenized sentences into a batch: inputs by the tokenizer, ``labels`` with :data:`IGNORE` and
    cached ``teacher_logits`` (T_i, C) with zeros (never read: those positions are not scored), on the tokenizer's
    padding side.

    Returns (when called):
        ``input_ids``, ``attention_mask`` (``token_type_ids``) (B, T) int64, ``labels`` (B, T) int64 and, when the
        features carry them, ``teacher_logits`` (B, T, C) float32.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:

        labels = [f.get("labels") for f in features]
        teacher = [f.get("teacher_logits") for f in features]
        inputs = [{k: v for k, v in f.items() if k not in ("labels", "teacher_logits")} for f in features]
        batch = dict(self.tokenizer.pad(inputs, return_tensors="pt"))
        length = batch["input_ids"].shape[1]
        left = self.tokenizer.padding_side == "left"
        if labels[0] is not None:
            batch["labels"] = pad_rows(labels, length, IGNORE, torch.long, left)
        if teacher[0] is not None:
            batch["teacher_logits"] = pad_rows(teacher, length, 0.0, torch.float32, left)
        return batch


JSON_SUFFIXES = (".jsonl", ".json")
NER_METRICS = ("f1", "f1_strict", "precision", "recall", "accuracy")  # entity F1 first: the primary metric


def tag_order(tags) -> list[str]:
    """BIO tags in a stable id order: ``O`` first, then by entity type, ``B-`` before ``I-``."""
    return sorted(set(tags), key=lambda tag: (tag != "O", tag[2:], tag[:2]))


def read_tagged_file(path: str | Path, spec) -> datasets.Dataset:
    """One split of a token-classification task: a CoNLL file (:func:`parse_conll`), or JSONL with a word-list
    column and a tag-list column (tags as names, or ids into ``spec.label_names``), its tags checked against the
    task's tag set and as IOB2 (:func:`check_iob2`).

    Returns:
        ``tokens`` (list of str) and ``label`` (list of int) per sentence.

    Raises:
        DataError: missing columns, a sentence whose word and tag lists differ in length, an unknown tag, tags that
            are not IOB2; each names the file and the line.
    """
    sentences = read_tagged_sentences(path, spec)
    ids = check_tags(sentences, spec.label_names, path, _accept_tag(spec))
    check_iob2([s.tags for s in sentences], [s.where for s in sentences], path)
    return datasets.Dataset.from_dict({"tokens": [s.words for s in sentences],
                                       "label": [[ids[t] for t in s.tags] for s in sentences]})


def _accept_tag(spec) -> str:
    """How to accept a tag outside the task's tag set, for errors: a named task's set is fixed."""
    if spec.hub is not None:
        return (f"{spec.name}'s tags are fixed: fix the tag, or run the files as a task of your own (task.train_file, "
                "dev_file, task_type: token_classification, label_names)")
    return "fix the tag, or add it to task.label_names"


def read_tagged_sentences(path: str | Path, spec) -> list[TaggedSentence]:
    """The sentences of a CoNLL or JSONL tagged file, tags as names (JSONL ids mapped through ``spec.label_names``),
    each word with where it is in the file.

    Raises:
        DataError: see :func:`parse_conll`; for JSONL, missing columns, word and tag lists of other lengths, an id
            outside the tag set or ids without ``label_names``.
    """

    path = Path(path)
    if path.suffix not in JSON_SUFFIXES:
        return parse_conll(path)
    (source,) = [name for name, ours in spec.tsv_columns.items() if ours == "tokens"] or ["tokens"]
    table = read_table(str(path))
    require_columns(table, [source, spec.label_column], str(path))
    names = list(spec.label_names)
    sentences = []
    for line, (words, tags) in enumerate(zip(table[source], table[spec.label_column]), start=1):
        if len(words) != len(tags):
            raise DataError(f"{path}, line {line}: {len(words)} words but {len(tags)} tags")
        named = []
        for word, tag in enumerate(tags, start=1):
            if isinstance(tag, int) and not isinstance(tag, bool):
                if not names:
                    raise DataError(f"{path}, line {line}: tags are ids, not names; set task.label_names to the tag "
                                    "names in id order")
                if not 0 <= tag < len(names):
                    raise DataError(f"{path}, line {line}, word {word}: tag id {tag} is not an id of the task's "
                                    f"labels {names}")
                tag = names[tag]
            named.append(str(tag))
        sentences.append(TaggedSentence(list(map(str, words)), named,
                                        [f"line {line}, word {word}" for word in range(1, len(words) + 1)]))
    return sentences


def check_iob2(tags: list[list[str]], where: list[list[str]], path: str | Path) -> None:
    """The gold tags as IOB2 (Ramshaw and Marcus, 1995; Tjong Kim Sang and Veenstra, 1999): an ``I-type`` tag only
    after ``B-type`` or ``I-type`` of the same type. The models learn IOB2 tags, and the strict IOB2 scores drop an
    entity that breaks it, so IOB1 files (the original CoNLL-2003 ``eng.*``) would be learnt and scored wrongly.

    A file is IOB1 when more of its entities start with ``I-`` than with ``B-`` (IOB1 writes ``B-`` only between two
    entities of one type); only then is converting it the advice. In an IOB2 file the first broken tag is named as a
    likely typo instead (``B-PRE`` followed by ``I-PER``).

    Args:
        tags: per sentence, its tags. where: per sentence, where each word is (``line N``), for the message.

    Raises:
        DataError: the first tag that breaks IOB2, with its file and line and the fix for this file.
    """

    broken, starts_with_b, starts_with_i = None, 0, 0
    for sentence, places in zip(tags, where):
        previous = "O"
        for tag, place in zip(sentence, places):
            if tag.startswith("B-"):
                starts_with_b += 1
            elif tag.startswith("I-") and previous[2:] != tag[2:]:
                starts_with_i += 1
                broken = broken or (tag, previous, place)
            previous = tag
    if broken is None:
        return
    tag, previous, place = broken
    head = f"{path}, {place}: {tag!r} follows {previous!r}, which IOB2 does not allow"
    if starts_with_i > starts_with_b:
        raise DataError(f"{head} (an entity starts with B-); {starts_with_i} of the file's entities start with I- and "
                        f"{starts_with_b} with B-, so the tags look like IOB1: convert them to IOB2 (an I- tag that "
                        "starts an entity becomes B-)")
    if previous == "O":
        raise DataError(f"{head}: an entity starts with B-, as {starts_with_b} of the file's entities do; a typo for "
                        f"'B-{tag[2:]}'? fix the tag")
    raise DataError(f"{head}: an I- tag continues an entity of its own type; one of the two tags is a typo (the "
                    f"file's entities start with B-, {starts_with_b} of them): fix it")


def user_spec(config):
    """The :class:`~distill.tasks.data.TaskSpec` of a user's token-classification files (``task.train_file``,
    ``dev_file``; ``text_columns`` [word-list column] and ``label_column`` for JSONL). Without ``label_names`` the
    tags are those of the training file (:func:`tag_order`), refused where they look like typos
    (:func:`check_tag_counts`).

    Raises:
        DataError: no dev file; JSONL tags given as ids without ``label_names``; a rare or near-duplicate tag in the
            training file, or dev tags the training file lacks (each with its line); tags that are not BIO.
    """

    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    column = (config.text_columns or ["tokens"])[0]
    probe = TaskSpec(config.name, ("tokens",), config.label_column, (), tsv_columns={column: "tokens"}, hub=None,
                     task_type="token_classification")
    label_names = tuple(config.label_names or ())
    first: dict[str, str] = {}
    if not label_names:
        found = {split: _tagged(path, probe) for split, path in (("train", config.train_file),
                                                                 ("dev", config.dev_file))}
        check_tag_counts(found["train"], config.train_file)
        label_names = tuple(tag_order(t for s in found["train"] for t in s.tags))
        for sentence in found["train"]:
            for tag, where in zip(sentence.tags, sentence.where):
                first.setdefault(tag, f"{config.train_file}, {where}")
        check_tags(found["dev"], label_names, config.dev_file,
                   f"it is not in the training set {config.train_file}; fix it, or set task.label_names to every tag")
        logger.info("task %s: tags %s (from %s; set task.label_names to fix their order)", config.name,
                    list(label_names), config.train_file)
    metrics = tuple(config.metrics or NER_METRICS)
    if not set(metrics) <= set(NER_METRICS) or metrics[0] == "accuracy":
        raise DataError(f"task.metrics: token classification scores {', '.join(NER_METRICS)}, with an entity metric "
                        f"first (a model that tags every word O has a high word accuracy); got {list(metrics)}")
    not_bio = [tag for tag in label_names if tag != "O" and tag[:2] not in ("B-", "I-")]
    if not_bio:
        where = f" ({first[not_bio[0]]})" if not_bio[0] in first else ""
        raise DataError(f"task {config.name}: tag(s) {not_bio[:5]}{where} are not BIO tags (O, B-type, I-type), which "
                        "entity-level scoring needs; convert the files to BIO")
    return TaskSpec(config.name, ("tokens",), config.label_column, label_names, metrics, hub=None,
                    tsv_columns={column: "tokens"}, dev_file=config.dev_file, train_file=config.train_file,
                    task_type="token_classification")


def _tagged(path: str, probe) -> list[TaggedSentence]:
    """The sentences of a file of a task whose tags are not named yet (JSONL tags must be names then)."""
    return read_tagged_sentences(path, probe)


class TokenClassification(TaskType):
    """One label per word (NER, slot filling, PoS) with BIO tags scored by seqeval at the entity level
    (:mod:`distill.tasks.token_classification`)."""

    name = "token_classification"
    metric_names = NER_METRICS
    summary_metrics = ("surface/f1", "seen/f1", "unseen/f1", "unseen/recall")
    per_token = True
    pipeline_tag = "token-classification"
    architecture = "ForTokenClassification"
    description = "token classifier"

    def sniff_file(self, path):
        """A CoNLL file (``.conll``, ``.txt``, ``.bio`` or no suffix): lines of a word and a BIO tag (the tag last),
        sentences apart by blank lines; its first 200 lines are read."""
        if path.suffix not in (".conll", ".txt", ".bio", ".iob", ""):
            return None
        try:
            with path.open(encoding="utf-8") as lines:
                head = [line.split() for _, line in zip(range(200), lines)]
        except (OSError, UnicodeDecodeError):
            return None
        tagged = [fields for fields in head if fields and not fields[0].startswith("-DOCSTART-")]
        if not tagged or any(len(fields) < 2 for fields in tagged):
            return None
        return {} if all(f[-1] == "O" or f[-1][:2] in ("B-", "I-") for f in tagged) else None

    def model_class(self, spec):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification

    def read_split(self, path, spec):
        return read_tagged_file(path, spec)

    def user_spec(self, config):
        return user_spec(config)

    def read_user_split(self, path, spec, split="train"):
        return self.read_split(path, spec)  # one file a split

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        return tokenize_words(dataset, tokenizer, max_seq_length)

    def collator(self, tokenizer):
        return TokenCollator(tokenizer)

    def compute_metrics(self, spec, outputs, labels, context=None):
        words, surfaces = context if context is not None else (None, None)
        metrics = entity_metrics(outputs, labels, spec.label_names, words, surfaces)
        return {**{name: metrics[name] for name in spec.metrics}, **{k: v for k, v in metrics.items() if "/" in k}}

    def metric_context(self, spec, data, split, tokenizer, max_seq_length):
        surfaces = entity_surfaces(data["train"], spec.label_names) if "train" in data else None
        return scored_words(data[split], tokenizer, max_seq_length), surfaces

    def report_sections(self, spec, metrics):
        models = [m for m in metrics if "surface/f1" in metrics[m]]
        if not models:
            return []
        parts = [("all entities (standard scorer)", "f1"), ("strict IOB2", "f1_strict"),
                 ("surface forms (unique strings)", "surface/f1")]
        unseen = all("unseen/f1" in metrics[m] for m in models)
        if unseen:
            parts += [(f"seen in training ({metrics[models[0]]['seen/entities']:.0f} mentions)", "seen/f1"),
                      (f"unseen in training ({metrics[models[0]]['unseen/entities']:.0f} mentions)", "unseen/f1")]
        lines = ["Entity F1 on dev by scorer and by entity. The standard scorer is conlleval's (seqeval's default "
                 "mode: an I- tag may open an entity); strict IOB2 opens entities at B- only; surface forms count "
                 "each unique (string, type) once, as WNUT-17's second metric"
                 + ("; seen/unseen: whether the mention's string (case-folded) is an entity in the training data."
                    if unseen else "."), ""]
        lines += markdown_table("entities", models, [
            (label, [f"{metrics[m].get(key, float('nan')):.4f}" for m in models]) for label, key in parts])
        # recall, where a student that follows its teacher less far from the training data falls behind first
        kinds = sorted({key.split("/")[1] for m in models for key in metrics[m]
                        if key.startswith("type/") and key.endswith("/recall")})
        recalls = [("all entities", "recall"), *([("unseen in training", "unseen/recall")] if unseen else []),
                   *[(kind, f"type/{kind}/recall") for kind in kinds]]
        reference = models[0]
        rows = []
        for label, key in recalls:
            cells = []
            for m in models:
                value = metrics[m].get(key, float("nan"))
                base = metrics[reference].get(key)
                share = f" ({100 * value / base:.0f}%)" if m != reference and base else ""
                cells.append(f"{value:.4f}{share}")
            rows.append((label, cells))
        lines += ["", f"Recall on dev by entity type (the standard scorer), in brackets the share of {reference}'s:", ""]
        lines += markdown_table("recall", models, rows)
        return ["\n".join(lines)]

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        labels = batch.get("labels")
        if labels is None:
            raise ValueError("token classification: the prediction loss needs the batch's labels (which word pieces "
                             "are scored)")
        loss = token_soft_cross_entropy(student_logits, teacher_logits, labels, temperature)
        if temperature_squared:
            loss = loss * temperature**2
        if hard_label_weight > 0:
            hard = torch.nn.functional.cross_entropy(student_logits.float().flatten(0, 1), labels.flatten(),
                                                     ignore_index=IGNORE, reduction="sum")
            hard = hard / (labels != IGNORE).sum().clamp(min=1)  # 0, not NaN, on a batch with no scored token
            loss = loss + hard_label_weight * hard
        return loss

    def prediction_inputs_differ(self, spec, student_logits, teacher_logits, batch):
        labels = batch["labels"]
        scored = labels != IGNORE  # the padded teacher logits are zeros, never read
        return (student_logits[scored].float() != teacher_logits[scored].float()).any()

    def recipe(self, spec, teacher_layers=None):
        if deep(teacher_layers):
            return "ner_12layer.yaml", "the recipe for token classification from a 12-layer teacher"
        return "ner_minilm.yaml", "the recipe for token classification"

    def chance(self, spec, dev_labels=None):
        return constant_guess(spec, dev_labels)

    def usage(self, model, spec=None):
        # "first": each word takes its first piece's tag, the piece the loss and the entity scores read (the other
        # pieces are never trained, so "simple" could serve a word's tail as another entity).
        return (f'from transformers import pipeline\n\ntag = pipeline("token-classification", model="{model}", '
                'aggregation_strategy="first")\nprint(tag("Empire State Building is in New York"))')

    def same_prediction(self, outputs, reference, spec, labels=None):
        same = []
        for i, (a, b) in enumerate(zip(outputs, reference)):
            a, b = np.asarray(a).argmax(-1), np.asarray(b).argmax(-1)
            scored = np.asarray(labels[i]) != IGNORE if labels is not None else np.ones(len(a), dtype=bool)
            same.append(np.array_equal(a[scored], b[scored]))  # every scored word predicted alike
        return np.array(same, dtype=bool)

    def unlabelled_rows(self, spec, texts):
        words = [[text[start:end] for start, end in split_words(text)] for text in texts]
        return {spec.text_columns[0]: words, "label": [[0] * len(w) for w in words]}  # tag 0 marks a scored word

    def transfer_scores(self, spec, logits, labels):
        return entity_mass(logits, labels, spec.label_names.index("O") if "O" in spec.label_names else None)

    def replaceable_words(self, spec, replace_entities=False):
        if replace_entities:
            return None  # any word the algorithm picks, its tag kept
        return only_tags(spec.label_names)  # words tagged O only: an entity is never rewritten


NAMED_TASKS = {
    "wnut_17": TaskSpec("wnut_17", ("tokens",), "ner_tags", (
        "O", "B-corporation", "I-corporation", "B-creative-work", "I-creative-work", "B-group", "I-group",
        "B-location", "I-location", "B-person", "I-person", "B-product", "I-product"), NER_METRICS, ("wnut_17",),
        train_file="train.conll", dev_file="dev.conll", task_type="token_classification",
        hub_label_column="ner_tags"),
    "conll2003": TaskSpec("conll2003", ("tokens",), "ner_tags", (
        "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"), NER_METRICS, ("conll2003",),
        train_file="train.conll", dev_file="dev.conll", task_type="token_classification",
        hub_label_column="ner_tags"),
}


TOKEN_CLASSIFICATION = register_task_type(TokenClassification())
for _spec in NAMED_TASKS.values():
    register_task(_spec)
