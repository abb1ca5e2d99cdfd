"""A task of your own files in one command (distill/tasks/infer.py, run_distill.py --train-file/--dev-file): the task
type, text and label columns read from the files where they are unambiguous, one line naming the flag where not,
the type's recipe chosen as for a named task, and a small CSV distilled end to end."""

import json

import pytest

import run_distill
from distill.tasks import DataError
from distill.tasks.infer import infer_task, task_name
from tests.conftest import shared_data


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_table_says_its_text_and_label_columns_and_whether_it_is_regression(tmp_path):
    one = _write(tmp_path / "a.csv", 'id,review,label\n1,"a lovely film",pos\n2,dull,neg\n')
    assert infer_task(one) == {"task.task_type": "sequence_classification", "task.text_columns": ["review"],
                               "task.label_column": "label"}
    pair = _write(tmp_path / "b.tsv", "q\tp\tlabel\nwho\tme\t1\nwhy\tso\t0\n")
    assert infer_task(pair)["task.text_columns"] == ["q", "p"]
    scores = _write(tmp_path / "c.jsonl", '{"s1": "a", "s2": "b", "label": 3.5}\n{"s1": "c", "s2": "d", "label": 1}\n')
    assert infer_task(scores)["task.regression"] is True
    tags = _write(tmp_path / "d.csv", 'text,labels\n"thanks","gratitude,joy"\nok,neutral\n')
    assert infer_task(tags)["task.task_type"] == "multi_label_classification"


def test_files_in_a_types_own_layout_are_that_types():
    assert infer_task(str(shared_data("ner/wnut17/train.conll"))) == {"task.task_type": "token_classification"}
    assert infer_task(str(shared_data("qa/squad-v1.1/dev.json"))) == {"task.task_type": "question_answering"}


def test_what_the_files_cannot_say_is_one_line_naming_the_flag(tmp_path):
    many = _write(tmp_path / "m.csv", "title,body,notes,label\na,b,c,x\nd,e,f,y\n")
    with pytest.raises(DataError, match="3 columns of text besides the label .* --text-columns"):
        infer_task(many)
    assert infer_task(many, text_columns=["body"])["task.text_columns"] == ["body"]
    unnamed = _write(tmp_path / "u.csv", "text,sentiment\na,x\nb,y\n")
    with pytest.raises(DataError, match="no column is called label or labels; name the label column with "
                                        "--label-column \\(columns: text, sentiment\\)"):
        infer_task(unnamed)
    with pytest.raises(DataError, match="no column 'mood'"):
        infer_task(unnamed, label_column="mood")
    with pytest.raises(DataError, match="does not exist"):
        infer_task(str(tmp_path / "missing.csv"))


def test_the_task_is_named_after_its_folder_or_file(tmp_path):
    assert task_name(str(tmp_path / "reviews" / "train.csv")) == "reviews"
    assert task_name(str(tmp_path / "data" / "tickets.csv")) == "tickets"


def test_a_pair_file_gets_the_pair_recipe_and_a_missing_dev_file_is_refused(tmp_path, capsys):
    rows = "".join(f"sentence number {i}\tother sentence {i}\t{i % 2}\n" for i in range(12))
    train = _write(tmp_path / "pairs" / "train.tsv", "first\tsecond\tlabel\n" + rows)
    dev = _write(tmp_path / "pairs" / "dev.tsv", "first\tsecond\tlabel\n" + rows)
    assert run_distill.main(["pipeline", "--train-file", train]) == 2
    assert "--dev-file is missing" in capsys.readouterr().err
    code = run_distill.main(["pipeline", "--train-file", train, "--dev-file", dev, "--dry-run",
                             "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "task pairs of your files: a sequence classification task, text first, second, labels label" in err
    assert "config: configs/pair_minilm.yaml, the recipe for pair and regression tasks" in err


@pytest.mark.slow
def test_a_small_csv_distils_in_one_command(tmp_path, capsys):
    """The README's own-files command on a 24-row CSV, with the smoke config's budgets (its task section leaves the
    type and columns to the files)."""
    words = ["good", "bad", "fine", "awful", "great", "poor"]
    lines = [f'{i},"the film was {words[i % 6]} {i}",{"pos" if i % 2 == 0 else "neg"}\n' for i in range(24)]
    train = _write(tmp_path / "reviews" / "train.csv", "id,review,label\n" + "".join(lines))
    dev = _write(tmp_path / "reviews" / "dev.csv", "id,review,label\n" + "".join(lines[:12]))
    out = tmp_path / "run"
    code = run_distill.main(["pipeline", "--config", "smoke.yaml", "--train-file", train, "--dev-file", dev,
                             "--output-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["student"]["run"]["task"] == "reviews"
    assert report["student"]["run"]["data"]["location"] == "train.csv, dev.csv"  # no path of this machine
    saved = json.loads((out / "config.json").read_text())["task"]
    assert (saved["text_columns"], saved["label_column"], saved["task_type"]) == (["review"], "label",
                                                                                 "sequence_classification")
