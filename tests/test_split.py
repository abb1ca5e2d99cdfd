"""The dev set's tuning and report halves (distill/tasks/split.py): a fixed rule, deterministic, disjoint, covering the
dev set, the same whatever the order or copy of the file; each half scored from the whole set's outputs; a setting
chosen on the tuning half (the multi-label threshold) is the one the report half is scored at."""

import hashlib

import datasets
import numpy as np
import pytest

from distill.tasks import get_task
from distill.tasks.base import summary_metrics
from distill.tasks.data import load_task_data
from distill.config import TaskConfig
from distill.tasks.evaluate import compute_metrics
from distill.tasks.split import REPORT, TUNING, HalfScorer, example_halves, half_indices, key_half
from tests.conftest import shared_data


def test_the_half_is_the_low_bit_of_the_first_byte_of_the_key_hash():
    for key in ("a charming and often affecting journey", "Yucaipa\tbought", "", "é"):
        first = hashlib.sha256(key.encode("utf-8")).digest()[0]
        assert key_half(key) == (TUNING if first % 2 == 0 else REPORT)
    assert key_half("x") == key_half("x")


def test_sst2_dev_splits_into_two_disjoint_halves_that_cover_it_about_evenly():
    spec = get_task("sst2")
    dev = load_task_data(TaskConfig(name="sst2", data_dir=str(shared_data("glue/SST-2"))), spec)["dev"]
    halves = half_indices(spec, dev)
    tuning, report = set(halves[TUNING]), set(halves[REPORT])
    assert not tuning & report and tuning | report == set(range(len(dev)))
    assert 0.45 < len(report) / len(dev) < 0.55  # 872 examples: a binomial share, sd 1.7%
    # the same examples in another order fall in the same halves: the rule reads the text, not the position
    order = np.random.default_rng(0).permutation(len(dev))
    shuffled = example_halves(spec, dev.select(order))
    assert [shuffled[i] for i in np.argsort(order)] == example_halves(spec, dev)


def test_a_pair_task_keys_both_texts_and_copies_of_an_example_share_a_half():
    spec = get_task("mrpc")
    rows = datasets.Dataset.from_dict({"sentence1": ["a b", "a b", "a"], "sentence2": ["c", "c", "b c"],
                                       "label": [0, 1, 1]})
    first, copy, moved = example_halves(spec, rows)
    assert first == copy
    assert spec.type.example_key(spec, rows[0]) != spec.type.example_key(spec, rows[2])  # "a b|c" is not "a|b c"


def _sst2_rows(n: int) -> datasets.DatasetDict:
    texts = [f"sentence number {i}" for i in range(n)]
    return datasets.DatasetDict({"dev": datasets.Dataset.from_dict({"sentence": texts, "label": [i % 2 for i in
                                                                                                 range(n)]})})


def test_each_half_is_scored_on_its_own_rows_of_the_whole_sets_outputs():
    spec, data = get_task("sst2"), _sst2_rows(40)
    labels = np.array(data["dev"]["label"])
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(40, 2))
    halves = example_halves(spec, data["dev"])
    scorer = HalfScorer(spec, data, "dev", list(labels), None, 32)
    scored = scorer.score(logits, list(labels), lambda o, g, c, s: compute_metrics(spec, o, g, c, s))
    predicted = logits.argmax(1)
    for half in (TUNING, REPORT):
        rows = [i for i, h in enumerate(halves) if h == half]
        assert scored[f"{half}/accuracy"] == pytest.approx(np.mean(predicted[rows] == labels[rows]))


def test_a_question_with_several_windows_falls_in_one_half_with_all_its_windows():
    spec = get_task("squad")
    labels = [{"example": 0}, {"example": 0}, {"example": 1}, {"example": 2}, {"example": 2}]
    assert spec.type.row_examples(labels) == [0, 0, 1, 2, 2]


def test_the_report_half_is_scored_at_the_threshold_the_tuning_half_chose():
    spec, n = get_task("goemotions"), 200
    texts = [f"text {i}" for i in range(n)]
    data = datasets.DatasetDict({"dev": datasets.Dataset.from_dict({"text": texts, "label": [[0]] * n})})
    halves = example_halves(spec, data["dev"])
    gold = np.zeros((n, spec.num_labels), dtype=np.float32)
    # the tuning half: label 0 on every other text at probability 0.3, absent from the others at 0.2, so its best
    # threshold lies above 0.2; the report half: label 0 on every text at 0.2 (its own best threshold would be at most
    # 0.2; at the tuning half's it predicts nothing there)
    negative = np.array([h == TUNING and i % 2 == 1 for i, h in enumerate(halves)])
    gold[~negative, 0] = 1
    probability = np.array([0.3 if h == TUNING and not neg else 0.2 for h, neg in zip(halves, negative)])
    logits = np.full((n, spec.num_labels), -9.0)
    logits[:, 0] = np.log(probability / (1 - probability))
    scorer = HalfScorer(spec, data, "dev", list(gold), None, 32)
    scored = scorer.score(logits, list(gold), lambda o, g, c, s: compute_metrics(spec, o, g, c, s))
    assert scored["tuning/threshold"] == scored["report/threshold"] > 0.2
    assert scored["tuning/micro_f1"] == pytest.approx(1.0)
    assert scored["report/micro_f1"] == 0.0  # chosen on the other half, not on itself
    on_itself = compute_metrics(spec, logits[np.array(halves) == REPORT], gold[np.array(halves) == REPORT])
    assert on_itself["micro_f1"] == pytest.approx(1.0) and on_itself["threshold"] <= 0.2
    assert on_itself["at_0.5/micro_f1"] == 0.0  # the fixed 0.5 figure beside it: nothing above 0.5


def test_the_seeds_summary_lists_the_report_half_first_then_dev_then_the_tuning_half():
    metrics = {"accuracy": 0.9, "f1": 0.8, "report/accuracy": 0.91, "report/f1": 0.81, "tuning/accuracy": 0.89,
               "tuning/f1": 0.79}
    assert summary_metrics(metrics) == ["report/accuracy", "report/f1", "accuracy", "f1", "tuning/accuracy",
                                        "tuning/f1"]
