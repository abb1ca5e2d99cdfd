"""Unlabelled text for general distillation: read, tokenise and pack into fixed-length sequences.

A corpus is a list of sources: local text files (``.txt`` or ``.gz``, one sentence a line, a blank line between
documents; each file is also a document boundary) or hub datasets ``name[:config]`` with a ``text`` column (for
example ``wikitext:wikitext-103-raw-v1``), read with `datasets`, streamed when asked.

Packing (as BERT's pre-training data, Devlin et al., 2019, §A.2, without the sentence-pair task): consecutive
sentences of one document are concatenated until the next one would not fit in ``max_seq_length - 2`` word pieces,
then ``[CLS] ... [SEP]`` (``<s> ... </s>`` for RoBERTa) is written as one sequence. A document never runs
into the next one; a sentence longer than a whole sequence is cut into pieces.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
import datasets
from transformers import PreTrainedTokenizerBase

from distill.method.checkpoint import mark_stage_done, stage_done
from distill.tasks.base import DataError
from distill.tasks.data import ASSETS
from distill.method.fingerprints import file_sha256

logger = logging.getLogger(__name__)

BUNDLED_CORPUS = ASSETS / "corpus" / "mlm_sample.txt.gz"
# The shipped transfer set: 50,000 other sentences of the same two corpora (distill/assets/PROVENANCE.md).
TRANSFER_CORPUS = ASSETS / "corpus" / "transfer_sample.txt.gz"
NAMED_CORPORA = {"bundled": BUNDLED_CORPUS, "transfer": TRANSFER_CORPUS}
TEXT_SUFFIXES = (".txt", ".gz", ".text")
# Lines tokenised together: the unit of work of the packing map, and of its resume position when streaming.
LINES_PER_BATCH = 1000


def corpus_sources(names: list[str]) -> list[str]:
    """Resolve corpus entries: "bundled" (the shipped Brown + movie-review sample, 12,000 sentences), "transfer" (50,000
    other sentences of the same corpora, shipped as a transfer set), files, or hub names.

    Raises:
        DataError: an entry looks like a file (has a path separator or a text suffix) but does not exist.
    """
    sources = []
    for name in names:
        if name in NAMED_CORPORA:
            name = str(NAMED_CORPORA[name])
        path = Path(name)
        looks_like_file = os.sep in name or name.endswith(TEXT_SUFFIXES)
        if looks_like_file and not path.is_file():
            raise DataError(
                f"corpus file {name} not found; give text files with one sentence a line and a blank line between "
                "documents (.txt or .gz), or a hub dataset name[:config] with a 'text' column"
            )
        sources.append(name)
    if not sources:
        raise DataError("the corpus is empty: give at least one text file or hub dataset")
    return sources


def _source_dataset(source: str, streaming: bool, column: str):
    """The lines of one source as a (streaming) dataset with one column ``text``."""
    if Path(source).is_file():
        loaded = datasets.load_dataset("text", data_files=[source], split="train", streaming=streaming)
    else:
        name, _, config = source.partition(":")
        loaded = datasets.load_dataset(name, config or None, split="train", streaming=streaming)
        if column not in loaded.column_names:
            raise DataError(f"corpus {source} has no column {column!r}; columns: {loaded.column_names}")
        if column != "text":
            loaded = loaded.rename_column(column, "text")
        loaded = loaded.select_columns(["text"])
    return loaded


def sample_lines(names: list[str], count: int, seed: int, min_words: int = 3,
                 exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """``count`` lines drawn uniformly at random, without replacement, from the lines of a corpus (``names`` as
    :func:`corpus_sources` takes them) that have at least ``min_words`` words (letter/digit runs and punctuation
    marks, as :func:`augment.augmenter.split_words` counts them) and are not in ``exclude``: reservoir sampling
    (Vitter's Algorithm R) over one streamed pass, so memory holds ``count`` lines whatever the corpus size. Lines are
    whitespace-normalised (runs of spaces made one) before they are returned, and compared with ``exclude`` both so and
    as their words joined by spaces (``Hello, world!`` is excluded by ``Hello , world !``). Same names, count and
    seed: the same lines in the same order. Fewer than ``count`` when the corpus has fewer such lines; none, and no
    file read, when ``count`` <= 0.

    Raises:
        DataError: a file named does not exist, or the corpus is empty.
    """
    from distill.tasks.words import joined_words, split_words

    rng = random.Random(f"{seed}:unlabelled")
    chosen: list[str] = []
    seen = 0
    if count <= 0:
        return chosen
    for source in corpus_sources(names):
        for row in _source_dataset(source, streaming=True, column="text"):
            line = " ".join(row["text"].split())
            words = split_words(line)
            if len(words) < min_words or line in exclude or joined_words(line, words) in exclude:
                continue
            if len(chosen) < count:
                chosen.append(line)
            else:
                slot = rng.randrange(seen + 1)
                if slot < count:
                    chosen[slot] = line
            seen += 1
    return chosen


def pack_lines(
    lines: list[str], tokenizer: PreTrainedTokenizerBase, max_seq_length: int
) -> dict[str, list[list[int]]]:
    """Pack consecutive lines into sequences of at most ``max_seq_length`` tokens, special tokens included.

    Args:
        lines: sentences in order; an empty (or blank) line ends a document.
        tokenizer: the teacher's tokenizer (its special tokens frame every sequence).
        max_seq_length: tokens per sequence, special tokens included.

    Returns:
        ``{"input_ids": [...]}``, one list of token ids per packed sequence; the end of ``lines`` ends a document.
    """
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if start is None or end is None:
        raise ValueError(f"{type(tokenizer).__name__} has no [CLS]/<s> or [SEP]/</s> token to frame a sequence")
    budget = max_seq_length - 2
    if budget < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for text after the special tokens")
    pieces = tokenizer([line.strip() for line in lines], add_special_tokens=False)["input_ids"]
    packed: list[list[int]] = []
    current: list[int] = []

    def flush() -> None:
        if current:
            packed.append([start, *current, end])
            current.clear()

    for line, ids in zip(lines, pieces):
        if not line.strip():
            flush()  # document boundary
            continue
        if len(current) + len(ids) > budget:
            flush()
        while len(ids) > budget:  # a sentence longer than a sequence: cut it
            current.extend(ids[:budget])
            flush()
            ids = ids[budget:]
        current.extend(ids)
    flush()
    return {"input_ids": packed}


def _packed(loaded, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, streaming: bool):
    kwargs = {} if streaming else {"desc": "pack corpus"}
    return loaded.map(
        lambda batch: pack_lines(batch["text"], tokenizer, max_seq_length),
        batched=True,
        batch_size=LINES_PER_BATCH,
        remove_columns=["text"],
        **kwargs,
    )


def corpus_fingerprint(sources: list[str], tokenizer_name: str, max_seq_length: int, column: str = "text") -> str:
    """Identity of a packed corpus, for the general stage's run id and cache.

    A file counts by the SHA-256 of its bytes, so a copy, a new download or a move of the same file keeps the id (a
    ``.gz`` compressed again may not: its header holds a time); a hub dataset counts by its name. The order of the
    sources counts, since it changes the packed sequences.

    Args:
        sources: :func:`corpus_sources`' entries, in order.
        tokenizer_name: the tokenizer that packs the corpus (the teacher's name or folder).
        max_seq_length: tokens per packed sequence.
        column: the text column of a hub dataset (counted when not the default "text", so ids made before it counted
            stay the same).

    Returns:
        16 hex digits.
    """
    parts = [tokenizer_name, str(max_seq_length), *([] if column == "text" else [f"column:{column}"])]
    for source in sources:
        path = Path(source)
        if path.is_file():
            parts.append(f"sha256:{file_sha256(path)}")
        else:
            parts.append(source)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load_packed_corpus(
    sources: list[str],
    tokenizer: PreTrainedTokenizerBase,
    max_seq_length: int = 128,
    streaming: bool = False,
    cache_dir: Path | None = None,
    column: str = "text",
    cache_id: str | None = None,
):
    """The corpus as packed token sequences: a ``datasets.Dataset`` (saved in ``cache_dir`` with ``cache_id``, e.g. a
    :func:`corpus_fingerprint`, and reused when the id matches) or, when
    ``streaming``, a ``datasets.IterableDataset`` packed on the fly (nothing is written; the position is resumable
    through its ``state_dict``).

    Each example has ``input_ids`` (T ≤ ``max_seq_length``) and ``attention_mask`` / ``token_type_ids`` are added by
    the collator.

    Raises:
        DataError: a file is missing or the corpus has no text.
        CheckpointError: ``cache_dir`` holds a corpus packed from other sources or with other settings.
    """
    sources = corpus_sources(sources)
    if streaming:
        parts = [_packed(_source_dataset(s, True, column), tokenizer, max_seq_length, True) for s in sources]
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if cache_dir is not None and stage_done(cache_dir, cache_id or "") is not None:
        return datasets.load_from_disk(str(cache_dir))
    parts = [_packed(_source_dataset(s, False, column), tokenizer, max_seq_length, False) for s in sources]
    packed = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(packed) == 0:
        raise DataError(f"corpus {sources} has no text")
    num_tokens = sum(len(ids) for ids in packed["input_ids"])
    logger.info("corpus: %d sequences, %d tokens (%.1f per sequence) from %s", len(packed), num_tokens,
                num_tokens / len(packed), sources)
    if cache_dir is None:
        return packed
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=f".{cache_dir.name}-"))
    packed.save_to_disk(str(tmp))
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    os.replace(tmp, cache_dir)
    mark_stage_done(cache_dir, cache_id or "", {"num_sequences": len(packed), "num_tokens": num_tokens})
    return datasets.load_from_disk(str(cache_dir))

