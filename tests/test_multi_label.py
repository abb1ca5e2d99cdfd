"""Multi-label classification: GoEmotions and a user's files read with their label lists, the sigmoid prediction loss,
micro/macro F1 at a threshold chosen on dev, chance, and the whole pipeline shipping a student that
``pipeline("text-classification", top_k=None)`` serves."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, pipeline as hf_pipeline

from distill.config import TaskConfig, load_config
from distill.tasks import DataError, get_task, get_task_type
from distill.tasks.data import load_task_data, task_spec, tokenize
from distill.tasks.multi_label_classification import (
    GOEMOTIONS_LABELS,
    bce_soft_targets,
    constant_guess,
    multi_label_metrics,
)
from tests.conftest import shared_data, tiny_bert, tiny_job

KIND = "multi_label_classification"
TEXTS = ["the movie was good", "a bad film", "the plot was fun", "not a boring story", "the cast was great",
         "it is very bad", "a wonderful actor", "the story is fine"]
LABELS = ["joy;praise", "anger", "joy", "praise", "joy;praise", "anger;sad", "praise", ""]


def write_table(path, texts=TEXTS, labels=LABELS, separator=";"):
    rows = ["text,tags"] + [f'"{t}","{l.replace(";", separator)}"' for t, l in zip(texts, labels)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _own(tmp_path, **options):
    train = write_table(tmp_path / "train.csv")
    dev = write_table(tmp_path / "dev.csv", TEXTS[:6], LABELS[:6])
    return TaskConfig(name="tags", task_type=KIND, train_file=str(train), dev_file=str(dev), text_columns=["text"],
                      label_column="tags", options={"label_separator": ";", **options})


def test_goemotions_reads_the_shared_files_with_their_label_lists():
    data = load_task_data(TaskConfig(name="goemotions", data_dir=str(shared_data("multilabel/goemotions"))))
    spec = get_task("goemotions")
    assert (len(data["train"]), len(data["dev"])) == (43410, 5426)
    assert spec.label_names == GOEMOTIONS_LABELS and spec.type.name == KIND
    first = data["train"][0]  # "My favourite food is anything I didn't have to cook myself.\t27\teebbqej"
    assert first["text"].startswith("My favourite food") and first["label"] == [27]
    several = sum(len(labels) > 1 for labels in data["train"]["label"])
    assert 0.15 < several / len(data["train"]) < 0.17  # 16% of the rows have two or more labels


def test_goemotions_refuses_a_bad_id_an_empty_list_and_a_label_file_that_does_not_match(tmp_path):
    source = shared_data("multilabel/goemotions")
    folder = tmp_path / "go"
    folder.mkdir()
    (folder / "labels.txt").write_text((source / "labels.txt").read_text())
    good = "a fine day\t17\tid1\n"
    (folder / "dev.tsv").write_text(good)
    config = TaskConfig(name="goemotions", data_dir=str(folder))
    (folder / "train.tsv").write_text(good + "too far\t3,28\tid2\n")
    with pytest.raises(DataError, match=r"train.tsv, line 2: label '28' is not one of the 28 labels of goemotions"):
        load_task_data(config)
    (folder / "train.tsv").write_text(good + "no label\t\tid3\n")
    with pytest.raises(DataError, match=r"train.tsv, line 2: no label, and every text of goemotions has at least one"):
        load_task_data(config)
    (folder / "train.tsv").write_text(good)
    names = (source / "labels.txt").read_text().splitlines()
    (folder / "labels.txt").write_text("\n".join([names[1], names[0], *names[2:]]))
    with pytest.raises(DataError, match=r"labels.txt, line 1: label 'amusement' where goemotions has 'admiration'"):
        load_task_data(config)


def test_your_own_files_take_names_with_a_separator_and_refuse_an_unknown_label(tmp_path):
    config = _own(tmp_path)
    spec = task_spec(config)
    assert spec.label_names == ("anger", "joy", "praise", "sad")  # the distinct names of the training file, sorted
    data = load_task_data(config, spec)
    assert data["train"]["label"][:2] == [[1, 2], [0]] and data["train"]["label"][7] == []  # an empty list allowed
    write_table(tmp_path / "dev.csv", ["a film"], ["joy;happy"])
    with pytest.raises(DataError, match=r"dev.csv, line 2: label 'happy' is not one of the 4 labels of tags"):
        load_task_data(config, spec)
    write_table(tmp_path / "dev.csv", TEXTS[:6], LABELS[:6])
    strict = TaskConfig(**{**config.__dict__, "options": {"label_separator": ";", "allow_empty": False}})
    with pytest.raises(DataError, match=r"train.csv, line 9: no label"):
        load_task_data(strict, task_spec(strict))


def test_jsonl_label_lists_need_no_separator(tmp_path):
    rows = [{"text": t, "tags": l.split(";") if l else []} for t, l in zip(TEXTS, LABELS)]
    for name in ("train.jsonl", "dev.jsonl"):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = TaskConfig(name="tags", task_type=KIND, train_file=str(tmp_path / "train.jsonl"),
                        dev_file=str(tmp_path / "dev.jsonl"), text_columns=["text"], label_column="tags")
    data = load_task_data(config)
    assert data["dev"]["label"][5] == [0, 3]


def test_the_prediction_loss_is_binary_cross_entropy_to_the_teachers_sigmoid_by_hand():
    student, teacher = torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0, -1.0]])
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    by_hand = sum(-(sigmoid(t) * math.log(sigmoid(s)) + (1 - sigmoid(t)) * math.log(1 - sigmoid(s)))
                  for s, t in ((0.0, 1.0), (2.0, -1.0))) / 2
    assert bce_soft_targets(student, teacher).item() == pytest.approx(by_hand, rel=1e-6)
    kind, spec = get_task_type(KIND), get_task("goemotions")
    at_two = kind.prediction_loss(spec, student, teacher, {}, temperature=2.0, temperature_squared=True,
                                  hard_label_weight=0.0)
    assert at_two.item() == pytest.approx(4 * bce_soft_targets(student, teacher, 2.0).item(), rel=1e-6)
    gold = torch.tensor([[1.0, 0.0]])
    with_gold = kind.prediction_loss(spec, student, teacher, {"labels": gold}, temperature=1.0,
                                     temperature_squared=False, hard_label_weight=0.5)
    hard = torch.nn.functional.binary_cross_entropy_with_logits(student, gold).item()
    assert with_gold.item() == pytest.approx(by_hand + 0.5 * hard, rel=1e-6)
    assert bce_soft_targets(teacher, teacher).item() > 0  # the entropy of the targets: not 0, yet no gradient


def test_micro_and_macro_f1_at_the_threshold_that_scores_best_on_dev():
    gold = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0]])
    probabilities = np.array([[0.7, 0.2, 0.1], [0.6, 0.42, 0.2], [0.3, 0.1, 0.8], [0.1, 0.41, 0.05]])
    logits = np.log(probabilities / (1 - probabilities))
    metrics = multi_label_metrics(logits, gold, ("a", "b", "c"))
    # Below 0.45 and above 0.30 every gold label is predicted and nothing else: micro F1 1 from the first such
    # threshold, 0.35; at 0.5 (the usual default) the two "b" labels (0.42, 0.41) are missed: micro F1 2·3/(3+5) 0.75.
    assert metrics["threshold"] == 0.35 and metrics["micro_f1"] == 1.0 and metrics["macro_f1"] == 1.0
    assert [metrics[f"f1/{name}"] for name in "abc"] == [1.0, 1.0, 1.0]
    at_half = multi_label_metrics(logits - np.log(0.5 / 0.5), gold, ("a", "b", "c"))
    assert at_half["micro_f1"] == 1.0  # the same logits: the same choice
    gold[3] = [1, 0, 0]  # row 4's "b" is a false positive at 0.35, and row 4's "a" (0.1) is missed everywhere
    moved = multi_label_metrics(logits, gold, ("a", "b", "c"))
    assert moved["micro_f1"] < 1.0 and moved["macro_f1"] == pytest.approx(np.mean(
        [moved["f1/a"], moved["f1/b"], moved["f1/c"]]))


def test_chance_is_the_best_constant_label_set():
    spec = get_task("goemotions")
    neutral = GOEMOTIONS_LABELS.index("neutral")
    dev = [[neutral]] * 6 + [[0]] * 3 + [[0, 5]]
    guess = constant_guess(spec, dev)
    # every text "neutral": 6 right of 10 predicted, of 11 gold labels: micro F1 2·6 / (10 + 11); {admiration}: 8/21,
    # {admiration, caring}: 10/31
    assert guess["basis"] == "every text labelled {neutral}" and guess["value"] == pytest.approx(12 / 21)
    assert constant_guess(spec, [])["value"] == 0.0


def test_the_pipeline_ships_a_multi_label_student_that_pipeline_serves_with_every_label(tmp_path, tiny_tokenizer):
    config = _own(tmp_path)
    spec = task_spec(config)
    teacher = tiny_bert(seed=0, num_labels=4, problem_type="multi_label_classification",
                        id2label=dict(enumerate(spec.label_names)),
                        label2id={n: i for i, n in enumerate(spec.label_names)})
    path = tiny_job(tmp_path, teacher, tiny_tokenizer,
                    task={"name": "tags", "task_type": KIND, "train_file": config.train_file,
                          "dev_file": config.dev_file, "text_columns": ["text"], "label_column": "tags",
                          "options": {"label_separator": ";"}},
                    student={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                             "num_attention_heads": 4, "init": "teacher"},
                    distill={"temperature": 2.0, "temperature_squared": True},
                    export={"onnx": True, "int8": False})
    from distill.job.pipeline import run_pipeline

    report = run_pipeline(load_config(path))
    out = tmp_path / "run"
    assert set(report["models"]["student"]["dev"]) >= {"micro_f1", "macro_f1", "threshold", "f1/joy"}
    student = AutoModelForSequenceClassification.from_pretrained(out / "student")
    assert student.config.problem_type == "multi_label_classification" and student.config.num_labels == 4
    served = hf_pipeline("text-classification", model=str(out / "student"), top_k=None)("the movie was good")[0]
    assert sorted(label["label"] for label in served) == ["anger", "joy", "praise", "sad"]
    scores = [label["score"] for label in served]
    assert 0 < min(scores) and max(scores) < 1 and not math.isclose(sum(scores), 1.0, abs_tol=1e-3)  # sigmoids
    report_md = (out / "report.md").read_text()
    assert "Per-label F1 on dev" in report_md and "| joy |" in report_md and "micro_f1" in report_md
    card = (out / "student" / "README.md").read_text()
    assert "top_k=None" in card and "f1/joy" not in card
    export = json.loads((out / "student" / "onnx" / "export.json").read_text())
    assert export["files"]["model.onnx"]["same_prediction"] == 1.0
    encoded = tokenize(load_task_data(config, spec)["dev"], tiny_tokenizer, spec, 32)
    assert np.asarray(encoded["labels"]).shape == (6, 4)  # multi-hot per example


def test_augmented_copies_keep_every_label():
    """Word replacement changes words, not labels: each augmented copy carries its source's label list."""
    from augment.dataset import augment_examples
    from distill.config import AugmentConfig
    from distill.tasks.words import split_words

    class Swap:
        """A candidate generator that offers one fixed candidate for every word."""

        def candidates(self, texts, allowed=None):
            return [{span: ["cinema"] for span in split_words(text)} for text in texts]

    labels = [[1, 2], [0], []]
    examples = [{"text": text, "label": label} for text, label in zip(TEXTS[:3], labels)]
    rows = augment_examples(examples, [0, 1, 2], ("text",), Swap(), AugmentConfig(num_copies=2, replace_prob=1.0))
    copies = [row for row in rows if row["is_augmented"]]
    assert copies and all(row["text"] != TEXTS[row["source_index"]] for row in copies)
    assert all(row["label"] == labels[row["source_index"]] for row in rows)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_new_multi_label_head_starts_at_the_label_frequencies_of_the_training_set(family):
    """The teacher's new head predicts each label's training frequency before its first step (prior bias), for
    BERT's classifier and RoBERTa's classifier.out_proj alike; a label no example has starts low, not at -inf."""
    import datasets
    from transformers import AutoConfig

    from tests.conftest import tiny_bert_config

    spec = get_task("goemotions")
    kind = get_task_type(KIND)
    config = AutoConfig.for_model(family, **{k: v for k, v in tiny_bert_config().to_dict().items() if k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")},
        max_position_embeddings=70, **kind.head_config(spec))
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    rows = datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"], "label": [[27], [0, 27], [27], [3, 0]]})
    kind.init_head(spec, model, rows)
    ids = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    model.eval()
    with torch.no_grad():  # the bias alone: zero the weights of the output layer to read it as a probability
        output = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 28][-1]
        output.weight.zero_()
        probabilities = torch.sigmoid(model(**ids).logits[0])
    expected = torch.full((28,), 1e-4)
    expected[[27, 0, 3]] = torch.tensor([0.75, 0.5, 0.25])
    torch.testing.assert_close(probabilities, expected, rtol=1e-4, atol=1e-6)
