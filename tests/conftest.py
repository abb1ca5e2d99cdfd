"""Shared fixtures: tiny randomly initialised BERT/RoBERTa models and a tiny WordPiece tokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer, RobertaConfig, RobertaForSequenceClassification

# A WordPiece vocabulary small enough to reason about: "movie", "good" ... are single pieces;
# "wonderful" splits into "wonder" + "##ful".
WORDS = [
    "the", "a", "and", "was", "is", "it", "movie", "film", "good", "bad", "great", "fine", "plot", "story",
    "wonder", "##ful", "terri", "##ble", "actor", "cast", "boring", "fun", "very", "not", ".", ",", "!", "'", "s",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture
def tiny_tokenizer():
    return BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)


def tiny_bert_config(**overrides) -> BertConfig:
    values = dict(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, num_labels=2)
    values.update(overrides)
    return BertConfig(**values)


def tiny_bert(seed: int = 0, **overrides) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(tiny_bert_config(**overrides)).eval()


def tiny_roberta(seed: int = 0, **overrides) -> RobertaForSequenceClassification:
    torch.manual_seed(seed)
    values = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=70, num_labels=2, type_vocab_size=1, pad_token_id=1)
    values.update(overrides)
    return RobertaForSequenceClassification(RobertaConfig(**values)).eval()


def padded_batch(seed: int = 0, batch: int = 3, length: int = 7, vocab: int = 30) -> dict:
    """Random ids with a ragged attention mask (row i has length - 2*i real tokens)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, length - 2 * row :] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}
