"""TinyBERT augmentation of word-list columns (token classification: NER, slot filling, PoS), word for word.

Shapes: W words of a sentence (one label per word), N copies.

A word-list column (``tokens``: a list of words, as a CoNLL file gives them) is augmented by the string algorithm of
:mod:`augment.augmenter` (TinyBERT, Jiao et al., 2020, §3.3, Algorithm 1) run on the sentence text, the words joined
by single spaces, with three rules of ours that keep per-word labels true:
- only a span that is exactly one whole word of the list may be replaced (``@user`` or ``it's``, which the string
  rule splits, keep themselves), and only where the caller's mask allows it (e.g. words tagged ``O``);
- candidates must be single alphabetic words (no spaces, hyphens or digits: word-vector neighbours such as
  ``e-mail`` are dropped; a word left with none keeps itself);
- a copy replaces words in place, so it has exactly W words and the label list of its source.
The draws are the string algorithm's (per copy, per candidate word in order), from the example's own RNG.
"""

from __future__ import annotations

from typing import Callable, Sequence

import datasets

from augment.augmenter import CandidateGenerator
from distill.tasks.base import DataError
from distill.tasks.words import TagMask, only_tags  # noqa: F401  (augment's own API)


def word_spans(words: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) of each word in ``" ".join(words)``, the text the candidate generator reads."""
    spans, cursor = [], 0
    for word in words:
        spans.append((cursor, cursor + len(word)))
        cursor += len(word) + 1
    return spans


def is_word_list_feature(feature) -> bool:
    """Whether a ``datasets`` feature is a list of strings (Arrow ``list<string>``), i.e. a word-list column."""
    inner = getattr(feature, "feature", None)
    return isinstance(feature, (datasets.List, datasets.LargeList, datasets.Sequence)) and isinstance(
        inner, datasets.Value) and inner.dtype in ("string", "large_string")


def check_words(words, column: str, index: int) -> list[str]:
    """``words`` as a list of str.

    Raises:
        DataError: the value is not a list of strings (names the column, the example and the first bad entry).
    """
    if not isinstance(words, (list, tuple)):
        raise DataError(f"column {column!r}, example {index}: expected a list of words, got {type(words).__name__}")
    for position, word in enumerate(words):
        if not isinstance(word, str):
            raise DataError(f"column {column!r}, example {index}: word {position} is {word!r}, not a string")
    return list(words)


def word_masks(
    examples: list[dict], indices: list[int], column: str, replaceable: Callable[[dict], list[bool]] | None
) -> list[list[bool]] | None:
    """The replaceable flags of each example's words in ``column`` (W per example); None when ``replaceable`` is.

    Raises:
        DataError: a mask does not have one flag per word (names the example and both lengths).
    """
    if replaceable is None:
        return None
    masks = []
    for example, index in zip(examples, indices):
        mask = [bool(flag) for flag in replaceable(example)]
        if len(mask) != len(example[column]):
            raise DataError(f"example {index}: the replaceable mask has {len(mask)} flags for the "
                            f"{len(example[column])} words of column {column!r}; give one flag per word")
        masks.append(mask)
    return masks


def word_candidates(
    generator: CandidateGenerator, sentences: list[list[str]], masks: list[list[bool]] | None = None
) -> list[dict[int, list[str]]]:
    """Candidate lists for the replaceable words of each sentence (TinyBERT §3.3: masked-LM top-K for single-piece
    words, word-vector neighbours for the rest), restricted to whole words and single alphabetic candidates.

    Args:
        generator: the candidate generator of string columns (its masked-LM batching is reused as it is).
        sentences: lists of W words (each a str).
        masks: per sentence, W flags (False: the word keeps itself); None: every word may be replaced. The
            algorithm's own rule still applies: the word must be alphabetic and not a stop word.

    Returns:
        One dict per sentence: word position -> candidates (at least one; the word itself when no single alphabetic
        candidate was found), in sentence order.
    """
    texts = [" ".join(words) for words in sentences]
    spans = [word_spans(words) for words in sentences]
    if masks is None:
        allowed = [set(s) for s in spans]
    else:
        allowed = [{span for span, ok in zip(s, mask) if ok} for s, mask in zip(spans, masks)]
    found = generator.candidates(texts, allowed)
    results = []
    for words, sentence_spans, by_span in zip(sentences, spans, found):
        position = {span: i for i, span in enumerate(sentence_spans)}
        results.append({})
        for span, options in by_span.items():
            i = position[span]
            results[-1][i] = [w for w in options if w.isalpha()] or [words[i]]
    return results


def replacement_stats(
    original_rows: Sequence[dict],
    augmented_rows: Sequence[dict],
    label_names: Sequence[str],
    *,
    token_column: str = "tokens",
    label_column: str = "label",
    outside: Sequence[str] = ("O",),
) -> dict:
    """How augmentation treated the words of a token-classification set, and whether its labels stayed true.

    Args:
        original_rows: the input rows (``token_column``: W words, ``label_column``: W tag ids).
        augmented_rows: the rows :func:`augment.augment_dataset` returned (originals and copies, each with
            ``source_index`` into ``original_rows`` and ``is_augmented``).
        label_names: tag names in id order.
        token_column, label_column: the columns to read.
        outside: the tags that are not entities.

    Returns:
        {"num_examples", "num_copies" (augmented rows), "copies_per_example" (mean), "num_examples_augmented" (with at
        least one copy), "num_words" and "num_replaced" ({"outside": n, "entity": n}, over the copies' words),
        "replaced_rate" ({"outside", "entity"}: replaced / words, 0.0 when there are none), "num_replaced_by_tag"
        (tag name -> n), "misaligned" (positions in ``augmented_rows`` whose word count or label list differs from
        their source's), "aligned" (no misaligned row)}.

    Raises:
        ValueError: a row's ``source_index`` is outside ``original_rows``, or a tag id outside ``label_names``.
    """
    words = {"outside": 0, "entity": 0}
    replaced = {"outside": 0, "entity": 0}
    by_tag = {name: 0 for name in label_names}
    misaligned, augmented_sources = [], set()
    for position, row in enumerate(augmented_rows):
        index = row["source_index"]
        if not 0 <= index < len(original_rows):
            raise ValueError(f"augmented row {position}: source_index {index} is outside the {len(original_rows)} "
                             "original rows")
        source = original_rows[index]
        if len(row[token_column]) != len(source[token_column]) or list(row[label_column]) != list(source[label_column]):
            misaligned.append(position)
            continue
        if not row["is_augmented"]:
            continue
        augmented_sources.add(index)
        for old, new, tag in zip(source[token_column], row[token_column], source[label_column]):
            if not 0 <= tag < len(label_names):
                raise ValueError(f"original row {index}: tag id {tag} is outside the {len(label_names)} labels")
            kind = "outside" if label_names[tag] in outside else "entity"
            words[kind] += 1
            if new != old:
                replaced[kind] += 1
                by_tag[label_names[tag]] += 1
    num_copies = sum(1 for row in augmented_rows if row["is_augmented"])
    return {
        "num_examples": len(original_rows),
        "num_copies": num_copies,
        "copies_per_example": num_copies / len(original_rows) if original_rows else 0.0,
        "num_examples_augmented": len(augmented_sources),
        "num_words": words,
        "num_replaced": replaced,
        "replaced_rate": {k: replaced[k] / words[k] if words[k] else 0.0 for k in words},
        "num_replaced_by_tag": by_tag,
        "misaligned": misaligned,
        "aligned": not misaligned,
    }
