"""Every GLUE task from a local GLUE-format folder, a user's own files, label-order guard-rails, RoBERTa and ALBERT
through the real pipeline (tiny randomly initialised models saved to disk and loaded back by the normal code)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import run_distill
from conftest import BPE_CORPUS, tiny_bert, tiny_job, tiny_roberta
from distill.config import StudentConfig, TaskConfig
from distill.tasks.sequence_classification import GLUE_TASKS
from distill.tasks import DataError, get_task
from distill.tasks.data import load_task_data, task_spec
from glue_fixtures import write_glue_folder
from teachers import ModelError, load_teacher

EXPECTED = {  # task: (text columns, first three train labels as ids)
    "cola": (["sentence"], [0, 1, 0]),
    "sst2": (["sentence"], [0, 1, 0]),
    "mrpc": (["sentence1", "sentence2"], [0, 1, 0]),
    "stsb": (["sentence1", "sentence2"], [0.0, 1.3, 2.6]),
    "qqp": (["question1", "question2"], [0, 1, 0]),
    "mnli": (["premise", "hypothesis"], [0, 1, 2]),  # entailment, neutral, contradiction as the hub orders them
    "qnli": (["question", "sentence"], [0, 1, 0]),  # entailment, not_entailment
    "rte": (["sentence1", "sentence2"], [0, 1, 0]),
    "wnli": (["sentence1", "sentence2"], [0, 1, 0]),
}


@pytest.mark.parametrize("task", sorted(GLUE_TASKS))
def test_every_glue_task_reads_its_glue_folder(tmp_path, task):
    data = load_task_data(TaskConfig(name=task, data_dir=str(write_glue_folder(tmp_path, task))))
    columns, labels = EXPECTED[task]
    assert data["train"].column_names == [*columns, "label"]
    assert data["train"]["label"][:3] == pytest.approx(labels)
    assert len(data["train"]) == 12 and len(data["dev"]) == 6
    assert ("dev_mismatched" in data) == (task == "mnli")


def test_headerless_cola_reports_file_lines(tmp_path):
    folder = write_glue_folder(tmp_path, "cola")
    lines = (folder / "train.tsv").read_text().splitlines()
    lines[2] = "gj02\t7\t\tthe movie"
    (folder / "train.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train.tsv, line 3: label '7' is not one of the cola labels 0..1"):
        load_task_data(TaskConfig(name="cola", data_dir=str(folder)))


def test_mnli_label_names_map_to_the_hub_order_and_unknown_names_are_refused(tmp_path):
    folder = write_glue_folder(tmp_path, "mnli")
    text = (folder / "dev_mismatched.tsv").read_text().replace("\tneutral\tneutral", "\tneutral\tmaybe", 1)
    (folder / "dev_mismatched.tsv").write_text(text)
    with pytest.raises(DataError, match=r"dev_mismatched.tsv, line \d: label 'maybe' is not one of the mnli labels "
                                        r"0..2 \(entailment, neutral, contradiction\)"):
        load_task_data(TaskConfig(name="mnli", data_dir=str(folder)))


def test_a_missing_dev_file_names_the_files_the_folder_needs(tmp_path):
    folder = write_glue_folder(tmp_path, "mnli")
    (folder / "dev_mismatched.tsv").unlink()
    with pytest.raises(DataError, match="holds train.tsv and dev_matched.tsv, dev_mismatched.tsv"):
        load_task_data(TaskConfig(name="mnli", data_dir=str(folder)))


def test_users_own_csv_and_jsonl_task(tmp_path):
    (tmp_path / "train.csv").write_text('review,stars\n"good, fun",pos\nbad,neg\nfine,pos\n')
    (tmp_path / "dev.jsonl").write_text('{"review": "great", "stars": "pos"}\n{"review": "boring", "stars": "neg"}\n')
    config = TaskConfig(name="reviews", train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "dev.jsonl"),
                        text_columns=["review"], label_column="stars")
    spec = task_spec(config)
    assert spec.label_names == ("neg", "pos") and spec.metrics == ("accuracy", "f1")  # inferred, sorted
    data = load_task_data(config, spec)
    assert data["train"]["review"] == ["good, fun", "bad", "fine"] and data["train"]["label"] == [1, 0, 1]
    assert data["dev"]["label"] == [1, 0]

    (tmp_path / "bad.jsonl").write_text('{"review": "great", "stars": "pos"}\n{"review": "odd", "stars": "meh"}\n')
    bad = TaskConfig(name="reviews", train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "bad.jsonl"),
                     text_columns=["review"], label_column="stars", label_names=["neg", "pos"])
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: label 'meh' is not one of the reviews labels"):
        load_task_data(bad)
    missing = TaskConfig(name="reviews", train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "dev.jsonl"),
                         text_columns=["text"], label_column="stars", label_names=["neg", "pos"])
    with pytest.raises(DataError, match=r"missing column\(s\) \['text'\]; present: \['review', 'stars'\]"):
        load_task_data(missing)
    with pytest.raises(DataError, match="unknown task 'reviews'"):
        task_spec(TaskConfig(name="reviews"))


def test_a_dev_label_the_training_file_lacks_is_an_error_naming_it(tmp_path):
    """Finding 11 of issue 27: without task.label_names the classes come from the training file; a dev label that is
    not among them (a typo) is named, with the fix, before anything is read further."""
    (tmp_path / "train.csv").write_text("text,answer\n" + "a,yes\nb,no\n" * 5)
    (tmp_path / "dev.csv").write_text("text,answer\nc,yes\nd,maybe\ne,no\nf,Perhaps\n")
    config = TaskConfig(name="qa", train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "dev.csv"),
                        text_columns=["text"], label_column="answer")
    with pytest.raises(DataError, match=r"dev.csv: label\(s\) \['Perhaps', 'maybe'\] are in the dev set but not in "
                                        r"the training set .*train.csv \(labels there: \['no', 'yes'\]\); fix them, "
                                        r"or set task.label_names"):
        task_spec(config)


def test_a_class_under_1_percent_of_the_training_file_is_a_warning_naming_it(tmp_path, caplog):
    rows = "a,yes\nb,no\n" * 60 + "c,maybe\n"
    (tmp_path / "train.csv").write_text("text,answer\n" + rows)
    (tmp_path / "dev.csv").write_text("text,answer\nc,yes\ne,no\n")
    config = TaskConfig(name="qa", train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "dev.csv"),
                        text_columns=["text"], label_column="answer")
    with caplog.at_level("WARNING", logger="distill.tasks.data"):
        assert task_spec(config).label_names == ("maybe", "no", "yes")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["task qa: label 'maybe' is on 1 of 121 training examples (under 1%): a typo? fix it, or set "
                        "task.label_names"]
    caplog.clear()
    (tmp_path / "train.csv").write_text("text,answer\n" + "a,yes\nb,no\n" * 40 + "c,maybe\n")  # 1 of 81: no warning
    with caplog.at_level("WARNING", logger="distill.tasks.data"):
        task_spec(config)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_users_regression_task(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\tscore\nx\ty\t1.5\nz\tw\t4\n")
    config = TaskConfig(name="sim", train_file=str(tmp_path / "train.tsv"), dev_file=str(tmp_path / "train.tsv"),
                        text_columns=["a", "b"], label_column="score", regression=True)
    spec = task_spec(config)
    assert spec.is_regression and spec.metrics == ("pearson", "spearmanr")
    assert load_task_data(config, spec)["dev"]["label"] == [1.5, 4.0]


def test_label_order_mismatch_shows_both_orders_and_remap_reorders_the_outputs(tmp_path):
    mnli = get_task("mnli")
    theirs = ["contradiction", "entailment", "neutral"]  # the reference TinyBERT / run_glue processor order
    model = tiny_bert(num_labels=3, id2label=dict(enumerate(theirs)), label2id={n: i for i, n in enumerate(theirs)})
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"labels are \['contradiction', 'entailment', 'neutral'\] but task mnli "
                                         r"expects \['entailment', 'neutral', 'contradiction'\].*remap_labels"):
        load_teacher(str(tmp_path), mnli)
    remapped = load_teacher(str(tmp_path), mnli, remap_labels=True)
    batch = {"input_ids": torch.tensor([[2, 11, 12, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    original = model(**batch).logits[0]
    new = remapped(**batch).logits[0]
    for i, name in enumerate(mnli.label_names):
        assert new[i] == pytest.approx(original[theirs.index(name)].item(), abs=1e-6)
    assert remapped.config.id2label == dict(enumerate(mnli.label_names))

    other = tiny_bert(num_labels=3, id2label={0: "yes", 1: "no", 2: "maybe"}, label2id={"yes": 0, "no": 1, "maybe": 2})
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ModelError, match="fine-tuned on another task"):
        load_teacher(str(tmp_path / "other"), mnli, remap_labels=True)


def _tiny_teacher_for(task: str, **overrides):
    spec = get_task(task)
    names = spec.label_names
    return tiny_bert(**overrides, num_labels=spec.num_labels, id2label=dict(enumerate(names)) if names else None,
                     label2id={n: i for i, n in enumerate(names)} if names else None,
                     problem_type="regression" if spec.is_regression else None)


@pytest.mark.parametrize("task", sorted(GLUE_TASKS))
def test_pipeline_runs_every_glue_task_from_a_local_folder(tmp_path, tiny_tokenizer, task):
    folder = write_glue_folder(tmp_path, task)
    config = tiny_job(tmp_path, _tiny_teacher_for(task), tiny_tokenizer)
    assert run_distill.main(["pipeline", "--config", config, "--task", task, "--data-dir", str(folder)]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    metrics = {"mnli": ["accuracy", "accuracy_mismatched"]}.get(task, list(get_task(task).metrics))
    for name in ("teacher", "student"):
        assert all(np.isfinite(report[name][m]) for m in metrics), report[name]
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "student")
    assert student.config.num_labels == get_task(task).num_labels
    assert "| student |" in (tmp_path / "run" / "report.md").read_text()



def test_roberta_teacher_and_student_through_augmentation_and_distillation(tmp_path, tiny_roberta_tokenizer):
    """Byte-level BPE, no token type ids: masked LM, augmentation, both distillation steps, reload."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    vocab = len(tiny_roberta_tokenizer)
    torch.manual_seed(0)
    mlm = RobertaForMaskedLM(RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, max_position_embeddings=70, type_vocab_size=1,
                                           pad_token_id=1))
    mlm.save_pretrained(tmp_path / "mlm")
    tiny_roberta_tokenizer.save_pretrained(tmp_path / "mlm")
    (tmp_path / "vectors.txt").write_text("movie 1 0 0\nfilm 0.9 0.1 0\nstory 0 1 0\nplot 0.1 0.9 0\n")
    (tmp_path / "sst2").mkdir()
    rows = [f"{s}\t{i % 2}" for i, s in enumerate(BPE_CORPUS * 3)]
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:4]) + "\n")
    teacher = tiny_roberta(vocab_size=vocab, id2label={0: "negative", 1: "positive"},
                           label2id={"negative": 0, "positive": 1})
    config = tiny_job(tmp_path, teacher, tiny_roberta_tokenizer,
                       task={"name": "sst2", "data_dir": str(tmp_path / "sst2")},
                       mlm={"model": str(tmp_path / "mlm")},
                       augment={"enabled": True, "num_copies": 3, "num_candidates": 3, "word_vectors":
                                str(tmp_path / "vectors.txt"), "shard_size": 4})
    assert run_distill.main(["pipeline", "--config", config]) == 0
    out = tmp_path / "run"
    assert json.loads((out / "augmented" / "stage.json").read_text())["num_rows"] > len(rows)
    student = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "student")
    assert student.config.model_type == "roberta" and "token_type_ids" not in tokenizer("a film")
    assert student.config.hidden_size == 16
    batch = tokenizer(["the movie was good", "a terrible story"], padding=True, return_tensors="pt")
    assert student(**batch).logits.shape == (2, 2)


def test_albert_student_with_factorized_embedding_and_shared_layers(tmp_path, tiny_tokenizer):
    """An ALBERT student (E < H, one shared layer group) distils from a BERT teacher and reloads to the same logits."""
    folder = write_glue_folder(tmp_path, "sst2")
    config = tiny_job(tmp_path, _tiny_teacher_for("sst2", num_hidden_layers=4), tiny_tokenizer,
                       student={"model_type": "albert", "num_hidden_layers": 4, "hidden_size": 16,
                                "intermediate_size": 32, "num_attention_heads": 2, "embedding_size": 8,
                                "num_hidden_groups": 1})
    assert run_distill.main(["pipeline", "--config", config, "--data-dir", str(folder)]) == 0
    out = tmp_path / "run"
    log = [json.loads(line) for line in (out / "student_intermediate" / "log.jsonl").read_text().splitlines()]
    assert {"loss/embedding", "loss/hidden", "loss/attention"} <= set(log[-1])
    student = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    assert type(student).__name__ == "AlbertForSequenceClassification"
    assert student.config.embedding_size == 8 and student.config.num_hidden_groups == 1
    assert student.get_input_embeddings().weight.shape == (len(tiny_tokenizer), 8)
    assert len(student.albert.encoder.albert_layer_groups) == 1  # four layers, one set of weights
    # The embedding term compares the embedding output after the E -> H projection: H-sized, like every layer.
    intermediate = AutoModelForSequenceClassification.from_pretrained(out / "student_intermediate")
    batch = {"input_ids": torch.tensor([[2, 11, 12, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    hidden = intermediate(**batch, output_hidden_states=True).hidden_states
    assert len(hidden) == 5 and all(h.shape[-1] == 16 for h in hidden)
    again = AutoModelForSequenceClassification.from_pretrained(out / "student").eval()
    assert torch.equal(again(**batch).logits, student(**batch).logits)


def test_albert_settings_need_an_albert_student():
    from students import student_shape

    with pytest.raises(ValueError, match="ALBERT settings: set student.model_type: albert"):
        student_shape(StudentConfig(embedding_size=64))
    with pytest.raises(ValueError, match="num_hidden_groups 3 must divide num_hidden_layers 4"):
        student_shape(StudentConfig(preset="albert-4l-312", num_hidden_groups=3))
    assert student_shape(StudentConfig(preset="albert-4l-312"))["embedding_size"] == 128


def test_hub_splits_map_to_train_dev_and_mnli_mismatched(monkeypatch):
    """The hub path (unreachable here) with datasets.load_dataset replaced by the hub's split and column layout."""
    import datasets

    def fake_load_dataset(name, config):
        assert (name, config) == ("glue", "mnli")
        split = lambda n: datasets.Dataset.from_dict({"premise": ["a"] * n, "hypothesis": ["b"] * n,
                                                     "label": [2] * n, "idx": list(range(n))})
        return datasets.DatasetDict(train=split(5), validation_matched=split(3), validation_mismatched=split(2),
                                    test_matched=split(1))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr("distill.hub.hub_unreachable", lambda *args, **kwargs: None)  # as if the hub answered
    data = load_task_data(TaskConfig(name="mnli", source="hub"))
    assert {k: len(v) for k, v in data.items()} == {"train": 5, "dev": 3, "dev_mismatched": 2}
    assert data["dev"].column_names == ["premise", "hypothesis", "label"]


def test_teacher_fine_tuning_for_a_regression_task(tmp_path, tiny_tokenizer):
    """STS-B: the teacher is fine-tuned from a pre-trained encoder with one output (MSE), not given."""
    from transformers import BertModel

    from conftest import tiny_bert_config

    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "base")
    tiny_tokenizer.save_pretrained(tmp_path / "base")
    config = tiny_job(tmp_path, tiny_bert(), tiny_tokenizer, task={"name": "stsb"},
                      teacher={"model": None, "base_model": str(tmp_path / "base"),
                               "train": {"max_steps": 2, "batch_size": 4, "save_steps": 1}})
    assert run_distill.main(["pipeline", "--config", config, "--data-dir", str(write_glue_folder(tmp_path, "stsb"))]) == 0
    teacher = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "teacher")
    assert teacher.config.num_labels == 1 and teacher.config.problem_type == "regression"
    assert set(json.loads((tmp_path / "run" / "teacher" / "stage.json").read_text())["dev"]) == {
        f"{half}{name}" for half in ("", "tuning/", "report/") for name in ("pearson", "spearmanr")}


@pytest.mark.parametrize("start", ["checkpoint", "built"])
def test_a_regression_student_keeps_problem_type_and_pipeline_returns_its_score(tmp_path, tiny_tokenizer, start):
    """Finding 4 of issue 27: a regression student started from a checkpoint (``student.model``, as a general-distilled
    start) or built from a teacher whose config lacks ``problem_type`` is saved with problem_type "regression" and one
    output, so ``pipeline("text-classification")`` returns the raw score instead of its sigmoid."""
    from transformers import BertModel, pipeline

    from conftest import tiny_bert_config

    teacher = _tiny_teacher_for("stsb")
    sections = {}
    if start == "checkpoint":
        BertModel(tiny_bert_config()).save_pretrained(tmp_path / "start")
        tiny_tokenizer.save_pretrained(tmp_path / "start")
        sections["student"] = {"model": str(tmp_path / "start")}
    else:
        teacher.config.problem_type = None  # a given teacher that does not say it
    config = tiny_job(tmp_path, teacher, tiny_tokenizer, task={"name": "stsb"}, **sections)
    assert run_distill.main(["pipeline", "--config", config, "--data-dir", str(write_glue_folder(tmp_path, "stsb"))]) == 0
    folder = tmp_path / "run" / "student"
    student = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert student.config.problem_type == "regression" and student.config.num_labels == 1
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        raw = student(**tokenizer("the movie was good", return_tensors="pt")).logits[0, 0].item()
    score = pipeline("text-classification", model=str(folder), device="cpu")("the movie was good")[0]["score"]
    assert score == pytest.approx(raw, abs=1e-5)


def test_the_export_check_compares_regression_scores_instead_of_calling_them_all_the_same():
    spec, pairs = get_task("stsb"), get_task("mrpc")
    reference = np.array([[0.2], [2.5], [4.8], [3.0]])  # scores spanning 4.6: within 0.046 is the same
    moved = reference + np.array([[0.0], [0.04], [-0.05], [1.0]])
    assert spec.type.same_prediction(moved, reference, spec).tolist() == [True, True, False, False]
    logits = np.array([[0.1, 0.9], [0.8, 0.2]])
    assert pairs.type.same_prediction(logits[::-1], logits, pairs).tolist() == [False, False]
    assert pairs.type.same_prediction(logits + 0.1, logits, pairs).tolist() == [True, True]


def test_the_cards_usage_passes_a_pair_tasks_two_texts_and_the_pipeline_takes_them(tmp_path, tiny_tokenizer):
    from transformers import pipeline

    pairs, single = get_task("mrpc"), get_task("sst2")
    code = pairs.type.usage("PATH", pairs)
    assert '"text_pair"' in code and '"text_pair"' not in single.type.usage("PATH", single)
    model = tiny_bert()
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    printed = []
    exec(code.replace("PATH", str(tmp_path / "model")), {"print": printed.append})  # the card's code, as written
    (result,) = printed
    classify = pipeline("text-classification", model=str(tmp_path / "model"))
    expected = classify({"text": "A man is playing a guitar.", "text_pair": "A person plays an instrument."})
    assert result == expected and result["label"] in model.config.id2label.values()
