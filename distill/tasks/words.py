"""Words: the helpers that both augmentation (:mod:`augment`) and word-level task types (token classification) need,
low in the house so that neither imports the other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

WORD_PATTERN = re.compile(r"\w+|[^\w\s]")


def split_words(text: str) -> list[tuple[int, int]]:
    """Word spans (start, end) of ``text``: runs of letters/digits, or single punctuation marks (like BERT's basic
    tokenizer, without lower-casing)."""
    return [match.span() for match in WORD_PATTERN.finditer(text)]


def joined_words(text: str, spans: list[tuple[int, int]] | None = None) -> str:
    """``text``'s words (:func:`split_words`, or ``spans`` already computed for it) joined by single spaces: the form
    in which a sentence typed plainly (``Hello, world!``) equals its tokenised copy (``Hello , world !``)."""
    return " ".join(text[start:end] for start, end in (split_words(text) if spans is None else spans))


@dataclass(frozen=True)
class TagMask:
    """A ``replaceable`` mask: the words whose tag id is in ``tag_ids`` may be replaced (picklable, so worker
    processes can use it; its repr identifies it in a run id)."""

    label_column: str
    tag_ids: tuple[int, ...]

    def __call__(self, row: dict) -> list[bool]:
        """W flags for ``row[label_column]`` (W tag ids)."""
        return [tag in self.tag_ids for tag in row[self.label_column]]


def only_tags(label_names: Sequence[str], tags: Sequence[str] = ("O",), label_column: str = "label") -> TagMask:
    """The mask that lets only words tagged with one of ``tags`` change (default: outside any entity, ``O``).

    Raises:
        ValueError: a tag is not among ``label_names``.
    """
    unknown = [t for t in tags if t not in label_names]
    if unknown:
        raise ValueError(f"tag(s) {unknown} are not among the labels {list(label_names)}")
    return TagMask(label_column, tuple(sorted(label_names.index(t) for t in tags)))
