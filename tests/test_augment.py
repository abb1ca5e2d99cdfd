"""TinyBERT augmentation on a tiny vocabulary: the single-/multi-piece rule, stop words, determinism, resume."""

import functools
import random
import shutil

import datasets
import numpy as np
import pytest
import torch

from augment import (
    CandidateGenerator,
    NeighbourCache,
    VectorsError,
    augment_dataset,
    augment_examples,
    load_stopwords,
    load_word_vectors,
    match_case,
    sample_copies,
)
from augment.dataset import example_rng
from augment.augmenter import split_words
from distill.method.checkpoint import CheckpointError
from distill.config import AugmentConfig
from tests.conftest import WORDS, folder_identity, tiny_generator, tiny_vectors


@pytest.fixture
def vectors():
    return tiny_vectors()


@pytest.fixture
def generator():
    return tiny_generator()


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
    assert words["terrible"] == ["awful", "table"]  # cosine 0.99 and 0; the others are negative
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
    first = folder_identity(shards[0])
    # The missing shard alone is made again: one pass of the generator (a second would raise).
    assert augment_dataset(_dataset(), ("sentence1",), _Interrupting(generator, 1), config, tmp_path).to_list() == full
    assert folder_identity(shards[0]) == first  # the finished shard was kept, not written again


def test_changed_word_rate_is_close_to_p():
    words = [f"w{i}" for i in range(10)]
    text = " ".join(words)
    spans = [m.span() for m in __import__("re").finditer(r"\w+", text)]
    candidates = {span: ["x", "y", "z"] for span in spans}  # never the word itself: a draw < p always changes it
    copies = sample_copies(text, candidates, 2000, 0.4, random.Random(0))
    changed = sum(a != b for copy in copies for a, b in zip(copy.split(), words))
    assert changed / (2000 * len(words)) == pytest.approx(0.4, abs=0.01)


def test_stop_words_numbers_and_punctuation_are_never_replaced_and_spacing_and_case_are_kept(generator):
    text = "The  MOVIE ,was 2 wonderful hours -- and   it's fine!"
    (found,) = generator.candidates([text])
    assert sorted(text[s:e] for s, e in found) == ["MOVIE", "fine", "hours", "wonderful"]
    example = {"sentence": text, "label": 1}
    rows = augment_examples([example], [0], ("sentence",), generator,
                            AugmentConfig(num_copies=30, replace_prob=1.0, seed=0))
    assert len(rows) > 3
    for row in rows[1:]:
        out = row["sentence"]
        # Everything but the four replaceable words is the input, byte for byte (spacing, case, punctuation).
        assert out.startswith("The  ") and ",was 2 " in out and " -- and   it's " in out and out.endswith("!")
        replaced = out[len("The  "):out.index(" ,was")]
        assert replaced.isupper()  # an upper-case word is replaced by an upper-case candidate


def test_pair_columns_are_augmented_independently(generator):
    config = AugmentConfig(num_copies=8, replace_prob=0.5, seed=4)
    first = {"sentence1": "the movie was good", "sentence2": "a boring plot and a fine cast", "label": 0}
    second = {**first, "sentence1": "great fun , great story"}
    rows_a = augment_examples([first], [7], ("sentence1", "sentence2"), generator, config)
    rows_b = augment_examples([second], [7], ("sentence1", "sentence2"), generator, config)
    # Column 2's copies do not depend on column 1's text (the reference code's in-place bug mixes them).
    expected = sample_copies(first["sentence2"], generator.candidates([first["sentence2"]])[0], 8, 0.5,
                             example_rng(4, 7, "sentence2"))
    for rows in (rows_a, rows_b):  # copy i of the pair is (copy i of column 1, copy i of column 2), duplicates dropped
        remaining = iter(expected)
        assert len(rows) > 2  # the original and copies to check
        assert all(any(r["sentence2"] == c for c in remaining) for r in rows[1:])  # an ordered subsequence
    assert sum(r["sentence2"] != first["sentence2"] for r in rows_a) > 2
    assert all(r["label"] == 0 for r in rows_a + rows_b)


class _Interrupting:
    """Wraps a generator and raises after ``calls`` candidate passes: a kill in the middle of a shard."""

    def __init__(self, generator, calls):
        self.generator, self.calls = generator, calls

    def __call__(self):
        return self

    def candidates(self, texts):
        self.calls -= 1
        if self.calls < 0:
            raise KeyboardInterrupt("killed")
        return self.generator.candidates(texts)


def test_a_missing_text_stays_missing_in_every_copy(generator, tmp_path):
    """An empty cell (None) is not the word "None": copies keep it missing, and a copy that changes nothing else is
    dropped as a duplicate of the original."""
    data = datasets.Dataset.from_dict({"sentence1": ["the movie was good", "a boring plot"],
                                       "sentence2": [None, "not fun"], "label": [1, 0]})
    config = AugmentConfig(num_copies=6, replace_prob=0.5, seed=3, shard_size=2, batch_size=2)
    rows = augment_dataset(data, ("sentence1", "sentence2"), generator, config, tmp_path / "a").to_list()
    first = [r for r in rows if r["source_index"] == 0]
    assert len(first) > 1 and all(r["sentence2"] is None for r in first)
    assert len({r["sentence1"] for r in first}) == len(first)  # no copy equal to the original or another copy
    assert any(r["sentence2"] != "not fun" for r in rows if r["source_index"] == 1)


def test_resume_after_an_interruption_gives_the_uninterrupted_output(generator, tmp_path):
    config = AugmentConfig(num_copies=5, replace_prob=0.5, seed=2, shard_size=2, batch_size=1)
    full = augment_dataset(_dataset(), ("sentence1", "sentence2"), generator, config, tmp_path / "full", "run")
    with pytest.raises(KeyboardInterrupt):  # one pass per column and shard: dies in the second shard's second column
        augment_dataset(_dataset(), ("sentence1", "sentence2"), _Interrupting(generator, 3), config,
                        tmp_path / "killed", "run")
    assert [p.name for p in sorted((tmp_path / "killed" / "shards").glob("shard-*"))] == ["shard-00000"]
    first = folder_identity(tmp_path / "killed" / "shards" / "shard-00000")
    # Resumed at the second shard: two shards of two columns, four passes (a run from the start would need six).
    resumed = augment_dataset(_dataset(), ("sentence1", "sentence2"), _Interrupting(generator, 4), config,
                              tmp_path / "killed", "run")
    assert folder_identity(tmp_path / "killed" / "shards" / "shard-00000") == first
    assert resumed.to_list() == full.to_list()
    with pytest.raises(CheckpointError, match="shards of another augmentation run"):
        augment_dataset(_dataset(), ("sentence1",), generator, config, tmp_path / "killed", "other-run")


def test_bpe_rule_on_a_tiny_roberta(tiny_roberta_tokenizer, vectors):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(tiny_roberta_tokenizer), hidden_size=32,
                                             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                             max_position_embeddings=70, type_vocab_size=1, pad_token_id=1)).eval()
    generator = CandidateGenerator(model, tiny_roberta_tokenizer, NeighbourCache(vectors, 2), load_stopwords(),
                                   num_candidates=40, batch_size=3)
    assert generator.space_sensitive
    text = "movie was a wonderful film"
    (found,) = generator.candidates([text])
    words = {text[s:e]: c for (s, e), c in found.items()}
    assert generator.num_pieces("movie", after_space=False) == 2  # no leading space: "mo" + "vie"
    assert generator.num_pieces("film", after_space=True) == 1  # "Ġfilm"
    assert words["wonderful"] != ["wonderful"] and generator.num_pieces("wonderful", True) == 1
    assert words["movie"] == ["movie"]  # two pieces, unknown to the vectors: keeps itself
    vocab = tiny_roberta_tokenizer.get_vocab()
    for word in ("wonderful", "film"):  # masked-LM candidates: whole words that start with the space marker
        assert words[word] and all("Ġ" + c in vocab and c.isalpha() for c in words[word])


def test_sentencepiece_rule_keeps_whole_words_only(vectors):
    """A SentencePiece vocabulary (XLM-R, CamemBERT, ALBERT) marks word starts ("▁film"), not continuations: "ing"
    is the rest of a word, and must not replace a whole one however high the masked LM ranks it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import XLMRobertaConfig, XLMRobertaForMaskedLM, XLMRobertaTokenizerFast

    pieces = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "▁the", "▁film", "▁was", "▁wonderful", "▁movie",
              "▁a", "▁great", "▁show", "▁walk", "ing", "s", "ed", "▁", "wonder"]
    unigram = Tokenizer(models.Unigram([(p, -float(i)) for i, p in enumerate(pieces)], unk_id=3))
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer = XLMRobertaTokenizerFast(tokenizer_object=unigram, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=len(pieces), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=70, type_vocab_size=1, pad_token_id=1)
    model = XLMRobertaForMaskedLM(config).eval()
    # Every piece is among the K candidates, so what is kept is decided by the rule alone.
    generator = CandidateGenerator(model, tokenizer, NeighbourCache(vectors, 2), load_stopwords(),
                                   num_candidates=len(pieces), batch_size=2)
    assert not generator.space_sensitive and generator.word_start == "▁"
    text = "the film was a show"
    (found,) = generator.candidates([text])
    words = {text[s:e]: set(c) for (s, e), c in found.items()}
    whole = {"the", "film", "was", "wonderful", "movie", "a", "great", "show", "walk"}
    assert words["film"] and words["show"] and words["film"] <= whole and words["show"] <= whole
    assert not {"ing", "s", "ed", "wonder"} & (words["film"] | words["show"])


def test_missing_word_vectors_file_is_a_clear_error(tmp_path):
    with pytest.raises(VectorsError, match=r"word vectors '.*nope.txt' not found: give 'glove-6b-50d'"):
        load_word_vectors(str(tmp_path / "nope.txt"))


def test_glove_text_file_and_batched_neighbours_equal_gensim(tmp_path, vectors):
    path = tmp_path / "tiny_glove.txt"
    tilted = {w: vectors[w] + np.array([0.0, 0.05 * i, 0.1 * i], dtype=np.float32) for i, w in enumerate(vectors.index_to_key)}
    path.write_text("".join(f"{w} {' '.join(str(x) for x in v)}\n" for w, v in tilted.items()))  # no cosine ties
    loaded = load_word_vectors(str(path))
    assert loaded.index_to_key == vectors.index_to_key
    cache = NeighbourCache(loaded, 3, chunk_size=2)
    cache.prefetch(["Wonderful", "table", "unknownword", "awful"])
    for word in ("wonderful", "table", "awful"):
        assert cache(word) == [w for w, _ in loaded.most_similar(word, topn=3)]
    assert cache("unknownword") == []


def test_worker_processes_give_the_same_output(tmp_path):
    config = AugmentConfig(num_copies=4, replace_prob=0.5, seed=9, shard_size=2, batch_size=2)
    one = augment_dataset(_dataset(), ("sentence1", "sentence2"), tiny_generator, config, tmp_path / "one")
    two_workers = AugmentConfig(num_copies=4, replace_prob=0.5, seed=9, shard_size=2, batch_size=3, num_workers=2)
    two = augment_dataset(_dataset(), ("sentence1", "sentence2"), functools.partial(tiny_generator, 3), two_workers,
                          tmp_path / "two")
    assert two.to_list() == one.to_list()


def test_max_rows_augments_a_small_task_in_full_and_a_large_one_in_part():
    from augment.dataset import examples_to_augment

    config = AugmentConfig(num_copies=20, max_rows=40_000)
    assert examples_to_augment(1_000, config) == 1_000  # 1,000 · 21 rows fit
    assert examples_to_augment(3_668, config) == (40_000 - 3_668) // 20  # MRPC: 1,816 pairs
    assert examples_to_augment(67_349, config) == 0  # more examples than the budget: kept as they are
    assert examples_to_augment(3_668, AugmentConfig(num_copies=20, max_rows=40_000, max_examples=500)) == 500
    assert examples_to_augment(3_668, AugmentConfig(num_copies=20)) == 3_668


def test_pair_copies_one_changes_one_text_of_a_pair_per_copy():
    from augment.dataset import augment_examples
    from tests.conftest import tiny_generator

    example = {"sentence1": "the movie was good", "sentence2": "a wonderful film", "label": 1}
    both = augment_examples([example], [0], ("sentence1", "sentence2"), tiny_generator(),
                            AugmentConfig(num_copies=8, replace_prob=1.0, seed=3))
    one = augment_examples([example], [0], ("sentence1", "sentence2"), tiny_generator(),
                           AugmentConfig(num_copies=8, replace_prob=1.0, seed=3, pair_copies="one"))
    assert any(r["sentence1"] != example["sentence1"] and r["sentence2"] != example["sentence2"] for r in both[1:])
    changed = [(r["sentence1"] != example["sentence1"], r["sentence2"] != example["sentence2"]) for r in one[1:]]
    assert changed and all(a != b for a, b in changed)  # exactly one text changed in every copy
    assert {a for a, _ in changed} == {True, False}  # the first text in some copies, the second in others


def test_max_mlm_words_bounds_the_masked_lm_work_not_only_the_rows(generator, tmp_path):
    """Per example and text, words x words of a masked row (pair context: the text twice): 50, 26, 26, 16, 10 here.
    A budget of 100 augments the first two examples (76; the third would make 102); the rest are kept as they are."""
    from augment.dataset import examples_to_augment, masked_lm_words

    work = [masked_lm_words(example, ("sentence1", "sentence2"), "pair") for example in _dataset()]
    assert work == [50, 26, 26, 16, 10]
    assert masked_lm_words(_dataset()[0], ("sentence1",), "single") == 16
    assert masked_lm_words({"tokens": ["Paris", "is", "big"]}, ("tokens",), "pair") == 18  # a word list: its length
    config = AugmentConfig(num_copies=3, max_mlm_words=100)
    assert examples_to_augment(5, config, work) == 2
    assert examples_to_augment(5, AugmentConfig(num_copies=3, max_mlm_words=100, max_examples=1), work) == 1
    assert examples_to_augment(5, AugmentConfig(num_copies=3, max_mlm_words=10_000), work) == 5
    with pytest.raises(ValueError, match="mlm_words"):
        examples_to_augment(5, config)
    out = augment_dataset(_dataset(), ("sentence1", "sentence2"), generator,
                          AugmentConfig(num_copies=3, replace_prob=0.5, seed=3, shard_size=2, batch_size=2,
                                        max_mlm_words=100), tmp_path)
    augmented = {row["source_index"] for row in out.to_list() if row["is_augmented"]}
    assert augmented and augmented <= {0, 1}
    assert sorted(row["source_index"] for row in out.to_list() if not row["is_augmented"]) == [0, 1, 2, 3, 4]
