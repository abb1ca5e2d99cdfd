"""Each task metric against a value worked out by hand (the metrics are scikit-learn's; these pin what GLUE means
by them: F1 of the positive class, MCC 0 when undefined, correlations 0 for constant predictions)."""

import numpy as np
import pytest

from distill.tasks import get_task
from distill.tasks.sequence_classification import accuracy, f1, matthews_corrcoef
from distill.tasks.evaluate import compute_metrics


def test_accuracy_and_f1_of_the_positive_class():
    predictions, labels = np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])
    assert accuracy(predictions, labels) == 0.75
    assert f1(predictions, labels) == pytest.approx(0.8)  # tp 2, fp 1, fn 0: 2·2 / (2·2 + 1 + 0)
    assert f1(np.array([0, 0]), np.array([1, 0])) == 0.0  # no true positives


def test_matthews_correlation():
    # tp 2, fp 1, tn 1, fn 1: (2·1 − 1·1) / sqrt(3·3·2·2) = 1/6
    assert matthews_corrcoef(np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])) == pytest.approx(1 / 6)
    assert matthews_corrcoef(np.array([1, 1]), np.array([1, 0])) == 0.0  # undefined: one predicted class


def test_pearson_and_spearman_for_regression_tasks():
    stsb = get_task("stsb")
    # x = 1, 2, 3; y = 1, 2, 4: cov·3 = 3, |x − x̄| = √2, |y − ȳ| = √42 / 3, r = 9 / √84
    metrics = compute_metrics(stsb, np.array([[1.0], [2.0], [3.0]]), np.array([1.0, 2.0, 4.0]))
    assert metrics["pearson"] == pytest.approx(9 / np.sqrt(84))
    assert metrics["spearmanr"] == pytest.approx(1.0)
    # ranks 1, 3, 2, 4 against 1, 2, 3, 4: Σd² = 2, ρ = 1 − 6·2 / (4·15) = 0.8
    assert compute_metrics(stsb, np.array([10.0, 30.0, 20.0, 40.0]), np.array([1.0, 2.0, 3.0, 4.0]))["spearmanr"] == \
        pytest.approx(0.8)
    constant = compute_metrics(stsb, np.array([2.0, 2.0, 2.0]), np.array([1.0, 2.0, 4.0]))
    assert constant == {"pearson": 0.0, "spearmanr": 0.0}  # undefined correlation, not NaN


def test_each_task_scores_its_glue_metrics_from_logits():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])  # predicts 0, 1, 1, 0, 1
    labels = np.array([0, 1, 0, 1, 1])
    assert compute_metrics(get_task("cola"), logits, labels) == {"matthews_corrcoef": pytest.approx(1 / 6)}
    assert compute_metrics(get_task("mrpc"), logits, labels) == {"accuracy": 0.6, "f1": pytest.approx(2 / 3)}
    assert compute_metrics(get_task("qqp"), logits, labels).keys() == {"accuracy", "f1"}
    three = np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]])
    assert compute_metrics(get_task("mnli"), three, np.array([0, 1, 1])) == {"accuracy": pytest.approx(2 / 3)}
