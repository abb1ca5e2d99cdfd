"""`adapt-mlm`: give an encoder without a masked-LM head (e.g. the MiniLM sentence encoder) a trained MLM head.

The encoder is loaded as ``AutoModelForMaskedLM`` (new head, decoder tied to the word embeddings) and trained on a
text corpus with BERT's masking (15% of tokens; 80% [MASK], 10% random, 10% kept; Devlin et al., 2019, §3.1).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import datasets
import torch
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, set_seed

from distill.method.checkpoint import mark_stage_done
from distill.config import MLMConfig
from distill.tasks.base import DataError
from distill.tasks.data import ASSETS
from distill.method.objective import MaskedLMObjective
from distill.method.processes import on_main
from distill.method.trainer import train
from teachers.models import load_tokenizer, resolve_model

logger = logging.getLogger(__name__)

BUNDLED_CORPUS = ASSETS / "corpus" / "mlm_sample.txt.gz"


def corpus_files(names: list[str]) -> list[str]:
    """Resolve corpus entries ("bundled" = the shipped Brown + movie-review sample) to existing files.

    Raises:
        DataError: a file does not exist.
    """
    files = [str(BUNDLED_CORPUS) if name == "bundled" else name for name in names]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise DataError(f"corpus file(s) not found: {missing}; give text files with one sentence a line (.txt or .gz)")
    return files


def load_corpus(files: list[str]) -> datasets.Dataset:
    """Non-empty lines of the corpus files as a Dataset with column ``text`` (gzip handled by `datasets`)."""
    corpus = datasets.load_dataset("text", data_files=files, split="train")
    corpus = corpus.filter(lambda batch: [bool(t.strip()) for t in batch["text"]], batched=True, desc="drop blank lines")
    if len(corpus) == 0:
        raise DataError(f"corpus {files} has no non-empty lines")
    return corpus


def adapt_mlm(config: MLMConfig, stage_dir: Path, run_id: str, *, device: torch.device) -> dict:
    """Train an MLM head (and the encoder) of ``config.base_model`` on ``config.corpus`` on ``device``; save to
    ``stage_dir``.

    Returns:
        The stage record: {"run_id", "num_corpus_lines", "corpus", "device"}.
    """
    tokenizer = load_tokenizer(config.base_model)
    set_seed(config.train.seed)  # the new MLM head is drawn from the global RNG
    model = AutoModelForMaskedLM.from_pretrained(resolve_model(config.base_model))
    corpus = load_corpus(corpus_files(config.corpus))
    encoded = corpus.map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=config.max_seq_length),
        batched=True,
        remove_columns=["text"],
        desc="tokenize corpus",
    )
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.mlm_probability)
    objective = MaskedLMObjective(model)
    # The masks are drawn from the global RNG, in order with dropout: collated in the training thread (no prefetch).
    train(objective, encoded, masking, config.train, stage_dir, run_id, "adapt-mlm", device=device, prefetch=False)

    def finish() -> None:  # one process saves it; the others then read its record
        model.save_pretrained(stage_dir)
        tokenizer.save_pretrained(stage_dir)
        shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
        mark_stage_done(stage_dir, run_id, {"num_corpus_lines": len(corpus), "corpus": config.corpus,
                                            "device": str(device)})

    return on_main(stage_dir, run_id, finish)
