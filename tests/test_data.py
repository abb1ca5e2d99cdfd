import datasets
import pytest

from distill.config import TaskConfig
from distill.tasks import DataError, get_task
from distill.tasks.data import load_task_data
from distill.tasks.sequence_classification import read_glue_tsv
from distill.tasks.files import read_table


def test_bundled_sst2_loads():
    data = load_task_data(TaskConfig(name="sst2"))
    assert len(data["train"]) == 10000 and len(data["dev"]) == 872
    assert set(data["train"]["label"]) == {0, 1}


def test_local_folder_and_limits(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na good film \t1\na bad film \t0\nok \t1\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine \t1\n")
    data = load_task_data(TaskConfig(name="sst2", data_dir=str(tmp_path), max_train_examples=2))
    assert data["train"]["sentence"] == ["a good film ", "a bad film "]
    assert data["dev"]["label"] == [1]


def test_the_data_source_says_where_the_data_came_from_and_how_much_is_used(tmp_path):
    from distill.tasks.data import ASSETS, load_task_data_with_source

    _, bundled = load_task_data_with_source(TaskConfig(name="sst2", max_eval_examples=32))
    assert (bundled.kind, bundled.location) == ("bundled", str(ASSETS / "sst2"))
    assert bundled.num_examples == {"train": 10000, "dev": 32} and bundled.num_available == {"train": 10000, "dev": 872}
    # what a card or report says names the folder, not this machine's path to it; the log says the path
    assert bundled.describe() == "bundled sample (sst2): 10000 train, first 32 of 872 dev examples"
    assert bundled.describe(public=False) == f"bundled sample ({ASSETS / 'sst2'}): 10000 train, first 32 of 872 dev " \
        "examples"
    (tmp_path / "train.csv").write_text("text,label\na,x\nb,y\n")
    _, files = load_task_data_with_source(TaskConfig(name="mine", train_file=str(tmp_path / "train.csv"),
                                                     dev_file=str(tmp_path / "train.csv"), text_columns=["text"]))
    assert files.kind == "files" and files.describe() == "your files (train.csv, train.csv): 2 train, 2 dev examples"


def test_malformed_line_gives_its_number(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\nfine\t1\nbroken line\twith\ttabs\t0\n")
    with pytest.raises(DataError, match=r"line 3: expected 2 tab-separated fields, found 4"):
        read_glue_tsv(path, get_task("sst2"))


def test_missing_column_lists_present_ones(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(DataError, match=r"missing column\(s\) \['sentence'\]; present: \['text', 'label'\]"):
        read_glue_tsv(path, get_task("sst2"))


def test_label_outside_label_set(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\nfine\t1\nodd\t2\n")
    with pytest.raises(DataError, match=r"line 3: label '2' is not one of the sst2 labels 0..1"):
        read_glue_tsv(path, get_task("sst2"))


def test_empty_file_and_missing_folder(tmp_path):
    (tmp_path / "train.tsv").write_text("")
    with pytest.raises(DataError, match="is empty"):
        read_glue_tsv(tmp_path / "train.tsv", get_task("sst2"))
    with pytest.raises(DataError, match="does not exist"):
        load_task_data(TaskConfig(name="sst2", data_dir=str(tmp_path / "nope")))


def test_mrpc_columns_are_renamed(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text('\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said "hi" .\tHe greeted .\n')
    data = read_glue_tsv(path, get_task("mrpc"))
    assert data[0] == {"sentence1": 'He said "hi" .', "sentence2": "He greeted .", "label": 1}


def test_read_table_formats(tmp_path):
    (tmp_path / "a.csv").write_text('text,label\n"hello, world",1\nfine,0\n')
    (tmp_path / "a.tsv").write_text('\ufeffsentence\tlabel\nsay "hi" now\t1\n')  # with a byte-order mark
    (tmp_path / "a.jsonl").write_text('{"question": "why?", "sentence": "because", "label": 2}\n')
    assert read_table(str(tmp_path / "a.csv"))[:] == {"text": ["hello, world", "fine"], "label": [1, 0]}
    assert read_table(str(tmp_path / "a.tsv"))["sentence"] == ['say "hi" now']  # TSV: quotes are text, as GLUE
    assert read_table(str(tmp_path / "a.jsonl"))[0] == {"question": "why?", "sentence": "because", "label": 2}
    datasets.DatasetDict(train=read_table(str(tmp_path / "a.csv"))).save_to_disk(str(tmp_path / "saved"))
    assert read_table(str(tmp_path / "saved"))["text"] == ["hello, world", "fine"]
    with pytest.raises(DataError, match=r"has no split 'dev'; splits: train"):
        read_table(str(tmp_path / "saved"), split="dev")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.csv", b"text,label\nfine,1\nbad,0,extra\n", r"bad.csv: cannot read it as CSV: .*Expected 2 fields in line 3, saw 3"),
        ("bad.jsonl", b'{"text": "a"}\n{"text": "b" "label": 0}\n', r"line 2 is not a JSON object"),
        ("bad.tsv", b"text\tlabel\nfine\t1\n\xff\xfe bad\t1\n", r"line 3 is not valid UTF-8"),
        ("empty.csv", b"", r"empty.csv is empty"),
        ("data.txt", b"x", r"unknown file type '.txt'"),
    ],
)
def test_read_table_errors_name_the_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_table(str(tmp_path / name))


def test_a_saved_dataset_as_dev_file_is_scored_on_its_validation_split(tmp_path):
    """train_file and dev_file may name one saved DatasetDict: the dev set is its validation split, not train."""
    folder = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["a", "b", "c", "d"], "label": ["x", "y", "x", "y"]}),
        "validation": datasets.Dataset.from_dict({"text": ["X", "Y"], "label": ["y", "x"]}),
    }).save_to_disk(str(folder))
    data = load_task_data(TaskConfig(name="mine", train_file=str(folder), dev_file=str(folder), text_columns=["text"]))
    assert data["train"]["text"] == ["a", "b", "c", "d"] and data["dev"]["text"] == ["X", "Y"]
    assert data["dev"]["label"] == [1, 0]


def test_user_labels_are_one_class_however_spaced_and_refused_when_only_case_tells_them_apart(tmp_path):
    (tmp_path / "spaced.csv").write_text("text, label\nhello, pos\nbye, neg\nhi, pos\n")
    data = load_task_data(TaskConfig(name="mine", train_file=str(tmp_path / "spaced.csv"),
                                     dev_file=str(tmp_path / "spaced.csv"), text_columns=["text"],
                                     label_column=" label"))
    assert data["train"]["label"] == [1, 0, 1]  # labels neg, pos (" pos" as written)
    (tmp_path / "cased.csv").write_text("text,label\n" + "".join(f"t{i},pos\n" for i in range(60)) + "u,Pos\nv,neg\n")
    with pytest.raises(DataError, match=r"labels \['Pos', 'pos'\] differ only in case"):
        load_task_data(TaskConfig(name="mine", train_file=str(tmp_path / "cased.csv"),
                                  dev_file=str(tmp_path / "cased.csv"), text_columns=["text"]))


@pytest.mark.parametrize("rows, settings, message", [
    ("text,label\na,x\nb,y\nc,z\n", {"metrics": ["f1"]}, r"task.metrics: f1 scores the positive class of a two-class "
                                                         r"task; this one has 3 classes"),
    ("text,score\na,1.5\nb,nan\n", {"regression": True, "label_column": "score"}, r"line 3: score 'nan' is not a "
                                                                                 r"finite number"),
    ("text,label\n", {}, r"no example"),
    ("text,label,note\na,x,n\nb,y,n\n0\n", {}, r"line 4: no label \(an empty field, or a row short of fields\)"),
])
def test_bad_user_files_are_one_line_errors_naming_the_problem(tmp_path, rows, settings, message):
    path = tmp_path / "data.csv"
    path.write_text(rows)
    with pytest.raises(DataError, match=message):
        load_task_data(TaskConfig(name="mine", train_file=str(path), dev_file=str(path), text_columns=["text"],
                                  label_names=None if rows != "text,label\n" else ["x", "y"], **settings))


def test_blank_lines_at_the_end_of_a_glue_file_are_not_examples(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\nfine\t1\nbad\t0\n\n\n")
    assert read_glue_tsv(path, get_task("sst2"))["label"] == [1, 0]
    (tmp_path / "header.tsv").write_text("sentence\tlabel\n")
    with pytest.raises(DataError, match="has a header line but no example"):
        read_glue_tsv(tmp_path / "header.tsv", get_task("sst2"))
