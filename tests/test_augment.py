"""TinyBERT augmentation on a tiny vocabulary: the single-/multi-piece rule, stop words, determinism, resume."""

import random
import shutil

import datasets
import numpy as np
import pytest
import torch
from gensim.models import KeyedVectors
from transformers import BertConfig, BertForMaskedLM

from augment import CandidateGenerator, NeighbourCache, augment_dataset, load_stopwords, match_case, sample_copies
from augment.augmenter import split_words
from distill.config import AugmentConfig
from tests.conftest import SPECIAL, WORDS


@pytest.fixture
def vectors():
    kv = KeyedVectors(vector_size=3)
    kv.add_vectors(
        ["wonderful", "marvellous", "superb", "terrible", "awful", "table"],
        np.array([[1, 0, 0], [0.9, 0.1, 0], [0.8, 0.3, 0], [-1, 0, 0], [-0.9, -0.1, 0], [0, 0, 1]], dtype=np.float32),
    )
    return kv


@pytest.fixture
def generator(tiny_tokenizer, vectors):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    model = BertForMaskedLM(config).eval()
    return CandidateGenerator(model, tiny_tokenizer, NeighbourCache(vectors, 2), load_stopwords(), num_candidates=8,
                              mlm_context="pair", batch_size=4)


def test_split_words_keeps_spans():
    text = "It's a GOOD movie, isn't it?"
    assert [text[s:e] for s, e in split_words(text)] == ["It", "'", "s", "a", "GOOD", "movie", ",", "isn", "'", "t", "it", "?"]


def test_single_piece_words_use_the_masked_lm_and_multi_piece_words_the_vectors(generator):
    text = "the movie was wonderful and the plot terrible !"
    (found,) = generator.candidates([text])
    words = {text[s:e]: c for (s, e), c in found.items()}
    # Stop words (the, was, and) and punctuation are never candidates.
    assert set(words) == {"movie", "wonderful", "plot", "terrible"}
    assert generator.num_pieces("movie", True) == 1 and generator.num_pieces("wonderful", True) == 2
    assert words["wonderful"] == ["marvellous", "superb"]  # 2 nearest by cosine, itself excluded
    assert words["terrible"] == ["awful", "marvellous"] or words["terrible"][0] == "awful"
    vocab = set(WORDS)
    for word in ("movie", "plot"):
        assert 0 < len(words[word]) <= 8
        assert all(c in vocab and c.isalpha() for c in words[word])  # no ## pieces, specials or punctuation


def test_word_without_candidates_keeps_itself(generator):
    (found,) = generator.candidates(["Terriful"])  # terri + ##ful: several pieces, unknown to the vectors
    assert generator.num_pieces("Terriful", False) == 2
    assert list(found.values()) == [["Terriful"]]


def test_batched_candidates_equal_one_row_at_a_time(generator):
    texts = ["the movie was good", "a very boring plot , not fun", "great cast and a fine story !", "actor"]
    batched = generator.candidates(texts)
    generator.batch_size = 1
    single = [generator.candidates([t])[0] for t in texts]
    assert batched == single


def test_match_case_and_in_place_replacement():
    assert match_case("good", "Great") == "Good" and match_case("good", "GREAT") == "GOOD"
    assert match_case("good", "great") == "good"
    text = "The  Movie was fine ."
    candidates = {(5, 10): ["film"], (15, 19): ["good"]}
    assert sample_copies(text, candidates, 2, 1.0, random.Random(0)) == ["The  Film was good ."] * 2
    assert sample_copies(text, candidates, 3, 0.0, random.Random(0)) == [text] * 3


def test_sampling_follows_the_reference_draw_order():
    candidates = {(0, 1): ["x", "y", "z"], (2, 3): ["u", "v"]}
    rng, reference = random.Random(7), random.Random(7)
    copies = sample_copies("a b", candidates, 5, 0.4, rng)
    expected = []
    for _ in range(5):
        words = ["a", "b"]
        for i, options in enumerate(candidates.values()):
            choice = reference.choice(options)
            if reference.random() < 0.4:
                words[i] = choice
        expected.append(" ".join(words))
    assert copies == expected


def _dataset():
    return datasets.Dataset.from_dict({
        "sentence1": ["the movie was good", "a boring plot", "Great cast !", "the story", "fine"],
        "sentence2": ["it was fun", "not fun", "very good", "bad film", "the end"],
        "label": [1, 0, 1, 0, 1],
    })


def test_pair_task_augments_both_columns_keeps_labels_and_is_deterministic(generator, tmp_path):
    config = AugmentConfig(num_copies=6, replace_prob=0.5, seed=3, shard_size=2, batch_size=2)
    out = augment_dataset(_dataset(), ("sentence1", "sentence2"), generator, config, tmp_path / "a")
    rows = out.to_list()
    originals = [r for r in rows if not r["is_augmented"]]
    assert [r["sentence1"] for r in originals] == _dataset()["sentence1"]
    for row in rows:
        assert row["label"] == _dataset()["label"][row["source_index"]]
    changed1 = sum(r["sentence1"] != _dataset()["sentence1"][r["source_index"]] for r in rows)
    changed2 = sum(r["sentence2"] != _dataset()["sentence2"][r["source_index"]] for r in rows)
    assert changed1 > 0 and changed2 > 0
    pairs = [(r["source_index"], r["sentence1"], r["sentence2"]) for r in rows]
    assert len(pairs) == len(set(pairs))  # exact duplicates dropped

    generator.batch_size = 1
    config_b = AugmentConfig(num_copies=6, replace_prob=0.5, seed=3, shard_size=3, batch_size=1)
    again = augment_dataset(_dataset(), ("sentence1", "sentence2"), generator, config_b, tmp_path / "b")
    assert again.to_list() == rows  # same seed, other batch and shard sizes: same output


def test_resume_continues_from_the_first_missing_shard(generator, tmp_path):
    config = AugmentConfig(num_copies=4, replace_prob=0.5, seed=1, shard_size=2, max_examples=4)
    full = augment_dataset(_dataset(), ("sentence1",), generator, config, tmp_path).to_list()
    shards = sorted((tmp_path / "shards").glob("shard-*"))
    assert len(shards) == 3  # two augmented shards and the unaugmented rest
    assert [r["is_augmented"] for r in full if r["source_index"] == 4] == [False]
    shutil.rmtree(shards[1])  # as if killed before the second shard was renamed into place
    (tmp_path / "shards" / ".tmp-partial").mkdir()  # a partial shard is never read
    assert augment_dataset(_dataset(), ("sentence1",), generator, config, tmp_path).to_list() == full
