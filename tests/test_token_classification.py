"""Token classification as a task type: CoNLL reading, label alignment to word pieces, the per-token prediction loss,
seqeval's entity metrics, padding, per-token logits, and the whole pipeline on a tiny NER teacher."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertForTokenClassification

from distill.config import TaskConfig, load_config
from distill.tasks import DataError, TASKS
from distill.tasks.data import load_task_data, task_spec, tokenize
from distill.tasks.evaluate import predict
from distill.tasks import get_task_type
from distill.tasks.token_classification import (
    IGNORE,
    TokenCollator,
    align_labels,
    entity_metrics,
    read_conll,
    token_soft_cross_entropy,
)
from tests.conftest import shared_data, tiny_bert_config, tiny_job

TAGS = ("O", "B-person", "I-person", "B-location", "I-location")
SENTENCES = [  # words from the tiny vocabulary of conftest; "wonderful" is two pieces, "terrible" two
    (["the", "actor", "was", "wonderful"], ["O", "B-person", "O", "O"]),
    (["a", "movie", "film", "is", "terrible"], ["O", "B-location", "I-location", "O", "O"]),
    (["the", "cast", "and", "the", "actor"], ["O", "B-person", "O", "O", "B-person"]),
    (["it", "is", "a", "fun", "story", "!"], ["O", "O", "O", "O", "O", "O"]),
]


def write_conll(path: Path, sentences=SENTENCES, separator: str = "\n") -> Path:
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + separator
                            for words, tags in sentences), encoding="utf-8")
    return path


def tiny_ner_teacher(seed: int = 0) -> BertForTokenClassification:
    torch.manual_seed(seed)
    config = tiny_bert_config(num_labels=len(TAGS), id2label=dict(enumerate(TAGS)),
                              label2id={t: i for i, t in enumerate(TAGS)})
    return BertForTokenClassification(config).eval()


def test_conll_sentences_split_on_blank_and_tab_only_lines_and_tags_map_to_ids(tmp_path):
    path = tmp_path / "train.conll"
    text = "-DOCSTART-\tO\n\nthe\tO\nactor\tB-person\n\t\nwonderful\tO\n \n\na\tO\nmovie\tB-location\n"
    path.write_text(text, encoding="utf-8")  # WNUT-17 separates some sentences by a line holding only a tab
    data = read_conll(path, TAGS)
    assert data["tokens"] == [["the", "actor"], ["wonderful"], ["a", "movie"]]
    assert data["label"] == [[0, 1], [0], [0, 3]]
    # Columns split at tabs and spaces, not at a no-break space inside a word; runs of spaces are one separator.
    path.write_text("10\u00a0000\tO\nthe   \t B-person\r\n", encoding="utf-8")
    assert read_conll(path, TAGS)["tokens"] == [["10\u00a0000", "the"]] and read_conll(path, TAGS)["label"] == [[0, 1]]


def test_a_line_with_another_column_count_than_the_files_is_refused_with_its_line(tmp_path):
    # A word holding a space is two columns: "New York B-location" was read as the word "New" tagged B-location.
    path = tmp_path / "spaced.conll"
    path.write_text("the\tO\nactor\tB-person\n\nNew York B-location\nis\tO\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"spaced.conll, line 4: 'New York B-location' has 3 columns where the file's "
                                        r"lines have 2; a word holding a space is read as two columns"):
        read_conll(path, TAGS)
    # The file's count is the one most of its lines have: a four-column (CoNLL-2003) file short of a column.
    conll2003 = tmp_path / "conll2003.conll"
    conll2003.write_text("-DOCSTART- -X- -X- O\n\nthe DT B-NP O\nactor NN I-NP B-person\nwas VBD O\n",
                         encoding="utf-8")
    with pytest.raises(DataError, match=r"conll2003.conll, line 5: 'was VBD O' has 3 columns where the file's lines "
                                        r"have 4; a column is missing"):
        read_conll(conll2003, TAGS)
    conll2003.write_text("-DOCSTART- -X- -X- O\n\nthe DT B-NP O\nactor NN I-NP B-person\n", encoding="utf-8")
    assert read_conll(conll2003, TAGS)["label"] == [[0, 1]]  # the tag is the last column


def test_conll_errors_name_the_file_line_and_tag(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("the\tO\nactor\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.conll, line 2: 'actor' has no tag"):
        read_conll(bad, TAGS)
    latin1 = tmp_path / "latin1.conll"
    latin1.write_bytes("caf\u00e9\tO\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.conll: not UTF-8 text \(byte 3\); save the file as UTF-8"):
        read_conll(latin1, TAGS)
    # A byte-order mark (Windows editors write one) is not part of the first word: -DOCSTART- is still skipped.
    marked = tmp_path / "marked.conll"
    marked.write_bytes("-DOCSTART-\tO\n\nthe\tO\n".encode("utf-8-sig"))
    assert read_conll(marked, TAGS)["tokens"] == [["the"]]
    typo = write_conll(tmp_path / "typo.conll", [(["the", "actor"], ["O", "B-person"]),
                                                  (["a", "cast"], ["O", "B-persn"])])
    with pytest.raises(DataError, match=r"typo.conll, line 5: tag 'B-persn' is not among the task's labels"):
        read_conll(typo, TAGS)


def test_the_first_piece_of_a_word_carries_its_label_and_the_rest_are_not_scored(tiny_tokenizer):
    assert align_labels([None, 0, 1, 1, 2, None], [5, 6, 7]) == [IGNORE, 5, 6, IGNORE, 7, IGNORE]
    spec = TaskSpecFor()
    encoded = tokenize(_dataset(), tiny_tokenizer, spec, 32)
    pieces = tiny_tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])
    assert pieces == ["[CLS]", "the", "actor", "was", "wonder", "##ful", "[SEP]"]
    assert encoded[0]["labels"] == [IGNORE, 0, 1, 0, 0, IGNORE, IGNORE]


def test_a_byte_level_tokenizer_gets_the_pieces_of_running_text(tiny_roberta_tokenizer):
    """RoBERTa-style tokenizers need a leading space on every pre-split word (add_prefix_space), else "movie" after
    another word is tokenized as if it began the text."""
    import datasets

    data = datasets.Dataset.from_dict({"tokens": [["the", "movie", "was", "good"]], "label": [[0, 1, 0, 0]]})
    encoded = tokenize(data, tiny_roberta_tokenizer, TaskSpecFor(), 32)
    pieces = tiny_roberta_tokenizer.convert_ids_to_tokens(encoded[0]["input_ids"])
    running = tiny_roberta_tokenizer.convert_ids_to_tokens(tiny_roberta_tokenizer(" the movie was good")["input_ids"])
    assert pieces == running and "Ġmovie" in pieces
    assert [label for label in encoded[0]["labels"] if label != IGNORE] == [0, 1, 0, 0]


def test_words_past_the_length_limit_are_counted_and_not_scored(tiny_tokenizer, caplog):
    encoded = tokenize(_dataset(), tiny_tokenizer, TaskSpecFor(), 5)
    assert encoded[1]["labels"] == [IGNORE, 0, 3, 4, IGNORE]  # [CLS] a movie film [SEP]: "is terrible" cut
    assert "8 words of 4 sentences fell past task.max_seq_length=5" in caplog.text


def test_words_the_tokenizer_makes_nothing_of_are_counted_apart_from_cut_words(tiny_tokenizer, caplog):
    import datasets

    ids = {t: i for i, t in enumerate(TAGS)}
    # U+FE0F (a variation selector, as after an emoji in WNUT-17) is stripped with the accents: no word piece
    rows = datasets.Dataset.from_dict({"tokens": [["the", "\ufe0f", "actor"], ["a", "movie", "\ufe0f"]],
                                       "label": [[ids["O"], ids["O"], ids["B-person"]], [0, 3, 0]]})
    encoded = tokenize(rows, tiny_tokenizer, TaskSpecFor(), 64)
    assert [label for label in encoded[0]["labels"] if label != IGNORE] == [0, 1]  # "the", "actor"
    assert "2 words of 2 sentences are no word piece in this tokenizer" in caplog.text
    assert "fell past" not in caplog.text
    caplog.clear()
    tokenize(rows, tiny_tokenizer, TaskSpecFor(), 3)  # [CLS] the [SEP]: "actor" cut; [CLS] a [SEP]: "movie" cut
    assert "2 words of 2 sentences fell past task.max_seq_length=3" in caplog.text
    assert "2 words of 2 sentences are no word piece" in caplog.text


def test_a_batch_with_no_scored_piece_is_a_zero_loss_not_a_lost_one():
    """The prediction term's "inputs differ" flag reads the scored pieces only: the teacher's padded logits are zeros
    and differ from the student's everywhere, and a batch with nothing scored has loss 0 by definition, which must
    not stop training as a loss lost to rounding would."""
    from types import SimpleNamespace

    from distill.method.terms import LOSS_TERMS, ModelOutputs, TeacherOutputs

    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 3), torch.zeros(2, 4, 3)
    objective = SimpleNamespace(head=get_task_type("token_classification").prediction_head(TASKS["wnut_17"]),
                                temperature=1.0, temperature_squared=False, hard_label_weight=0.0)
    term = LOSS_TERMS["prediction"]

    def compute(labels):
        outputs = TeacherOutputs(None, teacher, term.teacher_reads([1]))
        return term.compute(objective, ModelOutputs(student, (), (), torch.ones(2, 4)), outputs, {"labels": labels})

    nothing = compute(torch.full((2, 4), IGNORE))
    assert nothing.loss.item() == 0.0 and not nothing.inputs_differ
    one = compute(torch.tensor([[IGNORE, 1, IGNORE, IGNORE], [IGNORE] * 4]))
    assert one.loss.item() > 0 and one.inputs_differ


def test_the_token_loss_averages_over_scored_pieces_and_ignores_the_rest():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    labels = torch.tensor([[IGNORE, 1, 0, IGNORE], [IGNORE, 2, IGNORE, IGNORE]])
    scored = [(0, 1), (0, 2), (1, 1)]
    by_hand = sum(-(torch.softmax(teacher[b, t] / 2, -1) * torch.log_softmax(student[b, t] / 2, -1)).sum()
                  for b, t in scored) / len(scored)
    loss = token_soft_cross_entropy(student, teacher, labels, temperature=2.0)
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    moved = student.clone()
    moved[labels == IGNORE] += 100.0  # padding, [CLS]/[SEP] and continuations do not count
    assert token_soft_cross_entropy(moved, teacher, labels, 2.0).item() == pytest.approx(loss.item(), rel=1e-6)
    kind = get_task_type("token_classification")
    with_hard = kind.prediction_loss(TASKS["wnut_17"], student, teacher, {"labels": labels}, temperature=2.0,
                                     temperature_squared=True, hard_label_weight=0.5)
    hard = torch.nn.functional.cross_entropy(student[[0, 0, 1], [1, 2, 1]], torch.tensor([1, 0, 2]))
    assert with_hard.item() == pytest.approx(4 * loss.item() + 0.5 * hard.item(), rel=1e-5)


def test_entity_metrics_score_by_the_standard_convention_with_strict_iob2_beside():
    # Gold: one person (words 1-2) and one location (word 4). The prediction finds the person with a wrong end and
    # the location right: 1 of 2 entities found exactly, 1 of 2 predicted entities right, by both conventions.
    gold = np.array([IGNORE, 1, 2, 0, 3, IGNORE])
    predicted = np.array([0, 1, 0, 0, 3, 0])
    logits = np.eye(len(TAGS))[predicted]
    metrics = entity_metrics([logits], [gold], TAGS)
    assert metrics == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.75,
                                     "precision_strict": 0.5, "recall_strict": 0.5, "f1_strict": 0.5,
                                     # Per entity type: the location found, the person not.
                                     "type/location/precision": 1.0, "type/location/recall": 1.0,
                                     "type/location/f1": 1.0, "type/person/precision": 0.0,
                                     "type/person/recall": 0.0, "type/person/f1": 0.0})
    # An entity that opens with I- (I-person I-person, then B-location): conlleval and seqeval's default mode count
    # it, so both entities are found (F1 1); strict IOB2 drops it (1 of 2 found, 1 predicted: F1 2/3).
    orphan = np.eye(len(TAGS))[[0, 2, 2, 0, 3, 0]]
    both = entity_metrics([orphan], [gold], TAGS)
    assert both["f1"] == 1.0 and both["f1_strict"] == pytest.approx(2 / 3)
    # Tagging every word O finds no entity: F1 0.
    everything_o = np.eye(len(TAGS))[[0] * len(gold)]
    assert entity_metrics([everything_o], [gold], TAGS)["f1"] == 0.0


def test_surface_form_and_unseen_entity_f1():
    """WNUT-17's surface-form F1 counts each unique (string, type) once; the seen/unseen split puts each mention,
    gold or predicted, in the part its string (case-folded) falls in, and scores each part as the standard scorer."""
    # Three sentences: "Paris" (location) twice and "Zorblax Inc" (person here, to test the type) once in gold.
    words = [["I", "love", "Paris"], ["Paris", "again"], ["Zorblax", "Inc", "rocks"]]
    gold = [np.array([0, 0, 3]), np.array([3, 0]), np.array([1, 2, 0])]
    # The model finds Paris in sentence 1 only, and tags "rocks" as a person (a false positive, unseen).
    predicted = [np.array([0, 0, 3]), np.array([0, 0]), np.array([0, 0, 1])]
    logits = [np.eye(len(TAGS))[p] for p in predicted]
    metrics = entity_metrics(logits, gold, TAGS, words=words, train_surfaces={"paris"})
    # Mentions: gold 3, predicted 2, right 1: P 1/2, R 1/3.
    assert metrics["f1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))
    # Surface forms: gold {(Paris, location), (Zorblax Inc, person)}, predicted {(Paris, location), (rocks,
    # person)}, right {(Paris, location)}: P 1/2, R 1/2.
    assert metrics["surface/f1"] == pytest.approx(0.5)
    # Seen (string "paris"): gold 2 mentions, predicted 1, right 1: P 1, R 1/2, F1 2/3.
    assert (metrics["seen/precision"], metrics["seen/recall"]) == (1.0, 0.5)
    assert metrics["seen/f1"] == pytest.approx(2 / 3) and metrics["seen/entities"] == 2.0
    # Unseen: gold Zorblax Inc, predicted rocks: none right.
    assert metrics["unseen/f1"] == 0.0 and metrics["unseen/entities"] == 1.0
    assert metrics["unseen/precision"] == 0.0
    # Case-folded on both sides: a training entity "PARIS" (entity_surfaces folds it) makes the same mentions seen.
    import datasets

    from distill.tasks.token_classification import entity_surfaces

    train = datasets.Dataset.from_dict({"tokens": [["PARIS", "is", "Zorblax"]], "label": [[3, 0, 0]]})
    assert entity_surfaces(train, TAGS) == {"paris"}
    assert entity_metrics(logits, gold, TAGS, words=words, train_surfaces=entity_surfaces(train, TAGS))[
        "seen/entities"] == 2
    shouted = [[w.upper() for w in sentence] for sentence in words]  # and a dev "PARIS" is the training "paris"
    assert entity_metrics(logits, gold, TAGS, words=shouted, train_surfaces={"paris"})["seen/entities"] == 2
    # Without the training entities, no split; words that do not match the labels are refused.
    assert "seen/f1" not in entity_metrics(logits, gold, TAGS, words=words)
    with pytest.raises(ValueError, match="sentence 1: 1 words for 2 scored labels"):
        entity_metrics(logits, gold, TAGS, words=[words[0], ["Paris"], words[2]])


def test_the_named_task_reports_both_scorers_and_the_unseen_split(tiny_tokenizer):
    """Scored through the task type with the context it reads from the data: the words come from the tokenizer's
    word ids (a word past task.max_seq_length is not scored), the training entities from the train split."""
    import datasets

    spec = TASKS["wnut_17"]
    names = spec.label_names
    train = datasets.Dataset.from_dict({"tokens": [["visit", "paris", "now"]],
                                        "label": [[0, names.index("B-location"), 0]]})
    dev = datasets.Dataset.from_dict({"tokens": [["paris", "and", "rome"], ["rome", "visit", "now", "paris"]],
                                      "label": [[names.index("B-location"), 0, names.index("B-location")],
                                                [names.index("B-location"), 0, 0, names.index("B-location")]]})
    data = datasets.DatasetDict({"train": train, "validation": dev})
    kind = get_task_type("token_classification")
    # Five pieces: [CLS] + 3 words + [SEP]; the second sentence loses its last word ("paris") to the cut.
    context = kind.metric_context(spec, data, "validation", tiny_tokenizer, 5)
    assert context[0] == [["paris", "and", "rome"], ["rome", "visit", "now"]] and context[1] == {"paris"}
    encoded = tokenize(dev, tiny_tokenizer, spec, 5)
    labels = encoded["labels"]
    # A model that tags every scored word B-location: finds paris, rome, rome (3 right) and and/visit/now (wrong).
    outputs = [np.eye(len(names))[[names.index("B-location")] * len(row)] for row in labels]
    metrics = kind.compute_metrics(spec, outputs, labels, context)
    assert set(spec.metrics) <= set(metrics) and metrics["unseen/entities"] == 2.0  # rome twice
    assert metrics["seen/recall"] == 1.0 and metrics["unseen/recall"] == 1.0
    assert metrics["seen/precision"] == 1.0 and metrics["unseen/precision"] == pytest.approx(2 / 5)
    sections = kind.report_sections(spec, {"teacher": metrics, "student": metrics})
    assert "| unseen in training (2 mentions) | 0.5714 | 0.5714 |" in sections[0]


def test_chance_is_the_best_constant_tag_on_the_dev_labels():
    """Chance, as the guard-rail and the report read it: the best one tag for every word. Gold: person (s1 w1),
    location (s1 w3), person, person (s2): every word B-person finds 3 of the 4 entities among its 5, F1 2/3;
    B-location finds 1 (F1 2/9); O and the I- tags find none."""
    spec = task_spec(TaskConfig(name="ner", task_type="token_classification", train_file="unused.conll",
                                dev_file="unused.conll", label_names=list(TAGS)))
    kind = get_task_type("token_classification")
    dev = [[1, 0, 3], [1, 1]]
    found = kind.chance(spec, dev)
    person = [np.eye(len(TAGS))[[1] * len(s)] for s in dev]
    assert found["value"] == pytest.approx(2 / 3) == entity_metrics(person, [np.array(s) for s in dev], TAGS)["f1"]
    assert found["basis"] == "every word tagged 'B-person'" and found["metric"] == "f1"
    # The teacher's bar is chance + 0.05: an F1 of 0.70 is refused on these labels.
    from teachers.finetune import check_teacher_quality
    from teachers.models import ModelError

    with pytest.raises(ModelError, match=r"chance is 0.6667, every word tagged 'B-person'"):
        check_teacher_quality({"f1": 0.70, "precision": 0.7, "recall": 0.7, "accuracy": 0.9}, spec, None, "t", dev)
    # Where no entity is one word long, no constant tag finds one: 0, every word tagged O.
    assert kind.chance(spec, [[1, 2, 0], [0, 3, 4]]) == {"metric": "f1", "value": 0.0,
                                                          "basis": "every word tagged O (no entity found)"}
    assert kind.chance(TASKS["wnut_17"])["value"] == 0.0  # no dev labels given: every word O
    # Where every sentence is one entity, tagging every word I-person finds them all (it opens an entity under the
    # standard scorer), and B-person none of the two-word ones: chance 1.
    assert kind.chance(spec, [[1, 2], [1, 2]]) == {"metric": "f1", "value": 1.0,
                                                    "basis": "every word tagged 'I-person'"}


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_collator_pads_labels_and_teacher_logits_on_the_tokenizers_side(tiny_tokenizer, side):
    tiny_tokenizer.padding_side = side
    features = [{"input_ids": [2, 5, 3], "attention_mask": [1, 1, 1], "labels": [IGNORE, 1, IGNORE],
                 "teacher_logits": [[1.0, 2.0]] * 3},
                {"input_ids": [2, 3], "attention_mask": [1, 1], "labels": [IGNORE, IGNORE],
                 "teacher_logits": [[3.0, 4.0]] * 2}]
    batch = TokenCollator(tiny_tokenizer)(features)
    assert batch["labels"].tolist() == [[IGNORE, 1, IGNORE], [IGNORE, IGNORE, IGNORE]]
    short = batch["teacher_logits"][1]
    assert short.tolist() == ([[3.0, 4.0]] * 2 + [[0.0, 0.0]] if side == "right" else [[0.0, 0.0]] + [[3.0, 4.0]] * 2)
    assert batch["attention_mask"][1].tolist() == ([1, 1, 0] if side == "right" else [0, 1, 1])


def test_predict_gives_one_row_per_real_token_in_dataset_order(tiny_tokenizer):
    model = tiny_ner_teacher()
    encoded = tokenize(_dataset(), tiny_tokenizer, TaskSpecFor(), 32)
    logits = predict(model, encoded, tiny_tokenizer, task_type=get_task_type("token_classification"), device="cpu",
                     batch_size=3)
    assert [row.shape for row in logits] == [(len(ids), len(TAGS)) for ids in encoded["input_ids"]]
    alone = model(input_ids=torch.tensor([encoded[1]["input_ids"]])).logits[0].detach().numpy()
    np.testing.assert_allclose(logits[1], alone, atol=1e-5)


def test_wnut17_reads_the_shared_conll_files():
    folder = shared_data("ner/wnut17")
    data = load_task_data(TaskConfig(name="wnut_17", data_dir=str(folder)))  # and their tags are IOB2
    assert (len(data["train"]), len(data["dev"])) == (3394, 1009)
    assert data["train"][0]["tokens"][:3] == ["@paulwalk", "It", "'s"]


def test_wnut17_reads_the_hub_layout(monkeypatch):
    import datasets

    def fake_load_dataset(name):
        assert name == "wnut_17"
        split = datasets.Dataset.from_dict({"id": ["0"], "tokens": [["Empire", "State"]], "ner_tags": [[7, 8]]})
        return datasets.DatasetDict(train=split, validation=split, test=split)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("distill.hub.hub_unreachable", lambda *args, **kwargs: None)
    hub = load_task_data(TaskConfig(name="wnut_17", source="hub"))
    assert hub["dev"].column_names == ["tokens", "label"] and hub["dev"][0]["label"] == [7, 8]


def test_the_pipeline_distils_a_token_classifier_that_serves_entities(tmp_path, tiny_tokenizer, capsys):
    """The whole job on a tiny NER teacher and CoNLL files: every stage, a student with the teacher's head whose
    saved checkpoint runs in pipeline("token-classification"), a card with the right pipeline tag, ONNX files that
    agree with PyTorch per token; benchmark and export of its stage folders read the run's task, and refuse another
    task's with one line."""
    from transformers import pipeline as hf_pipeline

    from distill.job.pipeline import run_pipeline

    data = tmp_path / "data"
    data.mkdir()
    write_conll(data / "train.conll", SENTENCES * 4)
    write_conll(data / "dev.conll", SENTENCES)
    path = tiny_job(tmp_path, tiny_ner_teacher(), tiny_tokenizer,
                    task={"name": "ner", "task_type": "token_classification", "train_file": str(data / "train.conll"),
                          "dev_file": str(data / "dev.conll"), "label_names": list(TAGS)},
                    student={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                             "num_attention_heads": 4, "init": "teacher"},
                    export={"onnx": True, "int8": False})
    report = run_pipeline(load_config(str(path)))
    out = tmp_path / "run"
    dev = report["models"]["student"]["dev"]
    assert {key for key in dev if "/" not in key} == {"f1", "f1_strict", "precision", "recall", "accuracy"}
    assert {"surface/f1", "seen/f1", "unseen/f1"} <= set(dev)  # read with the run's own data and tokenizer
    assert "| unseen in training (" in (tmp_path / "run" / "report.md").read_text()
    student = out / "student"
    assert json.loads((student / "config.json").read_text())["architectures"] == ["BertForTokenClassification"]
    cached = json.loads((out / "teacher_logits" / "stage.json").read_text())
    assert cached["num_rows"] == 16
    # Served as scored: the card's pipeline ("first") tags each word by its first piece, the only piece the loss
    # and the entity scores read, so the words inside its entities are those whose first piece is not tagged O.
    words = ["the", "actor", "was", "wonderful"]  # "wonderful" is two pieces
    tag = hf_pipeline("token-classification", model=str(student), aggregation_strategy="first")
    found = tag(" ".join(words))
    assert all({"entity_group", "word", "start", "end"} <= set(e) for e in found)
    model = BertForTokenClassification.from_pretrained(student).eval()
    encoded = tag.tokenizer(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        predicted = model(**encoded).logits[0].argmax(-1).tolist()
    word_ids = encoded.word_ids()
    first_piece = {w: predicted[k] for k, w in enumerate(word_ids) if w is not None and w != word_ids[k - 1]}
    tagged = {w for w, tag_id in first_piece.items() if model.config.id2label[tag_id] != "O"}
    assert tagged, "the student tags every word O: nothing to compare the served entities with"
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words))]
    inside = {i for i, start in enumerate(starts) for e in found if e["start"] <= start < start + len(words[i])
              <= e["end"]}
    assert inside == tagged
    card = (student / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card and 'pipeline("token-classification"' in card
    export = json.loads((student / "onnx" / "export.json").read_text())
    assert export["files"]["model.onnx"]["same_prediction"] == 1.0
    assert export["files"]["model.onnx"]["max_abs_logit_difference"] < 1e-3

    import run_distill

    sets = [a for s in ("benchmark.batch_sizes=[1]", "benchmark.seq_lengths=[8]", "benchmark.num_warmup=1",
                        "benchmark.min_repeats=1", "benchmark.max_repeats=1", "benchmark.memory=false")
            for a in ("--set", s)]
    bench = ["benchmark", "--teacher", str(out / "teacher"), "--student", str(student), "--no-compress", *sets]
    capsys.readouterr()
    assert run_distill.main([*bench, "--output-dir", str(tmp_path / "bench")]) == 0
    assert f"config: {out / 'config.json'}, the config the teacher was made with" in capsys.readouterr().err
    setup = json.loads((tmp_path / "bench" / "benchmark.json").read_text())["setup"]
    assert (setup["task"], setup["metric"]) == ("ner", "report/f1")  # on the dev set's report half
    refused = {"benchmark": ([*bench, "--config", "sst2_minilm.yaml", "--output-dir", str(tmp_path / "other")],
                             f"--teacher {out / 'teacher'}"),
               "export": (["export", "--student", str(student), "--config", "sst2_minilm.yaml"],
                          f"--student {student}")}
    for command, role in refused.values():
        assert run_distill.main(command) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert "Traceback" not in err and len(errors) == 1, err
        assert errors[0].startswith(
            f"error: {role} is a token classifier (BertForTokenClassification, 5 labels ['O', 'B-person', 'I-person', "
            "'B-location', 'I-location']) and task sst2 needs a sequence classifier of 2 (negative, positive): it was "
            "made for another task; give the config of the run that made it"), errors[0]

    # A finished run scored by an older version (no f1_strict; its f1 another scorer's) is scored again from the
    # saved models when the job runs again, and the stage record updated: the report never mixes two scorers.
    record = json.loads((out / "student" / "stage.json").read_text())
    stale = {**record, "dev": {"f1": 0.123, "precision": 0.5, "recall": 0.5, "accuracy": 0.5}}
    (out / "student" / "stage.json").write_text(json.dumps(stale))
    again = run_pipeline(load_config(str(path)))
    assert again["models"]["student"]["dev"] == pytest.approx(dev)
    updated = json.loads((out / "student" / "stage.json").read_text())
    assert updated["dev"] == pytest.approx(dev) and updated.pop("rescored") is True
    assert {**updated, "dev": None} == {**record, "dev": None}


def test_a_teacher_fine_tuned_with_selection_is_scored_with_the_types_context(tmp_path, tiny_tokenizer):
    """The fine-tuned teacher's dev record is the kept weights' selection score: it holds surface-form and unseen-entity
    F1 as the student's evaluation does, so the report and the seeds summary compare the two on them."""
    from teachers.finetune import finetune_teacher

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    write_conll(data_dir / "train.conll", SENTENCES * 4)
    write_conll(data_dir / "dev.conll", SENTENCES)
    encoder = tmp_path / "encoder"
    tiny_ner_teacher().bert.save_pretrained(encoder)
    tiny_tokenizer.save_pretrained(encoder)
    config = load_config(tiny_job(tmp_path, tiny_ner_teacher(), tiny_tokenizer, task={
        "name": "ner", "task_type": "token_classification", "train_file": str(data_dir / "train.conll"),
        "dev_file": str(data_dir / "dev.conll"), "label_names": list(TAGS)}, teacher={
        "model": None, "base_model": str(encoder), "select_best": True, "eval_steps": 1,
        "train": {"max_steps": 2, "batch_size": 4, "save_steps": 1, "log_steps": 1}}))
    spec = task_spec(config.task)
    data = load_task_data(config.task, spec)
    record = finetune_teacher(config.teacher, config.task, spec, data, tmp_path / "teacher", "id", device="cpu")
    assert {"f1", "f1_strict", "surface/f1", "seen/f1", "unseen/f1"} <= set(record["dev"])
    assert list(record["dev"])[: len(spec.metrics)] == list(spec.metrics)  # the task's order: its primary first


def TaskSpecFor():
    return task_spec(TaskConfig(name="ner", task_type="token_classification", train_file="unused.conll",
                                dev_file="unused.conll", label_names=list(TAGS)))


def _dataset():
    import datasets

    ids = {t: i for i, t in enumerate(TAGS)}
    return datasets.Dataset.from_dict({"tokens": [w for w, _ in SENTENCES],
                                       "label": [[ids[t] for t in tags] for _, tags in SENTENCES]})


def test_tags_that_are_not_bio_and_word_accuracy_first_are_refused(tmp_path):
    pos = write_conll(tmp_path / "pos.conll", [(["the", "movie"], ["DT", "NN"])] * 3)
    with pytest.raises(DataError, match=r"tag\(s\) \['DT', 'NN'\] \(.*pos.conll, line 1\) are not BIO tags"):
        task_spec(TaskConfig(name="pos", task_type="token_classification", train_file=str(pos), dev_file=str(pos)))
    ner = write_conll(tmp_path / "ner.conll", SENTENCES * 3)
    with pytest.raises(DataError, match=r"entity metric first"):
        task_spec(TaskConfig(name="ner", task_type="token_classification", train_file=str(ner), dev_file=str(ner),
                             metrics=["accuracy", "f1"]))
    spec = task_spec(TaskConfig(name="ner", task_type="token_classification", train_file=str(ner), dev_file=str(ner)))
    assert spec.label_names == ("O", "B-location", "I-location", "B-person") and spec.metrics[0] == "f1"


def _own(train: Path, dev: Path | None = None, **task) -> TaskConfig:
    return TaskConfig(name="ner", task_type="token_classification", train_file=str(train), dev_file=str(dev or train),
                      **task)


def test_a_tag_typo_in_your_own_files_is_an_error_naming_it_and_its_line(tmp_path):
    """Without task.label_names the tags are the training file's: a typo must not become a class of its own."""
    people = [(["the", "actor", "was", "fine"], ["O", "B-PER", "O", "O"])] * 12
    # One B-PRE among the B-PERs (sentence 6, word 2: line 5 * 5 + 2), its type one swap from PER.
    swapped = people[:5] + [(["the", "cast", "was", "fine"], ["O", "B-PRE", "O", "O"])] + people[5:]
    path = write_conll(tmp_path / "swapped.conll", swapped)
    with pytest.raises(DataError, match=r"swapped.conll, line 27: tag 'B-PRE' \(type 'PRE', 1 time\(s\)\) looks like "
                                        r"a typo of type 'PER' \(12 times\), one edit away; fix it, or set "
                                        r"task.label_names"):
        task_spec(_own(path))
    # The type in another case is a typo too; a tag seen once or twice with no near type is refused as rare.
    cased = write_conll(tmp_path / "cased.conll", people + [(["a", "cast"], ["O", "B-per"])])
    with pytest.raises(DataError, match=r"cased.conll, line 62: tag 'B-per' .* looks like a typo of type 'PER'"):
        task_spec(_own(cased))
    rare = write_conll(tmp_path / "rare.conll", people + [(["a", "movie"], ["O", "B-location"])] * 2)
    with pytest.raises(DataError, match=r"rare.conll, line 62: tag 'B-location' is seen 2 time\(s\) in the training "
                                        r"file, under the 3 a tag of its own needs"):
        task_spec(_own(rare))
    # task.label_names accepts them; three of a tag make it one.
    accepted = task_spec(_own(path, label_names=["O", "B-PER", "B-PRE"]))
    assert accepted.label_names == ("O", "B-PER", "B-PRE")
    assert load_task_data(_own(path, label_names=["O", "B-PER", "B-PRE"]))["train"][5]["label"] == [0, 2, 0, 0]
    three = write_conll(tmp_path / "three.conll", people + [(["a", "movie"], ["O", "B-location"])] * 3)
    assert task_spec(_own(three)).label_names == ("O", "B-PER", "B-location")
    # A dev tag the training file lacks is named with its line in the dev file.
    dev = write_conll(tmp_path / "dev.conll", [(["the", "actor"], ["O", "B-PER"]), (["a", "movie"], ["O", "B-LOC"])])
    with pytest.raises(DataError, match=r"dev.conll, line 5: tag 'B-LOC' is not among the task's labels \['O', "
                                        r"'B-PER'\]; it is not in the training set"):
        task_spec(_own(write_conll(tmp_path / "people.conll", people), dev))


def test_a_tag_outside_a_named_tasks_tag_set_is_named_with_its_line_and_the_set_is_fixed(tmp_path):
    folder = tmp_path / "wnut17"
    folder.mkdir()
    write_conll(folder / "train.conll", [(["the", "actor"], ["O", "B-person"]), (["a", "town"], ["O", "B-place"])])
    write_conll(folder / "dev.conll", [(["the", "actor"], ["O", "B-person"])])
    with pytest.raises(DataError, match=r"train.conll, line 5: tag 'B-place' is not among the task's labels .*; "
                                        r"wnut_17's tags are fixed: fix the tag, or run the files as a task of your "
                                        r"own"):
        load_task_data(TaskConfig(name="wnut_17", data_dir=str(folder)))


def test_iob1_tags_are_refused_with_where_and_how_to_convert(tmp_path):
    from distill.tasks.data import load_task_data

    # IOB1 (the original CoNLL-2003 files): an entity after O starts with I- (B- only between two entities of one
    # type), which strict IOB2 scoring would drop.
    iob1 = write_conll(tmp_path / "iob1.conll", [(["the", "actor", "was", "fine"], ["O", "I-person", "O", "O"]),
                                                 (["a", "movie", "film"], ["O", "I-location", "B-location"])])
    config = TaskConfig(name="ner", task_type="token_classification", train_file=str(iob1), dev_file=str(iob1),
                        label_names=list(TAGS))
    with pytest.raises(DataError, match=r"iob1.conll, line 2: 'I-person' follows 'O', which IOB2 does not allow .*2 of "
                                        r"the file's entities start with I- and 1 with B-, so the tags look like IOB1: "
                                        r"convert them to IOB2"):
        load_task_data(config)


def test_a_broken_tag_in_an_iob2_file_is_named_as_a_typo_not_as_iob1(tmp_path):
    # B-PRE followed by I-PER in a file whose entities start with B-: the fix is the typo, not a conversion to IOB2.
    tags = ("O", "B-PER", "I-PER", "B-PRE")
    people = [(["the", "actor", "cast"], ["O", "B-PER", "I-PER"])] * 3
    switched = write_conll(tmp_path / "switched.conll", people + [(["the", "actor", "cast"], ["O", "B-PRE", "I-PER"])])
    config = _own(switched, label_names=list(tags))
    with pytest.raises(DataError, match=r"switched.conll, line 15: 'I-PER' follows 'B-PRE', which IOB2 does not "
                                        r"allow: an I- tag continues an entity of its own type; one of the two tags is "
                                        r"a typo") as refused:
        load_task_data(config)
    assert "IOB1" not in str(refused.value)
    orphan = write_conll(tmp_path / "orphan.conll", people + [(["the", "actor", "cast"], ["O", "O", "I-PER"])])
    with pytest.raises(DataError, match=r"orphan.conll, line 15: 'I-PER' follows 'O', .* a typo for "
                                        r"'B-PER'\?") as refused:
        load_task_data(_own(orphan, label_names=list(tags)))
    assert "IOB1" not in str(refused.value)
    # JSONL tags name the line and the word.
    jsonl = tmp_path / "tags.jsonl"
    jsonl.write_text("".join(json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in people[:1] + [
        (["the", "actor", "cast"], ["O", "B-PRE", "I-PER"])]), encoding="utf-8")
    with pytest.raises(DataError, match=r"tags.jsonl, line 2, word 3: 'I-PER' follows 'B-PRE'"):
        load_task_data(_own(jsonl, label_names=list(tags), label_column="ner_tags"))
    fine = load_task_data(TaskConfig(name="ner", task_type="token_classification", train_file=str(write_conll(
        tmp_path / "iob2.conll")), dev_file=str(tmp_path / "iob2.conll"), label_names=list(TAGS)))
    assert len(fine["train"]) == len(SENTENCES)


@pytest.mark.parametrize("hard_label_weight, warned", [(1.0, True), (0.0, False)])
def test_replacing_entity_words_with_a_hard_label_term_is_warned_of(hard_label_weight, warned, caplog):
    from distill.job.preflight import preflight

    folder = shared_data("ner/wnut17")
    config = load_config("ner_minilm.yaml", {"task.data_dir": str(folder), "augment.replace_entities": True,
                                             "augment.unlabelled": [],  # (which refuses a hard-label term outright)
                                             "augment.unlabelled_ranked": None,
                                             "distill.hard_label_weight": hard_label_weight}, ignore_none=False)
    with caplog.at_level("WARNING", logger="distill.job.preflight"):
        preflight(config)
    assert ("augment.replace_entities with distill.hard_label_weight" in caplog.text) is warned


def test_the_dry_run_refuses_a_conll_file_the_run_would_refuse(tmp_path, capsys):
    import run_distill

    folder = tmp_path / "wnut17"
    folder.mkdir()
    write_conll(folder / "dev.conll", [(["the", "actor"], ["O", "B-person"])])
    (folder / "train.conll").write_text("the\tO\nactor\tB-person\n\nNew York B-location\n", encoding="utf-8")
    args = ["pipeline", "--task", "wnut_17", "--data-dir", str(folder), "--output-dir", str(tmp_path / "run"),
            "--dry-run"]
    assert run_distill.main(args) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "train.conll, line 4: 'New York B-location' has 3 columns where the file's lines have 2" in line
    write_conll(folder / "train.conll", [(["the", "actor"], ["O", "B-person"])])
    assert run_distill.main(args) == 0
    out = capsys.readouterr().out
    assert f"data: local data folder ({folder}): 1 train, 1 dev examples" in out
    assert "  train 0: tokens ['the', 'actor']; label [O, B-person]" in out
    assert not (tmp_path / "run").exists()


def test_each_entity_types_recall_is_scored_and_the_report_gives_the_students_share_of_the_teachers():
    from distill.tasks import get_task
    from distill.tasks.token_classification import entity_metrics

    names = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    labels = [np.array([1, 2, 0, 3]), np.array([0, 3, 4])]  # gold: PER, LOC; LOC

    def tagged(ids):
        logits = np.full((len(ids), len(names)), -5.0)
        logits[np.arange(len(ids)), ids] = 5.0
        return logits

    teacher = entity_metrics([tagged([1, 2, 0, 3]), tagged([0, 3, 4])], labels, names)
    student = entity_metrics([tagged([1, 2, 0, 0]), tagged([0, 3, 4])], labels, names)  # misses the first LOC
    assert teacher["type/LOC/recall"] == 1.0 and student["type/LOC/recall"] == 0.5
    assert student["type/PER/recall"] == student["type/PER/precision"] == 1.0
    spec = get_task("wnut_17")
    surfaces = {"surface/f1": 1.0}  # the report's sections need the surface-form scores
    (section,) = spec.type.report_sections(spec, {"teacher": {**teacher, **surfaces}, "student": {**student,
                                                                                                  **surfaces}})
    assert "| LOC | 1.0000 | 0.5000 (50%) |" in section and "| all entities | 1.0000 | 0.6667 (67%) |" in section
