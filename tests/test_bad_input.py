"""Bad input of every kind gets an error that names what is wrong and how to fix it; property tests over the data
readers and the augmenter (arbitrary Unicode never crashes them, output rows keep their label and columns)."""

from __future__ import annotations

import logging
import re

import datasets
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from augment.dataset import augment_examples
from distill.config import AugmentConfig, TaskConfig
from distill.tasks import DataError, get_task
from distill.tasks.data import load_task_data, tokenize
from distill.tasks.sequence_classification import read_glue_tsv

# Texts a TSV line can hold: anything but the tab and line breaks that delimit it (and NUL, which text files lack).
TSV_TEXT = st.text(st.characters(blacklist_characters="\t\n\r\x00", blacklist_categories=("Cs",)), max_size=40)
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_non_utf8_bytes_in_a_glue_file_name_the_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\nfine\t1\nna\xefve caf\xe9\t0\n")
    with pytest.raises(DataError, match=r"train.tsv: line 3 is not valid UTF-8; re-save the file as UTF-8"):
        read_glue_tsv(path, get_task("sst2"))


def test_long_texts_are_truncated_and_counted(tiny_tokenizer, caplog):
    data = datasets.Dataset.from_dict({"sentence": ["the movie was good"] + ["the movie " * 40] * 2, "label": [1, 0, 1]})
    with caplog.at_level(logging.WARNING):
        encoded = tokenize(data, tiny_tokenizer, get_task("sst2"), max_seq_length=16)
    assert [len(ids) for ids in encoded["input_ids"]] == [6, 16, 16]
    assert "2 of 3 examples are longer than max_seq_length = 16 tokens and were truncated" in caplog.text


@PROPERTY
@given(rows=st.lists(st.tuples(TSV_TEXT, st.integers(0, 1)), min_size=1, max_size=8))
def test_glue_tsv_reader_keeps_any_text_and_label(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("tsv") / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows), encoding="utf-8")
    data = read_glue_tsv(path, get_task("sst2"))
    assert data["sentence"] == [text for text, _ in rows] and data["label"] == [label for _, label in rows]


@PROPERTY
@given(rows=st.lists(st.tuples(ANY_TEXT, st.sampled_from(["neg", "pos"])), min_size=1, max_size=8))
@example(rows=[("", "neg"), ("0", "neg"), ("NA", "pos")])  # found by hypothesis: read back as 0.0 and None once
def test_csv_and_jsonl_readers_keep_any_text_and_label(tmp_path_factory, rows):
    import csv
    import json

    folder = tmp_path_factory.mktemp("table")
    with (folder / "train.csv").open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": l}) + "\n" for t, l in rows),
                                        encoding="utf-8")
    for name in ("train.csv", "train.jsonl"):
        config = TaskConfig(name="mine", train_file=str(folder / name), dev_file=str(folder / name),
                            text_columns=["text"], label_names=["neg", "pos"])
        data = load_task_data(config)["train"]
        # CSV cannot tell an empty field from a missing one: an empty text comes back as "".
        assert data["text"] == [t for t, _ in rows], name
        assert data["label"] == [["neg", "pos"].index(l) for _, l in rows], name


@pytest.fixture(scope="module")
def generator():
    from conftest import tiny_generator

    return tiny_generator()


@PROPERTY
@given(first=st.lists(ANY_TEXT, min_size=1, max_size=4), second=st.lists(ANY_TEXT, min_size=4, max_size=4))
def test_augmenter_never_crashes_and_keeps_labels_and_columns(generator, first, second):
    examples = [{"sentence1": a, "sentence2": b, "label": i % 2, "id": f"ex{i}"}
                for i, (a, b) in enumerate(zip(first, second))]
    config = AugmentConfig(num_copies=3, replace_prob=0.5, num_candidates=3)
    rows = augment_examples(examples, list(range(len(examples))), ("sentence1", "sentence2"), generator, config)
    for row in rows:
        source = examples[row["source_index"]]
        assert set(row) == {"sentence1", "sentence2", "label", "id", "source_index", "is_augmented"}
        assert row["label"] == source["label"] and row["id"] == source["id"]
    assert [r for r in rows if not r["is_augmented"]] == [
        {**e, "source_index": i, "is_augmented": False} for i, e in enumerate(examples)]


@pytest.fixture
def tiny_teacher_dir(tmp_path, tiny_tokenizer):
    from conftest import tiny_bert

    folder = tmp_path / "teacher"
    tiny_bert(id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("settings_, message", [
    (["student.preset=null", "student.num_hidden_layers=3", "student.hidden_size=16", "student.intermediate_size=32",
      "student.num_attention_heads=2"],
     r"distill.layer_map / student.num_hidden_layers: the student has 3 layers and the teacher 2: a student deeper "
     r"than its teacher cannot be mapped"),
    (["student.preset=null", "student.num_hidden_layers=2", "student.hidden_size=24", "student.intermediate_size=32",
      "student.num_attention_heads=3"],
     r"student.num_attention_heads: the teacher has 4 heads and the student 3; .* must divide the teacher's "
     r"\(e.g. 1, 2, 4\), or set distill.weights.attention: 0"),
    (["student.init=teacher", "student.preset=null", "student.num_hidden_layers=2", "student.hidden_size=16",
      "student.intermediate_size=32", "student.num_attention_heads=2"],
     r"student.init: 'teacher' copies teacher layers and needs the teacher's hidden_size \(32\), the student has 16"),
    (["student.init=teacher", "student.preset=null", "student.num_hidden_layers=2", "student.hidden_size=32",
      "student.intermediate_size=64", "student.num_attention_heads=2"],
     r"student.init: 'teacher' copies teacher layers and needs the teacher's num_attention_heads \(4\), the student "
     r"has 2"),
    (["distill.layer_map=[1, 3]", "student.preset=null", "student.num_hidden_layers=2", "student.hidden_size=16",
      "student.intermediate_size=32", "student.num_attention_heads=2"],
     r"layer_map entries \[3\] are outside the teacher's layers 1..2"),
    (["distill.temperature=-1"], r"distill.temperature: must be > 0, got -1.0"),
    (["teacher.eval_steps=0"], r"teacher.eval_steps: must be > 0 or null \(score at each epoch's end\), got 0"),
    (["augment.replace_prob=1.5"], r"augment.replace_prob: must be in \[0, 1\], got 1.5"),
    (["distill.intermediate.batch_size=many"], r"distill.intermediate.batch_size: expected int, got 'many'"),
    (["distill.tempreature=2"], r"unknown config key distill.tempreature; DistillConfig accepts: layer_map.*; did "
                                r"you mean distill.temperature\?$"),
    (["teacher.mlm.model=b"], r"unknown config key teacher.mlm; TeacherConfig accepts: .*; mlm is a section of its "
                              r"own: write it at the top level, not under teacher$"),
    (["distill.prediction.train.learning_rate=1e-4"], r"unknown config key distill.prediction.train; TrainConfig "
                                                       r"accepts: .*; distill.prediction takes them itself: "
                                                       r"distill.prediction.learning_rate$"),
    (["student.preset=huge"], r"student: unknown student preset 'huge'; presets: tinybert-4l-312"),
    (["general.enabled=true", "general.layer_map=[1, 2]"],
     r"general.layer_map: explicit layer_map has 2 entries but the student has 1 layers"),
])
def test_bad_model_and_config_settings_stop_before_any_work(tmp_path, tiny_teacher_dir, capsys, settings_, message):
    import run_distill

    out = tmp_path / "run"
    args = ["pipeline", "--teacher", str(tiny_teacher_dir), "--output-dir", str(out), "--set", "augment.enabled=false"]
    for setting in settings_:
        args += ["--set", setting]
    assert run_distill.main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "Traceback" not in error
    assert re.search(message, error), error
    assert not (out / "teacher").exists()  # nothing was started


def test_a_classifier_as_masked_lm_and_a_teacher_in_the_jobs_own_stage_folder_stop_before_any_work(
        tmp_path, tiny_teacher_dir, capsys):
    """mlm.model must be a masked LM (found in augmentation, after the teacher, otherwise); teacher.model must not be
    the job's own teacher folder, which the new teacher run id would move to superseded/ before it is loaded."""
    import shutil

    import run_distill

    out = tmp_path / "run"
    assert run_distill.main(["pipeline", "--teacher", str(tiny_teacher_dir), "--output-dir", str(out), "--set",
                             f"mlm.model={tiny_teacher_dir}"]) == 2
    assert "mlm.model: " in (error := capsys.readouterr().err) and "not a masked LM" in error
    shutil.copytree(tiny_teacher_dir, out / "teacher")
    assert run_distill.main(["pipeline", "--teacher", str(out / "teacher"), "--output-dir", str(out), "--set",
                             "augment.enabled=false"]) == 2
    assert "teacher.model: " in (error := capsys.readouterr().err) and "this job's own teacher stage folder" in error
    assert not (out / "superseded").exists()


def test_a_pre_trained_encoder_given_as_teacher_is_fine_tuned_on_the_task_first(tmp_path, tiny_tokenizer, capsys,
                                                                                 monkeypatch):
    """--teacher with no task head (a masked LM, as bert-base-uncased is saved) is an encoder to fine-tune here
    (teacher.base_model), said in one line; a checkpoint with another task's head is refused (check_model_head)."""
    import run_distill
    from conftest import tiny_masked_lm

    tiny_masked_lm().save_pretrained(tmp_path / "mlm")
    tiny_tokenizer.save_pretrained(tmp_path / "mlm")
    seen = {}
    monkeypatch.setitem(run_distill.COMMANDS, "pipeline", lambda config, args: seen.update(config=config) or 0)
    monkeypatch.setattr(run_distill, "_setup_logging", lambda output_dir: None)
    assert run_distill.main(["pipeline", "--teacher", str(tmp_path / "mlm"), "--output-dir", str(tmp_path / "run"),
                             "--set", "augment.enabled=false"]) == 0
    teacher = seen["config"].teacher
    assert (teacher.model, teacher.base_model) == (None, str(tmp_path / "mlm"))
    assert "has no task head (BertForMaskedLM): fine-tuned on the task first" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["distill", "--stage", "task", "--max-steps", "10", "--corpus", "a.txt"],
     r"distill --stage task does not take --corpus, --max-steps \(flags of --stage general\)"),
    (["distill", "--stage", "general", "--task", "mrpc"],
     r"distill --stage general does not take --task \(flags of --stage task\)"),
    (["export", "--student", "{tmp}/no-such-student"], r"--student .*no-such-student does not exist"),
    (["augment", "--task", "squad", "--mlm", "bert-base-uncased", "--output-dir", "{tmp}/aug"],
     r"augment --task squad: TinyBERT's word replacement would change the labels of a"),
    (["sweep", "--output-dir", "{tmp}/sweep", "--set", "benchmark.students=[{tmp}/no-such-run]"],
     r"benchmark.students: .*no-such-run"),
])
def test_a_flag_or_path_a_command_cannot_use_is_one_line_before_any_work(tmp_path, capsys, args, message):
    """Flags of the other `distill` stage were dropped without a word; a mistyped export folder was created; QA
    data went through word replacement with its answer offsets left behind; a sweep's missing extra student was a
    traceback after every student had trained."""
    import run_distill

    code = run_distill.main([a.replace("{tmp}", str(tmp_path)) for a in args])
    error = capsys.readouterr().err
    assert code == 2 and "Traceback" not in error and re.search(message, error), error
    assert not (tmp_path / "no-such-student").exists()
    assert not (tmp_path / "aug").exists() or {p.name for p in (tmp_path / "aug").iterdir()} <= {"run.log"}
    assert not (tmp_path / "sweep" / "teacher").exists()


def test_distill_stage_task_picks_the_tasks_own_recipe_as_pipeline_does(monkeypatch):
    import run_distill

    seen = {}
    monkeypatch.setitem(run_distill.COMMANDS, "distill", lambda config, args: seen.setdefault("config", config) and 0)
    assert run_distill.main(["distill", "--stage", "task", "--task", "squad", "--data-dir", "somewhere"]) == 0
    assert seen["config"].output_dir == "runs/squad" and seen["config"].task.max_seq_length == 256
    assert seen["config"].augment.enabled is False  # squad_minilm.yaml's, not the default job's
