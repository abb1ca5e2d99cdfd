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
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

IGNORE = -100  # the label of word pieces that are not scored (continuations, special tokens, padding)


def read_conll(path: str | Path, label_names: tuple[str, ...] | None = None) -> datasets.Dataset:
    """A CoNLL-style file: one ``word<TAB or space>...<tag>`` line per word (the tag is the last column), sentences
    separated by blank lines or by lines of whitespace only (as WNUT-17's files have); ``-DOCSTART-`` lines skipped.

    Args:
        path: the file (UTF-8).
        label_names: tags in id order; None keeps the tags as strings (column ``tag_names``).

    Returns:
        A Dataset with ``tokens`` (list of str) and ``label`` (list of int ids) or ``tag_names`` (list of str).

    Raises:
        DataError: the file is missing or empty, a line has one column only, or a tag is not in ``label_names``
            (the message names the file, the line and the tag).
    """
    from distill.data import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a CoNLL file (a word and its tag on each line, a blank line "
                        "between sentences)")
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    try:  # utf-8-sig: a byte-order mark is not part of the first word
        with path.open(encoding="utf-8-sig") as handle:
            for number, line in enumerate(handle, start=1):
                # Columns split at tabs and ASCII spaces only: a no-break space is part of a word ("10\u00a0000").
                fields = [field for field in re.split(r"[ \t]+", line.strip(" \t\r\n")) if field]
                if not fields or fields[0] == "-DOCSTART-":
                    if words:
                        sentences.append((words, tags))
                    words, tags = [], []
                    continue
                if len(fields) < 2:
                    raise DataError(f"{path}, line {number}: {line.strip()!r} has no tag; each line holds a word and "
                                    "its tag (the last column), separated by a tab or spaces")
                words.append(fields[0])
                tags.append(fields[-1])
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text (byte {error.start}); save the file as UTF-8") from None
    if words:
        sentences.append((words, tags))
    if not sentences:
        raise DataError(f"{path} holds no sentence")
    if label_names is None:
        return datasets.Dataset.from_dict({"tokens": [s[0] for s in sentences], "tag_names": [s[1] for s in sentences]})
    ids = {name: i for i, name in enumerate(label_names)}
    unknown = sorted({tag for _, sentence_tags in sentences for tag in sentence_tags} - ids.keys())
    if unknown:
        raise DataError(f"{path}: tag(s) {unknown} are not among the task's labels {list(label_names)}; set "
                        "task.label_names to the file's tag set")
    return datasets.Dataset.from_dict({"tokens": [s[0] for s in sentences],
                                       "label": [[ids[t] for t in s[1]] for s in sentences]})


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
    from distill.data import DataError

    if not tokenizer.is_fast:
        raise DataError(f"token classification needs a fast tokenizer (word_ids); {type(tokenizer).__name__} is not "
                        "one: load the model's tokenizer with use_fast=True")

    # A byte-level BPE tokenizer (RoBERTa, GPT-2) made without add_prefix_space reads each pre-split word as if it
    # began the text ("movie" -> "mo", "vie"); words in running text carry a leading space ("Ġmovie"). Giving every
    # word its space makes the pieces those of running text, as add_prefix_space=True would.
    spaced = getattr(tokenizer, "add_prefix_space", None) is False

    def encode(batch: dict) -> dict:
        words = [[" " + w for w in sentence] for sentence in batch["tokens"]] if spaced else batch["tokens"]
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


def entity_metrics(logits: list[np.ndarray] | np.ndarray, labels: list[np.ndarray] | np.ndarray,
                   label_names: tuple[str, ...]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (micro-averaged over entity types, strict IOB2 matching: an entity
    counts when its type and both boundaries are right) as seqeval computes them, and the accuracy of word labels.

    Args:
        logits: per sentence (T_i, C) logits, or one (N, T, C) array.
        labels: per sentence (T_i,) label ids with :data:`IGNORE` at unscored pieces, or one (N, T) array.
        label_names: BIO tag names in id order (``O``, ``B-x``, ``I-x``).

    Returns:
        ``f1``, ``precision``, ``recall`` (entity level, in [0, 1]) and ``accuracy`` (word level).
    """
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    gold, predicted = [], []
    for sentence_logits, sentence_labels in zip(logits, labels):
        sentence_labels = np.asarray(sentence_labels)
        scored = sentence_labels != IGNORE
        predictions = np.asarray(sentence_logits)[: len(sentence_labels)].argmax(axis=-1)[scored]
        gold.append([label_names[i] for i in sentence_labels[scored]])
        predicted.append([label_names[i] for i in predictions])
    options = {"mode": "strict", "scheme": IOB2, "zero_division": 0}
    words = sum(len(g) for g in gold)
    correct = sum(int(a == b) for g, p in zip(gold, predicted) for a, b in zip(g, p))
    return {"f1": float(f1_score(gold, predicted, **options)),
            "precision": float(precision_score(gold, predicted, **options)),
            "recall": float(recall_score(gold, predicted, **options)),
            "accuracy": correct / words if words else 0.0}


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
        from distill.tasks import pad_rows

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
NER_METRICS = ("f1", "precision", "recall", "accuracy")  # entity F1 first: the primary metric


def tag_order(tags) -> list[str]:
    """BIO tags in a stable id order: ``O`` first, then by entity type, ``B-`` before ``I-``."""
    return sorted(set(tags), key=lambda tag: (tag != "O", tag[2:], tag[:2]))


def read_tagged_file(path: str | Path, spec) -> datasets.Dataset:
    """One split of a user's token-classification task: a CoNLL file (:func:`read_conll`), or JSONL with a word-list
    column and a tag-list column (tags as names, or ids into ``spec.label_names``).

    Returns:
        ``tokens`` (list of str) and ``label`` (list of int) per sentence.

    Raises:
        DataError: missing columns, a sentence whose word and tag lists differ in length, an unknown tag.
    """
    from distill.data import DataError, read_table, require_columns

    path = Path(path)
    if path.suffix not in JSON_SUFFIXES:
        return check_iob2(read_conll(path, spec.label_names), spec.label_names, path)
    (source,) = [name for name, ours in spec.tsv_columns.items() if ours == "tokens"] or ["tokens"]
    table = read_table(str(path))
    require_columns(table, [source, spec.label_column], str(path))
    ids = {name: i for i, name in enumerate(spec.label_names)}
    labels = []
    for line, (words, tags) in enumerate(zip(table[source], table[spec.label_column]), start=1):
        if len(words) != len(tags):
            raise DataError(f"{path}, line {line}: {len(words)} words but {len(tags)} tags")
        try:
            labels.append([t if isinstance(t, int) and 0 <= t < len(ids) else ids[t] for t in tags])
        except KeyError as unknown:
            raise DataError(f"{path}, line {line}: tag {unknown.args[0]!r} is not among the task's labels "
                            f"{list(spec.label_names)}; set task.label_names to the file's tag set") from None
    return check_iob2(datasets.Dataset.from_dict({"tokens": [list(map(str, w)) for w in table[source]],
                                                  "label": labels}), spec.label_names, path)


def check_iob2(dataset: datasets.Dataset, label_names: tuple[str, ...], path: str | Path) -> datasets.Dataset:
    """The gold tags as IOB2 (Ramshaw and Marcus, 1995; Tjong Kim Sang and Veenstra, 1999): an ``I-type`` tag only
    after ``B-type`` or ``I-type`` of the same type. seqeval's strict IOB2 mode, which scores the entities, drops an
    entity that breaks this, so IOB1 files (the original CoNLL-2003 ``eng.*``) would score near 0.

    Returns:
        ``dataset`` unchanged.

    Raises:
        DataError: the first tag that breaks IOB2, with its file, sentence and word.
    """
    from distill.data import DataError

    for number, sentence in enumerate(dataset["label"], start=1):
        previous = "O"
        for word, tag_id in enumerate(sentence, start=1):
            tag = label_names[tag_id]
            if tag.startswith("I-") and previous[2:] != tag[2:]:
                raise DataError(f"{path}, sentence {number}, word {word}: {tag!r} follows {previous!r}, which IOB2 "
                                "does not allow (an entity starts with B-); the tags look like IOB1: convert them "
                                "to IOB2 (an I- tag that starts an entity becomes B-)")
            previous = tag
    return dataset


def user_spec(config):
    """The :class:`~distill.data.TaskSpec` of a user's token-classification files (``task.train_file``,
    ``dev_file``; ``text_columns`` [word-list column] and ``label_column`` for JSONL). Without ``label_names`` the
    tags are those of the training file (:func:`tag_order`).

    Raises:
        DataError: no dev file; JSONL tags given as ids without ``label_names``; dev tags the training file lacks.
    """
    from distill.data import DataError, TaskSpec

    if not config.dev_file:
        raise DataError("task.dev_file: a task of your own files needs a dev file to score teacher and student on")
    column = (config.text_columns or ["tokens"])[0]
    probe = TaskSpec(config.name, ("tokens",), config.label_column, (), tsv_columns={column: "tokens"}, hub=None,
                     task_type="token_classification")
    label_names = tuple(config.label_names or ())
    if not label_names:
        found = {split: _tag_names(path, probe) for split, path in (("train", config.train_file),
                                                                    ("dev", config.dev_file))}
        label_names = tuple(tag_order(found["train"]))
        unseen = sorted(set(found["dev"]) - set(label_names))
        if unseen:
            raise DataError(f"{config.dev_file}: tag(s) {unseen} are in the dev set but not in the training set "
                            f"{config.train_file}; fix them, or set task.label_names to every tag")
        logger.info("task %s: tags %s (from %s; set task.label_names to fix their order)", config.name,
                    list(label_names), config.train_file)
    metrics = tuple(config.metrics or NER_METRICS)
    if not set(metrics) <= set(NER_METRICS) or metrics[0] == "accuracy":
        raise DataError(f"task.metrics: token classification scores {', '.join(NER_METRICS)}, with an entity metric "
                        f"first (a model that tags every word O has a high word accuracy); got {list(metrics)}")
    not_bio = [tag for tag in label_names if tag != "O" and tag[:2] not in ("B-", "I-")]
    if not_bio:
        raise DataError(f"task {config.name}: tag(s) {not_bio[:5]} are not BIO tags (O, B-type, I-type), which "
                        "entity-level scoring needs; convert the files to BIO")
    return TaskSpec(config.name, ("tokens",), config.label_column, label_names, metrics, hub=None,
                    tsv_columns={column: "tokens"}, dev_file=config.dev_file, train_file=config.train_file,
                    task_type="token_classification")


def _tag_names(path: str, probe) -> list[str]:
    from distill.data import DataError, read_table, require_columns

    if Path(path).suffix not in JSON_SUFFIXES:
        return [tag for tags in read_conll(path)["tag_names"] for tag in tags]
    table = read_table(path)
    require_columns(table, [probe.label_column], path)
    tags = [tag for row in table[probe.label_column] for tag in row]
    if any(not isinstance(tag, str) for tag in tags):
        raise DataError(f"{path}: tags are ids, not names; set task.label_names to the tag names in id order")
    return tags
