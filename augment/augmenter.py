"""TinyBERT data augmentation (Jiao et al., 2020, §3.3, Algorithm 1), batched.

For every word that is alphabetic and not a stop word, a candidate list is built once per sentence:
- a word that is a single word piece is masked and the masked LM's top-K predictions are taken (continuation
  pieces such as ``##ing`` dropped);
- a word of several pieces gets its K nearest word-vector neighbours by cosine similarity (GloVe);
then each of N copies replaces every such word, with probability p, by a uniformly drawn candidate.

Departures from the reference code, on purpose:
- Speed: the masked-LM work of many words and sentences runs as one batch (rows sorted by length, the LM head applied
  only at the masked positions) instead of one forward per word; neighbours are cached per word.
- Faithfulness of the output: words are replaced in place in the original string, so the input's casing and spacing
  are kept (the reference lower-cases and re-spaces); a replacement takes the capitalisation of the word it replaces.
- Masked-LM candidates must be alphabetic words: special tokens ([UNK], [SEP], ...), punctuation and numbers, which
  the reference code lets replace a word, are dropped (a weak masked LM predicts "," for many slots). The full vocabulary of the word vectors is used (the
  reference loaded the first 100k).
- Determinism: each example draws from its own RNG seeded by (seed, example index, column), so the output does not
  depend on batch size or worker count.
As in the reference code, with ``mlm_context="pair"`` the masked LM sees ``[CLS] masked sentence [SEP] original
sentence [SEP]``; ``"single"`` gives it the masked sentence only. A word without candidates keeps itself as its only
candidate, and copies identical to the original or to an earlier copy are dropped.
Word-list columns (token classification) run the same generator and draws word for word: :mod:`augment.tokens`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.method.objective import masked_lm_logits
from distill.tasks.base import DataError
from distill.tasks.words import split_words


def load_stopwords(path: str | None = None) -> frozenset[str]:
    """Stop words, lower-cased: a file (one a line), else NLTK's English list (the bundled copy when NLTK's data is
    not installed)."""
    if path is None:
        try:
            from nltk.corpus import stopwords

            return frozenset(stopwords.words("english"))
        except LookupError:
            path = str(Path(__file__).resolve().parent.parent / "distill" / "assets" / "stopwords" / "english")
    if not Path(path).is_file():
        raise DataError(f"stop word file {path} not found; give a file with one word a line")
    words = Path(path).read_text(encoding="utf-8").split()
    return frozenset(w.lower() for w in words)


def match_case(candidate: str, original: str) -> str:
    """``candidate`` with the capitalisation pattern of ``original`` (UPPER, Capitalised or as is)."""
    if len(original) > 1 and original.isupper():
        return candidate.upper()
    if original[:1].isupper():
        return candidate[:1].upper() + candidate[1:]
    return candidate


@dataclass
class MaskedRow:
    """One masked-LM query: the word at ``span`` of ``text`` masked."""

    text: str
    span: tuple[int, int]
    needs_space: bool  # a BPE word preceded by a space: candidates must be word-initial with the space marker


class CandidateGenerator:
    """Candidate lists for augmentation, batched across words and sentences.

    Args:
        masked_lm: a ``...ForMaskedLM`` model (BERT WordPiece or RoBERTa BPE), in eval mode.
        tokenizer: its tokenizer.
        neighbours: word -> K nearest word-vector neighbours (see :class:`augment.vectors.NeighbourCache`).
        stopwords: lower-cased stop words, never replaced.
        num_candidates: K.
        mlm_context: "pair" (reference: masked sentence, then the original as segment B) or "single".
        batch_size: masked rows per forward.
        device: where the masked LM runs.
    """

    def __init__(
        self,
        masked_lm: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        neighbours: Callable[[str], list[str]],
        stopwords: frozenset[str],
        num_candidates: int = 15,
        mlm_context: str = "pair",
        batch_size: int = 128,
        device: str | torch.device = "cpu",
    ):
        self.model, self.tokenizer = masked_lm.eval().to(device), tokenizer
        self.neighbours, self.stopwords = neighbours, stopwords
        self.num_candidates, self.mlm_context = num_candidates, mlm_context
        self.batch_size, self.device = batch_size, device
        self.space_sensitive = self._pieces(" a") != self._pieces("a")  # BPE with a leading-space marker
        # SentencePiece (XLM-R, CamemBERT, ALBERT) marks every word start with "▁", after a space or not, so a piece
        # without it is the rest of a word; WordPiece marks continuations instead ("##") and BPE the space (above).
        self.word_start = "▁" if tokenizer.convert_ids_to_tokens(self._pieces("a"))[0].startswith("▁") else None
        self.special_ids = set(tokenizer.all_special_ids)
        self._piece_cache: dict[tuple[bool, str], int] = {}
        self._decoded: dict[tuple[int, bool], str | None] = {}

    def _pieces(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def is_candidate_word(self, word: str) -> bool:
        """Words the algorithm may replace: alphabetic and not a stop word."""
        return word.isalpha() and word.lower() not in self.stopwords

    def num_pieces(self, word: str, after_space: bool) -> int:
        """Number of word pieces of ``word`` (with the leading-space marker for BPE words after a space)."""
        key = (after_space and self.space_sensitive, word)
        if key not in self._piece_cache:
            self._piece_cache[key] = len(self._pieces((" " if key[0] else "") + word))
        return self._piece_cache[key]

    def candidates(
        self, texts: list[str], allowed: list[Collection[tuple[int, int]]] | None = None
    ) -> list[dict[tuple[int, int], list[str]]]:
        """Candidate lists for every replaceable word of every text.

        Args:
            texts: the sentences.
            allowed: per text, the only word spans that may be candidates (word-list columns: the spans that are one
                whole word of the list and that the caller's mask allows); None: every word of :func:`split_words`.
                A span is still skipped when its word is not alphabetic or is a stop word.

        Returns:
            One dict per text: word span -> candidates (the word itself when nothing else was found), in text order.
        """
        results: list[dict[tuple[int, int], list[str]]] = []
        rows: list[MaskedRow] = []
        owners: list[tuple[int, tuple[int, int]]] = []  # (text index, span) of each masked row
        multi_piece: list[tuple[int, tuple[int, int]]] = []  # (text index, span) of each word-vector word
        for index, text in enumerate(texts):
            results.append({})
            for start, end in split_words(text):
                word = text[start:end]
                if not self.is_candidate_word(word) or (allowed is not None and (start, end) not in allowed[index]):
                    continue
                results[index][(start, end)] = []  # filled below, in text order
                after_space = start > 0 and text[start - 1].isspace()
                if self.num_pieces(word, after_space) == 1:
                    rows.append(MaskedRow(text, (start, end), after_space and self.space_sensitive))
                    owners.append((index, (start, end)))
                else:
                    multi_piece.append((index, (start, end)))
        if hasattr(self.neighbours, "prefetch"):  # one matrix product for all the words of the batch
            self.neighbours.prefetch([texts[i][s:e] for i, (s, e) in multi_piece])
        for index, (start, end) in multi_piece:
            results[index][(start, end)] = list(self.neighbours(texts[index][start:end]))
        for (index, span), words in zip(owners, self.masked_lm_candidates(rows)):
            results[index][span] = words
        for text, found in zip(texts, results):
            for (start, end), words in found.items():
                if not words:
                    words.append(text[start:end])
        return results

    def _encode(self, rows: list[MaskedRow]) -> list[dict[str, list[int]]]:
        """Token ids (and segment ids) of every row, tokenized in one call.

        With ``mlm_context="pair"`` a row is ``[CLS] masked text [SEP] text [SEP]`` with segment ids 0 then 1, as the
        reference code builds it.
        """
        masked = [r.text[: r.span[0]] + self.tokenizer.mask_token + r.text[r.span[1] :] for r in rows]
        if self.mlm_context == "pair":
            encoded = self.tokenizer(masked, [r.text for r in rows], truncation=True)
        else:
            encoded = self.tokenizer(masked, truncation=True)
        keys = [k for k in ("input_ids", "token_type_ids") if k in encoded]
        return [{k: encoded[k][i] for k in keys} for i in range(len(rows))]

    @torch.no_grad()
    def masked_lm_candidates(self, rows: list[MaskedRow]) -> list[list[str]]:
        """Top-K masked-LM predictions for each row; continuation pieces and non-words dropped (so up to K remain).

        Rows are sorted by length and run ``batch_size`` at a time, with the LM head applied at the masked position
        only. A row whose mask was truncated away (a text longer than the model's maximum) gets no candidates.
        """
        if not rows:
            return []
        encoded = self._encode(rows)
        order = sorted(range(len(rows)), key=lambda i: len(encoded[i]["input_ids"]))
        out: list[list[str]] = [[] for _ in rows]
        for first in range(0, len(order), self.batch_size):
            chunk = order[first : first + self.batch_size]
            top = self._top_k([encoded[i] for i in chunk])
            for i, ids in zip(chunk, top):
                out[i] = [w for w in (self._decode(t, rows[i].needs_space) for t in ids) if w is not None]
        return out

    def _top_k(self, rows: list[dict[str, list[int]]]) -> list[list[int]]:
        batch = self.tokenizer.pad(rows, return_tensors="pt").to(self.device)
        is_mask = batch["input_ids"] == self.tokenizer.mask_token_id
        # The first [MASK] of each row is the masked word (the pair's second text is unmasked).
        first_mask = is_mask.int().argmax(dim=1)
        positions = torch.zeros_like(is_mask)
        positions[torch.arange(len(rows), device=self.device), first_mask] = True
        logits = masked_lm_logits(self.model, batch, positions)  # (rows, V), one per row in row order
        top = logits.topk(self.num_candidates, dim=-1).indices.tolist()
        return [ids if found else [] for ids, found in zip(top, is_mask.any(dim=1).tolist())]

    def _decode(self, token_id: int, needs_space: bool) -> str | None:
        """The word a candidate token stands for, or None when it is not a whole alphabetic word (cached)."""
        key = (token_id, needs_space)
        if key not in self._decoded:
            text = None if token_id in self.special_ids else self.tokenizer.decode([token_id])
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            continuation = self.word_start is not None and not piece.startswith(self.word_start)
            if text is None or continuation or text.startswith("##") or (needs_space and not text.startswith(" ")):
                self._decoded[key] = None  # a special token or a continuation piece, not a word
            else:
                text = text.strip()
                self._decoded[key] = text if text.isalpha() else None  # punctuation and numbers are not words
        return self._decoded[key]


def sample_copies(
    text: str,
    candidates: dict[tuple[int, int], list[str]],
    num_copies: int,
    replace_prob: float,
    rng: random.Random,
) -> list[str]:
    """N augmented versions of ``text`` (TinyBERT Algorithm 1, lines 12-17); duplicates are removed by the caller.

    For each copy and each replaceable word in order: draw a candidate uniformly, then replace the word with
    probability ``replace_prob`` (the same draw order as the reference code).
    """
    copies = []
    for _ in range(num_copies):
        pieces, cursor = [], 0
        for (start, end), words in candidates.items():
            choice = rng.choice(words)
            if rng.random() < replace_prob:
                pieces += [text[cursor:start], match_case(choice, text[start:end])]
                cursor = end
        copies.append("".join(pieces) + text[cursor:])
    return copies


def sample_word_copies(
    words: list[str],
    candidates: dict[int, list[str]],
    num_copies: int,
    replace_prob: float,
    rng: random.Random,
) -> list[list[str]]:
    """N augmented versions of a word list (TinyBERT Algorithm 1, lines 12-17), word for word: every copy has
    ``len(words)`` words, so per-word labels stay aligned; duplicates are removed by the caller.

    Args:
        words: the sentence, one entry per word (W words).
        candidates: word position -> candidates, in sentence order (see :func:`augment.tokens.word_candidates`).
        num_copies: N.
        replace_prob: p, the probability that a candidate word is replaced.
        rng: the example's RNG.

    Returns:
        N lists of W words. The draws are those of :func:`sample_copies` (per copy and candidate word in order: a
        uniform candidate, then the replacement coin), so a plain sentence gives the copies its text would.
    """
    copies = []
    for _ in range(num_copies):
        copy = list(words)
        for position, options in candidates.items():
            choice = rng.choice(options)
            if rng.random() < replace_prob:
                copy[position] = match_case(choice, words[position])
        copies.append(copy)
    return copies
