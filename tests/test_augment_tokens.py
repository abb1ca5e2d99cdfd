"""TinyBERT augmentation of word-list columns (NER) on a tiny vocabulary: copies keep the word count and the labels,
the mask keeps entity words, the string algorithm's draws, determinism, resume, workers, label-safety statistics."""

import functools
import json
import random
import shutil

import datasets
import pytest
from transformers import BertTokenizer

from augment import (
    CandidateGenerator,
    TagMask,
    augment_dataset,
    augment_examples,
    load_stopwords,
    only_tags,
    replacement_stats,
    sample_copies,
    sample_word_copies,
    word_candidates,
)
from augment.tokens import word_spans
from distill.config import AugmentConfig
from distill.tasks import DataError
from tests.conftest import SPECIAL, WORDS, folder_identity, tiny_generator, tiny_masked_lm, tiny_vectors

LABELS = ("O", "B-person", "I-person", "B-work")
O, B, I, W = range(4)  # noqa: E741  (tag ids)
SENTENCES = [
    (["the", "movie", "was", "wonderful", "and", "the", "plot", "terrible", "!"], [O, B, I, O, O, O, O, O, O]),
    (["Great", "cast", ",", "fine", "story"], [B, I, O, O, W]),
    (["a", "boring", "film", "@paulwalk", "it's", "fun"], [O, W, W, O, O, O]),
    (["actor", "good"], [B, O]),
    (["very", "bad", "film"], [O, O, W]),
]


@pytest.fixture
def generator():
    return tiny_generator()


def _ner_dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"tokens": [s for s, _ in SENTENCES], "label": [t for _, t in SENTENCES]})


def _entity_words_unchanged(row: dict) -> bool:
    words, _ = SENTENCES[row["source_index"]]
    return all(new == old for new, old, tag in zip(row["tokens"], words, row["label"]) if tag != O)


def test_only_whole_alphabetic_words_are_candidates_and_candidates_are_single_words(generator):
    words = ["the", "movie", "@paulwalk", "it's", "New York", "", "wonderful", "plot"]
    assert word_spans(["ab", "", "c"]) == [(0, 2), (3, 3), (4, 5)]
    (found,) = word_candidates(generator, [words])
    # "@paulwalk" and "it's" split into several string words, "New York" holds a space, "" is no word, "the" a stop
    # word: none of them is a candidate.
    assert sorted(found) == [1, 6, 7]
    assert found[6] == ["marvellous", "superb"]  # several pieces: word-vector neighbours
    assert all(c.isalpha() and c in WORDS for i in (1, 7) for c in found[i])  # single pieces: the masked LM
    (masked,) = word_candidates(generator, [words], [[True] * 6 + [False, True]])
    assert sorted(masked) == [1, 7] and masked[1] == found[1]  # a masked-out word is no candidate, the rest the same


def test_non_word_neighbours_are_dropped_and_a_word_left_without_keeps_itself():
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    neighbours = {"wonderful": ["e-mail", "two words", "fine", "42"], "terrible": ["u.s.", "9/11"]}
    generator = CandidateGenerator(tiny_masked_lm(), tokenizer, lambda w: neighbours.get(w.lower(), []),
                                   load_stopwords(), num_candidates=8)
    (found,) = word_candidates(generator, [["wonderful", "terrible"]])
    assert found == {0: ["fine"], 1: ["terrible"]}
    copies = sample_word_copies(["wonderful", "terrible"], found, 4, 1.0, random.Random(0))
    assert copies == [["fine", "terrible"]] * 4


def test_a_plain_sentence_gives_the_copies_of_its_text_word_for_word(generator):
    words, _ = SENTENCES[0]  # every string word is a whole word of the list, every candidate alphabetic
    config = AugmentConfig(num_copies=12, replace_prob=0.5, seed=5)
    as_words = augment_examples([{"text": words}], [3], ("text",), generator, config)
    as_text = augment_examples([{"text": " ".join(words)}], [3], ("text",), generator, config)
    assert len(as_words) > 3
    assert [r["text"] for r in as_words] == [r["text"].split(" ") for r in as_text]
    candidates = {(0, 1): ["x", "y", "z"], (4, 5): ["u", "v"]}  # the draws of sample_copies, copy by copy
    expected = sample_copies("a . b", candidates, 20, 0.4, random.Random(7))
    copies = sample_word_copies(["a", ".", "b"], {0: ["x", "y", "z"], 2: ["u", "v"]}, 20, 0.4, random.Random(7))
    assert [" ".join(c) for c in copies] == expected


def test_copies_keep_word_count_and_labels_and_the_mask_keeps_entity_words(generator, tmp_path):
    config = AugmentConfig(num_copies=20, replace_prob=1.0, seed=0, shard_size=2)
    outside = augment_dataset(_ner_dataset(), ("tokens",), generator, config, tmp_path / "o",
                              replaceable=only_tags(LABELS)).to_list()
    anything = augment_dataset(_ner_dataset(), ("tokens",), generator, config, tmp_path / "all").to_list()
    originals = _ner_dataset().to_list()
    for rows in (outside, anything):
        for row in rows:
            source = originals[row["source_index"]]
            assert len(row["tokens"]) == len(source["tokens"]) and row["label"] == source["label"]
        stats = replacement_stats(originals, rows, LABELS)
        assert stats["aligned"] and stats["misaligned"] == [] and stats["num_examples"] == 5
        assert stats["num_copies"] == sum(r["is_augmented"] for r in rows) > 5
        assert stats["num_replaced"]["outside"] > 0
    assert all(_entity_words_unchanged(r) for r in outside)
    assert replacement_stats(originals, outside, LABELS)["num_replaced"]["entity"] == 0
    assert not all(_entity_words_unchanged(r) for r in anything)  # without the mask entity words change too
    entity_stats = replacement_stats(originals, anything, LABELS)
    assert entity_stats["num_replaced"]["entity"] > 0
    assert sum(entity_stats["num_replaced_by_tag"].values()) == sum(entity_stats["num_replaced"].values())
    # "@paulwalk" and "it's" (tagged O) are never replaced, with or without the mask.
    assert {tuple(r["tokens"][3:5]) for r in outside + anything if r["source_index"] == 2} == {("@paulwalk", "it's")}


def test_same_output_for_any_batch_and_shard_size_and_after_resume(generator, tmp_path):
    mask = only_tags(LABELS, ("O", "B-work"))
    config = AugmentConfig(num_copies=6, replace_prob=0.5, seed=3, shard_size=2, batch_size=2, max_examples=4)
    full = augment_dataset(_ner_dataset(), ("tokens",), generator, config, tmp_path / "a", "run", mask)
    assert full.features["tokens"] == datasets.List(datasets.Value("string"))  # list<string> through the shards
    rows = full.to_list()
    assert [r["is_augmented"] for r in rows if r["source_index"] == 4] == [False]  # beyond max_examples: kept
    generator.batch_size = 1
    other = AugmentConfig(num_copies=6, replace_prob=0.5, seed=3, shard_size=3, batch_size=1, max_examples=4)
    assert augment_dataset(_ner_dataset(), ("tokens",), generator, other, tmp_path / "b", "run", mask).to_list() == rows
    shards = sorted((tmp_path / "a" / "shards").glob("shard-*"))
    assert len(shards) == 3
    shutil.rmtree(shards[1])  # as if killed before the second shard was renamed into place
    first = folder_identity(shards[0])
    resumed = augment_dataset(_ner_dataset(), ("tokens",), generator, config, tmp_path / "a", "run", mask)
    assert resumed.to_list() == rows
    assert folder_identity(shards[0]) == first  # resumed at the missing shard: the finished one was not written again


def test_worker_processes_with_a_tag_mask_give_the_same_output(tmp_path):
    mask = only_tags(LABELS)
    one = augment_dataset(_ner_dataset(), ("tokens",), tiny_generator,
                          AugmentConfig(num_copies=4, replace_prob=0.5, seed=9, shard_size=2), tmp_path / "one",
                          replaceable=mask)
    two = augment_dataset(_ner_dataset(), ("tokens",), functools.partial(tiny_generator, 3),
                          AugmentConfig(num_copies=4, replace_prob=0.5, seed=9, shard_size=2, num_workers=2),
                          tmp_path / "two", replaceable=mask)
    assert two.to_list() == one.to_list()


def test_bad_word_lists_and_masks_are_errors(generator, tmp_path):
    config = AugmentConfig(num_copies=2)
    row = {"tokens": ["a", "movie"], "label": [O, O]}
    with pytest.raises(DataError, match=r"example 7: the replaceable mask has 1 flags for the 2 words"):
        augment_examples([row], [7], ("tokens",), generator, config, lambda r: [True])
    with pytest.raises(DataError, match=r"example 1: word 1 is None, not a string"):
        augment_examples([row, {**row, "tokens": ["a", None]}], [0, 1], ("tokens",), generator, config)
    with pytest.raises(DataError, match="expected a list of words, got str"):
        augment_examples([row, {**row, "tokens": "a movie"}], [0, 1], ("tokens",), generator, config)
    with pytest.raises(ValueError, match="one word-list column"):
        augment_examples([{"sentence": "a movie", "label": 1}], [0], ("sentence",), generator, config, lambda r: [True])
    strings = datasets.Dataset.from_dict({"sentence": ["a movie"], "label": [1]})
    with pytest.raises(ValueError, match="one word-list column"):
        augment_dataset(strings, ("sentence",), generator, config, tmp_path, replaceable=lambda r: [True])
    with pytest.raises(ValueError, match=r"tag\(s\) \['B-place'\] are not among the labels"):
        only_tags(LABELS, ("O", "B-place"))
    assert only_tags(LABELS, ("B-work", "O"), "tags") == TagMask("tags", (0, 3))
    assert TagMask("label", (O,))(row | {"label": [O, B]}) == [True, False]


def test_replacement_stats_by_hand():
    originals = [{"tokens": ["Ann", "saw", "a", "film"], "label": [B, O, O, O]}, {"tokens": ["ok"], "label": [O]}]
    rows = [
        {**originals[0], "source_index": 0, "is_augmented": False},
        {"tokens": ["Bob", "saw", "a", "movie"], "label": [B, O, O, O], "source_index": 0, "is_augmented": True},
        {"tokens": ["Ann", "saw", "a", "plot"], "label": [B, O, O, O], "source_index": 0, "is_augmented": True},
        {"tokens": ["Ann", "saw", "film"], "label": [B, O, O], "source_index": 0, "is_augmented": True},  # a word lost
        {"tokens": ["Ann", "saw", "a", "film"], "label": [O, O, O, O], "source_index": 0, "is_augmented": True},
        {**originals[1], "source_index": 1, "is_augmented": False},
    ]
    stats = replacement_stats(originals, rows, LABELS)
    assert stats["num_copies"] == 4 and stats["copies_per_example"] == 2.0 and stats["num_examples_augmented"] == 1
    assert stats["num_words"] == {"outside": 6, "entity": 2}  # the two aligned copies
    assert stats["num_replaced"] == {"outside": 2, "entity": 1}
    assert stats["replaced_rate"] == {"outside": 2 / 6, "entity": 0.5}
    assert stats["num_replaced_by_tag"] == {"O": 2, "B-person": 1, "I-person": 0, "B-work": 0}
    assert stats["misaligned"] == [3, 4] and not stats["aligned"]
    with pytest.raises(ValueError, match="source_index 5 is outside the 2 original rows"):
        replacement_stats(originals, [{**rows[1], "source_index": 5}], LABELS)


def test_augment_command_reads_a_word_list_file(tmp_path):
    from transformers import BertTokenizer as Tokenizer

    from distill.job.augmentation import run_augment
    from distill.config import PipelineConfig

    tokenizer = Tokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    tokenizer.save_pretrained(tmp_path / "mlm")
    tiny_masked_lm().save_pretrained(tmp_path / "mlm")
    tiny_vectors().save(str(tmp_path / "vectors.kv"))
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({"tokens": s, "label": t}) + "\n" for s, t in SENTENCES))
    config = PipelineConfig(output_dir=str(tmp_path / "o"))
    config.mlm.model = str(tmp_path / "mlm")
    config.augment = AugmentConfig(num_copies=4, replace_prob=1.0, word_vectors=str(tmp_path / "vectors.kv"))
    summary = run_augment(config, str(source), ["tokens"], device="cpu", replaceable=only_tags(LABELS))
    assert summary["num_rows"] > len(SENTENCES)
    rows = datasets.load_from_disk(str(next((tmp_path / "o" / "shards").glob("shard-*")))).to_list()
    assert replacement_stats(_ner_dataset().to_list(), rows, LABELS)["num_replaced"]["entity"] == 0
    config.output_dir = str(tmp_path / "all")
    assert run_augment(config, str(source), ["tokens"], device="cpu")["run_id"] != summary["run_id"]
