"""Extractive question answering as a task type: SQuAD reading, features over long contexts with their answer
positions, the span prediction loss, span post-processing with the official EM/F1, padding, the reader, and the whole
pipeline on a tiny QA teacher."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import BertForQuestionAnswering

from distill.config import ConfigError, TaskConfig, load_config
from distill.tasks import DataError, get_task
from distill.tasks.data import load_task_data
from distill.tasks.evaluate import predict
from distill.tasks import get_task_type
from distill.tasks.qa_postprocess import NO_SPAN, answers, best_span
from distill.publish.serving import QuestionAnswerer
from distill.tasks.question_answering import (
    QuestionAnsweringCollator,
    read_squad,
    span_cross_entropy,
    span_soft_cross_entropy,
    squad_metrics,
    tokenize_questions,
)
from tests.conftest import shared_data, tiny_bert_config, tiny_job

# Words of the tiny vocabulary of conftest ("wonderful" is two pieces).
CONTEXTS = ["the movie was good and the plot was fun . the cast was great",
            "a wonderful film with a bad story . the actor was very fine"]
PARAGRAPHS = [(context, [(question, answer, context.index(answer)) for question, answer in qas]) for context, qas in
              zip(CONTEXTS, [[("what was the plot ?", "fun"), ("what was the cast ?", "great")],
                             [("what was the film ?", "wonderful"), ("what was the actor ?", "very fine")]])]
GREAT = CONTEXTS[0].index("great")


def write_squad(path: Path, paragraphs=PARAGRAPHS) -> Path:
    data = [{"title": "t", "paragraphs": [
        {"context": context, "qas": [{"id": f"q{i}-{j}", "question": q, "answers": [{"text": a, "answer_start": s}]}
                                     for j, (q, a, s) in enumerate(qas)]}
        for i, (context, qas) in enumerate(paragraphs)]}]
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def test_squad_files_read_one_row_per_question_and_bad_offsets_are_named(tmp_path):
    rows = read_squad(write_squad(tmp_path / "train.json"))
    assert rows.column_names == ["id", "question", "context", "label"] and len(rows) == 4
    assert rows[3]["label"] == {"text": ["very fine"], "answer_start": [CONTEXTS[1].index("very fine")]}
    bad = [(CONTEXTS[0], [("what was the plot ?", "fun", 31)])]
    with pytest.raises(DataError, match=r"question 'q0-0'\): answer 'fun' is not at answer_start 31"):
        read_squad(write_squad(tmp_path / "bad.json", bad))
    with pytest.raises(DataError, match=r"does not exist"):
        read_squad(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"no top-level 'data' list"):
        read_squad(tmp_path / "list.json")


def test_squad_errors_name_the_files_line(tmp_path):
    """Bad data is named by the file's line (and the question's id): the line of the question's "id" field, with the
    character where the file is one line long, as the official files are."""
    bad = PARAGRAPHS[:1] + [(CONTEXTS[1], [("what was the film ?", "wonderful", 2), ("what was it ?", "bad", 3)])]
    one_line = write_squad(tmp_path / "one_line.json", bad)
    text = one_line.read_text()
    character = text.index('"id": "q1-1"') + 1
    with pytest.raises(DataError, match=rf"one_line.json, line 1, character {character} \(question 'q1-1'\): answer "
                                        r"'bad' is not at answer_start 3"):
        read_squad(one_line)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(text), indent=1), encoding="utf-8")
    line = pretty.read_text().splitlines().index('       "id": "q1-1",') + 1
    with pytest.raises(DataError, match=rf"pretty.json, line {line} \(question 'q1-1'\): answer 'bad' is not at"):
        read_squad(pretty)
    data = json.loads(text)
    data["data"][0]["paragraphs"][1]["qas"][0]["answers"] = []
    del data["data"][0]["paragraphs"][1]["qas"][1]["question"]
    pretty.write_text(json.dumps(data, indent=1), encoding="utf-8")
    line = pretty.read_text().splitlines().index('       "id": "q1-0",') + 1
    with pytest.raises(DataError, match=rf"pretty.json, line {line} \(question 'q1-0'\): no answer"):
        read_squad(pretty)
    data["data"][0]["paragraphs"][1]["qas"][0]["answers"] = [{"text": "wonderful", "answer_start": 2}]
    data["data"][0]["paragraphs"][1]["qas"][1]["answers"] = [{"text": "bad", "answer_start": CONTEXTS[1].index("bad")}]
    pretty.write_text(json.dumps(data, indent=1), encoding="utf-8")
    line = pretty.read_text().splitlines().index('       "id": "q1-1",') + 1
    with pytest.raises(DataError, match=rf"pretty.json, line {line} \(question 'q1-1'\): not the SQuAD layout "
                                        r"\(missing 'question'\)"):
        read_squad(pretty)
    (tmp_path / "broken.json").write_text('{"data": [\n  {"paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(DataError, match=r"broken.json, line 2, column 19: not valid JSON"):
        read_squad(tmp_path / "broken.json")


def test_the_squad_task_reads_the_shared_files():
    folder = shared_data("qa/squad-v1.1")
    data = load_task_data(TaskConfig(name="squad", data_dir=str(folder), max_train_examples=5))
    assert (len(data["train"]), len(data["dev"])) == (5, 9380)  # the shared dev.json's questions (PROVENANCE.md)
    first = data["train"][0]
    assert first["context"][first["label"]["answer_start"][0]:].startswith(first["label"]["text"][0])


def test_the_squad_task_reads_the_hub_layout(monkeypatch):
    import datasets

    def fake_load_dataset(name):
        assert name == "squad"
        split = datasets.Dataset.from_dict({"id": ["0"], "title": ["t"], "context": ["a cat"], "question": ["who?"],
                                            "answers": [{"text": ["cat"], "answer_start": [2]}]})
        return datasets.DatasetDict(train=split, validation=split)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("distill.hub.hub_unreachable", lambda *args, **kwargs: None)
    hub = load_task_data(TaskConfig(name="squad", source="hub"))
    assert hub["dev"].column_names == ["question", "context", "label"]
    assert hub["dev"][0]["label"] == {"text": ["cat"], "answer_start": [2]}


def test_a_long_context_becomes_overlapping_features_and_the_answer_is_found_in_the_one_that_holds_it(tiny_tokenizer):
    import datasets

    context = PARAGRAPHS[0][0]  # 14 words, one piece each
    rows = datasets.Dataset.from_dict({"question": ["what was the cast ?"], "context": [context],
                                       "label": [{"text": ["great"], "answer_start": [GREAT]}]})
    features = tokenize_questions(rows, tiny_tokenizer, max_seq_length=16, doc_stride=4)
    assert len(features) > 1  # 5 question pieces + 3 specials leave 8 context pieces a window
    holding = 0
    for feature in features:
        ids, label = feature["input_ids"], feature["labels"]
        assert len(ids) <= 16 and label["example"] == 0 and label["answers"] == ["great"]
        context_pieces = [k for k, span in enumerate(label["offsets"]) if tuple(span) != NO_SPAN]
        assert [k for k, m in enumerate(feature["context_mask"]) if m] == [0, *context_pieces]  # [CLS] + context
        for k in context_pieces:  # offsets point at the piece's characters
            start, end = label["offsets"][k]
            assert tiny_tokenizer.convert_ids_to_tokens(ids[k]) == context[start:end]
        start, end = feature["start_positions"], feature["end_positions"]
        if start == 0:
            assert end == 0
        else:
            holding += 1
            assert tiny_tokenizer.decode(ids[start:end + 1]) == "great"
    assert holding >= 1
    answer = (GREAT, GREAT + len("great"))
    for feature in features:  # every window that holds the whole answer is labelled with it, no other
        spans = [tuple(span) for span in feature["labels"]["offsets"] if tuple(span) != NO_SPAN]
        holds = spans[0][0] <= answer[0] and spans[-1][1] >= answer[1]
        assert (feature["start_positions"] != 0) == holds
    windows = [[tuple(s) for s in f["labels"]["offsets"] if tuple(s) != NO_SPAN] for f in features]
    assert set(windows[0]) & set(windows[1])  # consecutive windows overlap


def test_a_stride_that_leaves_no_room_for_a_question_is_one_clear_error(tiny_tokenizer):
    import datasets

    rows = datasets.Dataset.from_dict({"question": ["what was the cast ?"], "context": [PARAGRAPHS[0][0]],
                                       "label": [{"text": ["great"], "answer_start": [GREAT]}]})
    with pytest.raises(DataError, match=r"max_seq_length 16 holds 3 special tokens and the doc_stride 12 .* no room"):
        tokenize_questions(rows, tiny_tokenizer, max_seq_length=16, doc_stride=12)


def test_only_a_question_too_long_for_its_window_is_cut_and_the_others_stay_whole(tiny_tokenizer, caplog):
    import datasets

    context = PARAGRAPHS[0][0]
    long = "was the plot fun and was the story good and was the cast great"  # 14 pieces
    rows = datasets.Dataset.from_dict({"question": ["what was the cast ?", long], "context": [context, context],
                                       "label": [{"text": ["great"], "answer_start": [GREAT]}] * 2})
    # 16 pieces, 3 special, a stride of 4: a question may have 8, so that a window holds 5 context pieces.
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        features = tokenize_questions(rows, tiny_tokenizer, max_seq_length=16, doc_stride=4)
    assert "1 question(s) longer than 8 pieces cut to their first 8" in caplog.text

    def question(feature):  # the pieces between [CLS] and the first [SEP]
        ids = feature["input_ids"]
        return tiny_tokenizer.decode(ids[1:ids.index(tiny_tokenizer.sep_token_id)])
    by_example = {}
    for feature in features:
        by_example.setdefault(feature["labels"]["example"], []).append(feature)
        assert len(feature["input_ids"]) <= 16
    assert {question(f) for f in by_example[0]} == {"[UNK] was the cast [UNK]"}  # whole: 5 pieces
    assert {question(f) for f in by_example[1]} == {"was the plot fun and was the story"}
    # Every context piece of the long question's example is still in one of its windows.
    covered = {tuple(s) for f in by_example[1] for s in f["labels"]["offsets"] if tuple(s) != NO_SPAN}
    assert covered == {tuple(s) for f in by_example[0] for s in f["labels"]["offsets"] if tuple(s) != NO_SPAN}


def test_the_reader_answers_several_questions_about_one_context(tiny_tokenizer):
    reader = QuestionAnswerer(tiny_qa_teacher(), tiny_tokenizer, max_seq_length=16)
    context = PARAGRAPHS[0][0]
    several = reader(["what was the cast ?", "was the plot fun ?"], context)
    assert several == [reader("what was the cast ?", context), reader("was the plot fun ?", context)]
    with pytest.raises(ValueError, match="one question takes one context"):
        reader("what was the cast ?", [context, context])
    with pytest.raises(ValueError, match="2 questions but 3 contexts"):
        reader(["a", "b"], [context] * 3)


def test_the_span_loss_is_soft_cross_entropy_over_the_context_for_start_and_end():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 2), torch.randn(2, 5, 2)
    mask = torch.tensor([[1, 0, 1, 1, 0], [1, 0, 0, 1, 1]])
    expected = 0.0
    for b in range(2):
        keep = mask[b].bool()
        for k in range(2):
            p = torch.softmax(teacher[b, keep, k] / 2.0, dim=0)
            expected += -(p * torch.log_softmax(student[b, keep, k] / 2.0, dim=0)).sum() / 4
    loss = span_soft_cross_entropy(student, teacher, mask, temperature=2.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    moved_s, moved_t = student.clone(), teacher.clone()
    moved_s[mask == 0] += 100.0
    moved_t[mask == 0] -= 50.0
    assert span_soft_cross_entropy(moved_s, moved_t, mask, 2.0).item() == pytest.approx(loss.item(), rel=1e-6)
    student.requires_grad_(True)
    span_soft_cross_entropy(student, teacher, mask, 1.0).backward()
    assert torch.all(student.grad[mask == 0] == 0) and torch.all(student.grad[mask == 1] != 0)
    # The hard term: cross-entropy of the gold positions over the same positions.
    hard = span_cross_entropy(teacher, torch.tensor([2, 3]), torch.tensor([3, 4]), mask)
    manual = sum(-torch.log_softmax(teacher[b, mask[b].bool(), k], 0)[i] for b, k, i in
                 ((0, 0, 1), (0, 1, 2), (1, 0, 1), (1, 1, 2))) / 4
    assert hard.item() == pytest.approx(manual.item(), rel=1e-6)


def test_the_task_types_prediction_loss_reads_the_batchs_context_mask_and_positions():
    kind = get_task_type("question_answering")
    student, teacher = torch.randn(1, 4, 2), torch.randn(1, 4, 2)
    batch = {"context_mask": torch.tensor([[1, 0, 1, 1]]), "start_positions": torch.tensor([2]),
             "end_positions": torch.tensor([3])}
    spec = get_task("squad")
    plain = kind.prediction_loss(spec, student, teacher, batch, temperature=2.0, temperature_squared=True,
                                 hard_label_weight=0.0)
    assert plain.item() == pytest.approx(4 * span_soft_cross_entropy(student, teacher, batch["context_mask"], 2.0))
    with_hard = kind.prediction_loss(spec, student, teacher, batch, temperature=1.0, temperature_squared=False,
                                     hard_label_weight=0.5)
    expected = span_soft_cross_entropy(student, teacher, batch["context_mask"]) + 0.5 * span_cross_entropy(
        student, batch["start_positions"], batch["end_positions"], batch["context_mask"])
    assert with_hard.item() == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="context_mask"):
        kind.prediction_loss(spec, student, teacher, {}, temperature=1.0, temperature_squared=False,
                             hard_label_weight=0.0)
    # the check of a loss lost to rounding reads the positions the loss reads: the question's may differ freely
    outside = teacher.clone()
    outside[0, 1] += 5.0
    assert not kind.prediction_inputs_differ(spec, teacher, outside, batch)
    assert kind.prediction_inputs_differ(spec, student, teacher, batch)
    with pytest.raises(ValueError, match="context_mask"):
        kind.prediction_inputs_differ(spec, student, teacher, {})


def test_the_best_span_is_valid_ordered_short_and_inside_the_context():
    offsets = [list(NO_SPAN), [0, 3], [4, 9], [10, 12], list(NO_SPAN)]
    logits = np.array([[9, 9], [1, 0], [0, 5], [3, 1], [8, 8]], dtype=np.float32)
    # [CLS] and the last piece (outside the context) score highest but are never chosen; end 1 < start 3 neither.
    assert best_span(logits, offsets) == (1.0 + 5.0, 0, 9)
    assert best_span(logits, offsets, max_answer_length=1) == (0.0 + 5.0, 4, 9)  # one piece: start = end
    assert best_span(logits, [list(NO_SPAN)] * 5) is None


def test_positions_outside_the_context_never_crowd_it_out_of_the_n_best():
    """The span loss leaves the question's logits free: 25 question pieces scoring above every context piece must not
    fill the 20 best starts and ends."""
    offsets = [list(NO_SPAN)] * 25 + [[k, k + 1] for k in range(13)]
    logits = np.concatenate([np.full((25, 2), 5.0), np.linspace(1.0, 0.0, 13)[:, None].repeat(2, 1)]).astype("f4")
    assert best_span(logits, offsets, n_best=20) == (2.0, 0, 1)


def test_squad_scores_follow_the_official_v1_1_rules_but_for_one_documented_case():
    """Cases worked by hand with the official v1.1 rules: normalised text (case, punctuation, articles, spaces),
    token-overlap F1, the maximum over the gold answers."""
    def score(prediction: str, gold: list[str]) -> dict:
        context = prediction + " |"
        logits = np.full((3, 2), -5.0, dtype=np.float32)
        logits[1] = 5.0
        label = {"example": 0, "offsets": [list(NO_SPAN), [0, len(prediction)], list(NO_SPAN)], "context": context,
                 "answers": gold}
        return squad_metrics([logits], [label])

    assert score("The Denver Broncos!", ["Denver Broncos"]) == {"f1": 1.0, "exact_match": 1.0}
    partial = score("Denver Broncos won", ["Denver Broncos"])  # precision 2/3, recall 1
    assert partial["exact_match"] == 0.0 and partial["f1"] == pytest.approx(0.8)
    best_of = score("Denver Broncos won", ["Carolina", "broncos won"])  # the best gold: precision 2/3, recall 1
    assert best_of["f1"] == pytest.approx(0.8)
    assert score("Carolina", ["Denver Broncos"]) == {"f1": 0.0, "exact_match": 0.0}
    # The one known difference from the v1.1 script (documented): both sides normalise to nothing, F1 1 (v1.1: 0).
    assert score("a", ["the"]) == {"f1": 1.0, "exact_match": 1.0}


def test_the_span_score_is_a_probability_of_the_context_spans():
    """The score is p(start) · p(end) over the context's pieces: 1 where the context is one piece (the span is
    certain), and never above 1 from float32 logits, however they round."""
    rng = np.random.default_rng(0)
    one_piece = {"example": 0, "offsets": [list(NO_SPAN), [0, 3], list(NO_SPAN)], "context": "cat", "answers": ["cat"]}
    scores = [answers([rng.normal(0, 30, (3, 2)).astype(np.float32)], [one_piece])[0]["score"] for _ in range(500)]
    assert max(scores) == 1.0 and min(scores) > 1 - 1e-9
    two = {"example": 0, "offsets": [list(NO_SPAN), [0, 1], [2, 3]], "context": "a b", "answers": ["b"]}
    logits = np.array([[9.0, 9.0], [0.0, 0.0], [np.log(3), np.log(3)]], dtype=np.float32)  # start, end 3:1 on "b"
    found = answers([logits], [two])[0]  # spans a (1/4·1/4), a b (1/4·3/4), b (3/4·3/4): b
    assert found["answer"] == "b" and found["score"] == pytest.approx(9 / 16)


def test_a_question_is_answered_from_its_best_feature_and_gold_logits_score_full_marks(tiny_tokenizer):
    import datasets

    questions = [(context, q, a, s) for context, qas in PARAGRAPHS for q, a, s in qas]
    rows = datasets.Dataset.from_dict({"question": [q for _, q, _, _ in questions],
                                       "context": [c for c, _, _, _ in questions],
                                       "label": [{"text": [a], "answer_start": [s]} for _, _, a, s in questions]})
    features = tokenize_questions(rows, tiny_tokenizer, max_seq_length=16, doc_stride=4)
    gold = []
    for feature in features:
        logits = np.full((len(feature["input_ids"]), 2), -3.0, dtype=np.float32)
        logits[feature["start_positions"], 0] = logits[feature["end_positions"], 1] = 3.0  # [CLS] where absent
        gold.append(logits)
    assert squad_metrics(gold, features["labels"]) == {"f1": 1.0, "exact_match": 1.0}
    # ONNX and PyTorch agree per question, on its answer: a window that loses in both may differ freely
    kind, labels = get_task_type("question_answering"), features["labels"]
    examples = [label["example"] for label in labels]
    several = next(q for q in set(examples) if examples.count(q) > 1)
    losing = next(i for i, label in enumerate(labels) if label["example"] == several and gold[i][0, 0] == 3.0)
    other = [logits.copy() for logits in gold]
    other[losing][:, :] = -3.0
    other[losing][len(other[losing]) - 2, :] = 2.0  # a span in a window without the answer, below the gold one
    assert kind.same_prediction(other, gold, None, labels).all()  # the PyTorch/ONNX check takes a spec it ignores
    assert kind.same_prediction(other, gold, None, labels).shape == (len(rows),)
    moved = [logits.copy() for logits in gold]
    moved[losing][len(moved[losing]) - 2, :] = 9.0  # now the losing window's span wins: another answer
    assert kind.same_prediction(moved, gold, None, labels).sum() == len(rows) - 1


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_collator_pads_masks_and_teacher_logits_and_moves_positions_with_left_padding(tiny_tokenizer, side):
    tiny_tokenizer.padding_side = side
    features = [{"input_ids": [2, 5, 3], "attention_mask": [1, 1, 1], "start_positions": 1, "end_positions": 1,
                 "context_mask": [1, 1, 0], "teacher_logits": [[1.0, 2.0]] * 3},
                {"input_ids": [2, 5, 6, 7, 3], "attention_mask": [1] * 5, "start_positions": 2, "end_positions": 3,
                 "context_mask": [1, 0, 1, 1, 0], "teacher_logits": [[3.0, 4.0]] * 5}]
    batch = QuestionAnsweringCollator(tiny_tokenizer)(features)
    assert batch["input_ids"].shape == (2, 5) and batch["teacher_logits"].shape == (2, 5, 2)
    if side == "right":
        assert batch["context_mask"][0].tolist() == [1, 1, 0, 0, 0] and batch["start_positions"].tolist() == [1, 2]
        assert batch["teacher_logits"][0, :, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    else:
        assert batch["context_mask"][0].tolist() == [0, 0, 1, 1, 0] and batch["start_positions"].tolist() == [3, 2]
        assert batch["end_positions"].tolist() == [3, 3]
        assert batch["input_ids"][0, batch["start_positions"][0]] == 5  # still the same piece
        assert batch["teacher_logits"][0, :, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert batch["teacher_logits"][1].sum() == 35.0  # the longest row is not padded


def test_augmentation_is_refused_for_question_answering(tmp_path):
    from distill.job.preflight import preflight

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"task": {"name": "squad"}, "augment": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"augment.enabled: .*\(answers and their offsets\)"):
        preflight(load_config(str(path)))


def tiny_qa_teacher() -> BertForQuestionAnswering:
    torch.manual_seed(0)
    return BertForQuestionAnswering(tiny_bert_config(num_labels=2)).eval()


def test_the_pipeline_distils_a_reader_that_answers_through_pytorch_and_onnx(tmp_path, tiny_tokenizer):
    """The whole job on SQuAD files from a tiny encoder: the teacher fine-tuned with a new QA head (its own loss on
    start and end positions, best dev F1 kept), a student with the teacher's QA head, the teacher's start/end logits
    cached per feature, a card with the question-answering tag, ONNX files that pick the same spans as PyTorch, and
    the reader answering from both."""
    from distill.job.pipeline import run_pipeline

    data = tmp_path / "data"
    data.mkdir()
    write_squad(data / "train.json", PARAGRAPHS * 3)
    write_squad(data / "dev.json")
    encoder = tmp_path / "encoder"
    tiny_qa_teacher().save_pretrained(encoder)
    tiny_tokenizer.save_pretrained(encoder)
    steps = {"max_steps": 2, "batch_size": 4, "learning_rate": 1.0e-3, "save_steps": 1, "log_steps": 1}
    path = tiny_job(tmp_path, tiny_qa_teacher(), tiny_tokenizer,
                    task={"name": "qa", "task_type": "question_answering", "train_file": str(data / "train.json"),
                          "dev_file": str(data / "dev.json"), "max_seq_length": 16},
                    teacher={"model": None, "base_model": str(encoder), "train": steps, "eval_steps": 1,
                             "max_train_examples_cpu": 4},
                    student={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                             "num_attention_heads": 4, "init": "teacher"},
                    distill={"hard_label_weight": 1.0},  # the shipped recipe's gold-span term
                    export={"onnx": True, "int8": False})
    report = run_pipeline(load_config(str(path)))
    out = tmp_path / "run"
    assert set(report["models"]["student"]["dev"]) == {f"{half}{name}" for half in ("", "tuning/", "report/")
                                                       for name in ("f1", "exact_match")}
    teacher = json.loads((out / "teacher" / "stage.json").read_text())
    assert teacher["steps"] == 2 and [step for step, _ in teacher["selection"]["evaluations"]] == [1, 2]
    student = out / "student"
    assert json.loads((student / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    features = json.loads((out / "teacher_logits" / "stage.json").read_text())["num_rows"]
    assert features > 12  # 12 questions, several features each at 16 pieces
    assert teacher["num_train_examples"] * 2 < features  # fine-tuned on the first 4 questions, distilled on all 12
    card = (student / "README.md").read_text()
    assert "the first 4 training examples" in card
    # The gold-span term ran beside the soft one: the step's record and the card's list of the terms that ran say so.
    assert json.loads((student / "stage.json").read_text())["weights"] == {"prediction": 1.0, "hard_label": 1.0}
    assert "'prediction': 1.0, 'hard_label': 1.0}; temperature 1.0" in card
    assert "pipeline_tag: question-answering" in card and "QuestionAnswerer(" in card
    export = json.loads((student / "onnx" / "export.json").read_text())
    assert export["files"]["model.onnx"]["same_prediction"] == 1.0
    assert export["files"]["model.onnx"]["max_abs_logit_difference"] < 1e-3
    # The windows it was scored with are saved beside its weights (and the teacher's), in the ONNX copy and record.
    windows = {"max_seq_length": 16, "doc_stride": 5, "max_answer_length": 30}
    for config_file in (student / "config.json", out / "teacher" / "config.json", student / "onnx" / "config.json"):
        assert json.loads(config_file.read_text())["question_answering"] == windows, config_file
    assert export["question_answering"] == windows
    question, context = "what was the cast ?", PARAGRAPHS[0][0]
    reader, onnx_reader = QuestionAnswerer(student), QuestionAnswerer(student / "onnx" / "model.onnx")
    assert reader.max_seq_length == onnx_reader.max_seq_length == 16  # the run's own feature length
    from_pytorch, from_onnx = reader(question, context), onnx_reader(question, context)
    # A two-step student answers badly, but with a span of the context that the answer's characters are.
    assert 0 <= from_pytorch["start"] < from_pytorch["end"] <= len(context)
    assert from_pytorch["answer"] == context[from_pytorch["start"]:from_pytorch["end"]]
    assert (from_onnx["start"], from_onnx["end"]) == (from_pytorch["start"], from_pytorch["end"])
    assert 0.0 < from_pytorch["score"] <= 1.0
    assert reader([], []) == []


def _rows(paragraphs=PARAGRAPHS):
    import datasets

    questions = [(context, q, a, s) for context, qas in paragraphs for q, a, s in qas]
    return datasets.Dataset.from_dict({"question": [q for _, q, _, _ in questions],
                                       "context": [c for c, _, _, _ in questions],
                                       "label": [{"text": [a], "answer_start": [s]} for _, _, a, s in questions]})


def trained_reader(tokenizer, max_seq_length: int, steps: int = 300) -> BertForQuestionAnswering:
    """A tiny reader trained on PARAGRAPHS' questions in windows of ``max_seq_length`` (its own QA loss, one thread:
    about 2 s), so that its answers are confident spans it learnt to point at, not noise."""
    from distill.device import torch_threads
    from distill.tasks.question_answering import doc_stride

    features = tokenize_questions(_rows(), tokenizer, max_seq_length, doc_stride(max_seq_length))
    batch = QuestionAnsweringCollator(tokenizer)(list(features))
    batch.pop("context_mask")
    model = tiny_qa_teacher().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch_threads(1):
        for _ in range(steps):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
    return model.eval()


def test_the_reader_answers_as_the_evaluation_does_with_the_windows_saved_beside_the_weights(
        tmp_path, tiny_tokenizer, caplog):
    """A reader made with 16-piece windows (stride 5, contexts of several windows) and saved as the pipeline saves
    it: QuestionAnswerer from its folder, from a copy of it outside any run, and from the model object gives the
    evaluation path's answers, spans and scores for every question; one that read with other windows would not."""
    import shutil

    from distill.tasks import TaskSpec
    from distill.tasks import record_serving
    from distill.tasks.question_answering import doc_stride

    model = trained_reader(tiny_tokenizer, 16)
    rows = _rows()
    features = tokenize_questions(rows, tiny_tokenizer, 16, doc_stride(16))
    examples = [label["example"] for label in features["labels"]]
    assert max(examples.count(q) for q in set(examples)) > 1  # a context of several windows
    outputs = predict(model, features, tiny_tokenizer, task_type=get_task_type("question_answering"), device="cpu")
    evaluated = answers(outputs, features["labels"])
    # Trained-looking: half its answers right (with four questions it learnt the windows better than the questions)
    # and every one a confident span, not the near-uniform scores of an untrained reader.
    assert squad_metrics(outputs, features["labels"])["f1"] >= 0.5
    assert all(answer["score"] > 0.5 and answer["answer"] for answer in evaluated.values())
    spec = TaskSpec("qa", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), hub=None,
                    task_type="question_answering")
    folder = tmp_path / "student"
    record_serving(model, spec, 16)
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    shutil.copytree(folder, tmp_path / "copied")
    expected = [{k: v for k, v in evaluated[q].items() if k != "gold"} for q in range(len(rows))]
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        for source in (folder, tmp_path / "copied", model):
            reader = QuestionAnswerer(source, tokenizer=tiny_tokenizer)
            assert reader.windows == {"max_seq_length": 16, "doc_stride": 5, "max_answer_length": 30}
            got = reader(rows["question"], rows["context"])
            for found, wanted in zip(got, expected):
                assert (found["answer"], found["start"], found["end"]) == (wanted["answer"], wanted["start"],
                                                                           wanted["end"])
                assert found["score"] == pytest.approx(wanted["score"], rel=1e-5)
    assert "records no windows" not in caplog.text
    # Other windows read other features: the answers or their scores differ.
    other = QuestionAnswerer(folder, max_seq_length=64)(rows["question"], rows["context"])
    assert other[0]["score"] != pytest.approx(expected[0]["score"], rel=1e-5) or other != expected
    assert QuestionAnswerer(folder, max_seq_length=64).windows == {"max_seq_length": 64, "doc_stride": 21,
                                                                   "max_answer_length": 30}


def test_a_reader_named_by_its_hub_repository_reads_the_windows_from_the_pushed_config(tmp_path, tiny_tokenizer,
                                                                                          monkeypatch, caplog):
    """The card's own `QuestionAnswerer("PATH_OR_REPO")` for a pushed student: no local folder, the windows come with
    the checkpoint's config.json from the hub (from_pretrained stood in for here)."""
    import transformers

    from distill.tasks import TaskSpec
    from distill.tasks import record_serving

    model = tiny_qa_teacher()
    spec = TaskSpec("qa", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), hub=None,
                    task_type="question_answering")
    record_serving(model, spec, 24)
    model.save_pretrained(tmp_path / "pushed")
    tiny_tokenizer.save_pretrained(tmp_path / "pushed")
    for auto in (transformers.AutoModelForQuestionAnswering, transformers.AutoTokenizer):
        real = auto.from_pretrained
        monkeypatch.setattr(auto, "from_pretrained", lambda name, *a, real=real, **k: real(
            tmp_path / "pushed" if str(name) == "someone/reader" else name, *a, **k))
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        reader = QuestionAnswerer("someone/reader")
    assert reader.windows == {"max_seq_length": 24, "doc_stride": 8, "max_answer_length": 30} and not caplog.text


def test_a_reader_without_saved_windows_warns_and_reads_with_run_qas(tmp_path, tiny_tokenizer, caplog):
    model = tiny_qa_teacher()
    model.save_pretrained(tmp_path / "plain")
    tiny_tokenizer.save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        reader = QuestionAnswerer(tmp_path / "plain")
    assert reader.windows == {"max_seq_length": 384, "doc_stride": 128, "max_answer_length": 30}
    assert f"{tmp_path / 'plain'} records no windows" in caplog.text and "pass max_seq_length=" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        QuestionAnswerer(model, tokenizer=tiny_tokenizer)
    assert "the BertForQuestionAnswering given records no windows" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="distill.tasks.question_answering"):
        given = QuestionAnswerer(model, tokenizer=tiny_tokenizer, max_seq_length=32, max_answer_length=5)
    assert given.windows == {"max_seq_length": 32, "doc_stride": 10, "max_answer_length": 5} and not caplog.text


def test_the_reader_is_quiet_by_default(tmp_path, tiny_tokenizer, capfd):
    """No "tokenize:" or "evaluate:" progress bar on each call (progress=True shows them)."""
    import datasets.utils.logging as datasets_logging

    model = tiny_qa_teacher()
    datasets_logging.enable_progress_bar()
    quiet = QuestionAnswerer(model, tokenizer=tiny_tokenizer, max_seq_length=16)
    capfd.readouterr()
    quiet(["what was the cast ?"] * 3, PARAGRAPHS[0][0])
    err = capfd.readouterr().err
    assert "tokenize" not in err and "evaluate" not in err
    assert datasets_logging.is_progress_bar_enabled()  # put back as it was
    QuestionAnswerer(model, tokenizer=tiny_tokenizer, max_seq_length=16, progress=True)(
        ["what was the cast ?"] * 3, PARAGRAPHS[0][0])
    assert "tokenize" in capfd.readouterr().err


def test_leading_spaces_of_a_question_are_dropped_before_it_takes_pieces(tiny_roberta_tokenizer):
    """A byte-level BPE tokenizer makes pieces of leading spaces (run_qa.py strips them: a question padded with
    spaces would take the context's room); the features are those of the question without them."""
    context = "the movie was good and the plot was fun . the cast was great"
    spaced = _rows([(context, [("      what was the plot ?", "fun", context.index("fun"))])])
    plain = _rows([(context, [("what was the plot ?", "fun", context.index("fun"))])])
    assert len(tiny_roberta_tokenizer("      what")["input_ids"]) > len(tiny_roberta_tokenizer("what")["input_ids"])
    ours, theirs = (tokenize_questions(rows, tiny_roberta_tokenizer, 24, 8) for rows in (spaced, plain))
    assert ours["input_ids"] == theirs["input_ids"] and ours["start_positions"] == theirs["start_positions"]


def test_predict_gives_start_and_end_logits_per_feature(tiny_tokenizer):
    import datasets

    model = tiny_qa_teacher()
    rows = datasets.Dataset.from_dict({"question": ["what was the cast ?"], "context": [PARAGRAPHS[0][0]],
                                       "label": [{"text": ["great"], "answer_start": [GREAT]}]})
    features = tokenize_questions(rows, tiny_tokenizer, max_seq_length=16, doc_stride=4)
    logits = predict(model, features, tiny_tokenizer, task_type=get_task_type("question_answering"), device="cpu")
    assert len(logits) == len(features) and logits[0].shape == (len(features[0]["input_ids"]), 2)
    alone = model(input_ids=torch.tensor([features[1]["input_ids"]]),
                  token_type_ids=torch.tensor([features[1]["token_type_ids"]]))
    np.testing.assert_allclose(logits[1][:, 0], alone.start_logits[0].detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(logits[1][:, 1], alone.end_logits[0].detach().numpy(), atol=1e-5)


def test_the_cpu_budget_rule_caps_the_training_set_on_a_cpu_only_and_the_run_ids_say_so():
    from distill.config import with_overrides
    from distill.job.pipeline import for_device
    from distill.job.stages import STAGES

    shipped = load_config(str(Path(__file__).resolve().parents[1] / "configs" / "squad_minilm.yaml"))
    assert (shipped.task.max_train_examples_cpu, shipped.teacher.max_train_examples_cpu) == (16000, 8000)
    assert shipped.task.max_train_examples is None
    # One cap for both: the first 8,000 questions on a CPU, all on an accelerator.
    eight = with_overrides(shipped, {"task.max_train_examples_cpu": 8000, "teacher.max_train_examples_cpu": None})
    on_cpu = for_device(eight, torch.device("cpu"))
    on_gpu = for_device(eight, torch.device("cuda"))
    assert (on_cpu.task.max_train_examples, on_cpu.task.max_train_examples_cpu) == (8000, None)
    assert (on_gpu.task.max_train_examples, on_gpu.task.max_train_examples_cpu) == (None, None)
    smaller = for_device(with_overrides(eight, {"task.max_train_examples": 500}), torch.device("cpu"))
    assert smaller.task.max_train_examples == 500  # the cap never raises an explicit limit
    teacher = STAGES["teacher"]
    written_out = with_overrides(eight, {"task.max_train_examples": 8000, "task.max_train_examples_cpu": None})
    assert teacher.run_id(on_cpu, {}) == teacher.run_id(written_out, {}) != teacher.run_id(on_gpu, {})
    # The teacher's own share (the shipped rule): kept on a CPU (the teacher stage reads it), dropped on an accelerator.
    assert for_device(shipped, torch.device("cpu")).teacher.max_train_examples_cpu == 8000
    assert for_device(shipped, torch.device("cpu")).task.max_train_examples == 16000
    assert for_device(shipped, torch.device("cuda")).teacher.max_train_examples_cpu is None
    assert for_device(shipped, torch.device("cuda")).task.max_train_examples is None
    assert teacher.run_id(for_device(shipped, torch.device("cuda")), {}) == teacher.run_id(on_gpu, {})
    # A share that leaves the teacher the same examples is the same teacher: the task at 16,000 with a share of 8,000
    # (the shipped job) reuses the teacher made for the task at 8,000; the later stages see other data and re-run.
    shipped_on_cpu = for_device(shipped, torch.device("cpu"))
    assert teacher.run_id(shipped_on_cpu, {}) == teacher.run_id(on_cpu, {})
    assert STAGES["augmented"].run_id(shipped_on_cpu, {"mlm": "m"}) != STAGES["augmented"].run_id(on_cpu, {"mlm": "m"})
    share_of_all = for_device(with_overrides(shipped, {"task.max_train_examples_cpu": None}), torch.device("cpu"))
    assert teacher.run_id(share_of_all, {}) == teacher.run_id(on_cpu, {})
    larger_share = for_device(with_overrides(eight, {"teacher.max_train_examples_cpu": 9000}), torch.device("cpu"))
    assert teacher.run_id(larger_share, {}) == teacher.run_id(on_cpu, {})  # 8,000 examples either way
    other_share = for_device(with_overrides(shipped, {"teacher.max_train_examples_cpu": 4000}), torch.device("cpu"))
    assert teacher.run_id(other_share, {}) != teacher.run_id(on_cpu, {})
    given = with_overrides(shipped, {"teacher.model": "a/fine-tuned-reader"})  # nothing to fine-tune: no share
    assert for_device(given, torch.device("cpu")).teacher.max_train_examples_cpu is None
    with pytest.raises(ConfigError, match="teacher.max_train_examples_cpu"):
        with_overrides(shipped, {"teacher.max_train_examples_cpu": 0})


def test_a_sweep_resolves_the_cpu_budget_rule_too(tmp_path, monkeypatch):
    import distill.job.pipeline as pipeline

    path = tmp_path / "sweep.yaml"
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "squad_minilm.yaml").read_text())
    config.update(output_dir=str(tmp_path / "run"), sweep=[{"name": "half", "student": {"preset": "teacher-half"}}])
    path.write_text(yaml.safe_dump(config))
    seen = {}
    monkeypatch.setattr(pipeline, "_sweep", lambda config, entries, device: seen.update(config=config, **entries))
    pipeline.run_sweep(load_config(str(path)), device=torch.device("cpu"))
    assert seen["config"].task.max_train_examples == seen["half"].task.max_train_examples == 16000
    assert seen["config"].teacher.max_train_examples_cpu == seen["half"].teacher.max_train_examples_cpu == 8000


def test_the_dry_run_prints_the_config_as_it_would_run_here(tmp_path, capsys):
    import run_distill

    write_squad(tmp_path / "train.json")
    write_squad(tmp_path / "dev.json")
    code = run_distill.main(["pipeline", "--task", "squad", "--data-dir", str(tmp_path), "--output-dir",
                             str(tmp_path / "run"), "--dry-run", "--show-config"])
    out = capsys.readouterr().out
    printed = yaml.safe_load(out.rsplit("\n\n", 1)[-1])  # the resolved config, last
    assert code == 0 and printed["task"]["max_train_examples"] == 16000  # on this CPU
    # The data read as the run reads it: where from, the layout, the first rows.
    assert f"data: local data folder ({tmp_path}): 4 train, 4 dev examples" in out
    assert "question-answering reader (question_answering): columns question, context; labels: answers" in out
    assert "  train 0: id 'q0-0'; question 'what was the plot ?'; context 'the movie was good" in out
    assert printed["teacher"]["max_train_examples_cpu"] == 8000  # the teacher's share, kept on a CPU
    assert printed["task"]["max_train_examples_cpu"] is None and not (tmp_path / "run").exists()


def test_the_dry_run_refuses_a_squad_file_the_run_would_refuse(tmp_path, capsys):
    import run_distill

    write_squad(tmp_path / "train.json")
    write_squad(tmp_path / "dev.json", PARAGRAPHS[:1] + [(CONTEXTS[1], [("what was it ?", "bad", 3)])])
    code = run_distill.main(["pipeline", "--task", "squad", "--data-dir", str(tmp_path), "--output-dir",
                             str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert re.search(r"dev.json, line 1, character \d+ \(question 'q1-0'\): answer 'bad' is not at answer_start 3",
                     line)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task, augmented", [("sst2", True), ("wnut_17", True), ("squad", False)])
def test_the_smoke_config_augments_where_the_task_type_allows(task, augmented, tmp_path):
    """`augment.enabled: auto` (configs/smoke.yaml): resolved when the job prepares the config it read (every entry
    of the job does, first), so the QA smoke run passes the checks an explicit `true` fails, and the stages see a
    plain true or false."""
    from distill.job.preflight import preflight, prepare

    config = prepare(load_config("smoke.yaml", {"task.name": task, "output_dir": str(tmp_path / "run")}))
    assert config.augment.enabled is augmented
    preflight(config)
    with pytest.raises(ConfigError, match=r"augment.enabled: must be true, false or auto, got 'sometimes'"):
        load_config("smoke.yaml", {"augment.enabled": "sometimes"})
