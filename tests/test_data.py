import datasets
import pytest

from distill.config import TaskConfig
from distill.data import DataError, get_task, load_task_data, read_glue_tsv, read_table


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
    from distill.data import ASSETS, load_task_data_with_source

    _, bundled = load_task_data_with_source(TaskConfig(name="sst2", max_eval_examples=32))
    assert (bundled.kind, bundled.location) == ("bundled", str(ASSETS / "sst2"))
    assert bundled.num_examples == {"train": 10000, "dev": 32} and bundled.num_available == {"train": 10000, "dev": 872}
    assert bundled.describe() == f"bundled sample ({ASSETS / 'sst2'}): 10000 train, first 32 of 872 dev examples"
    (tmp_path / "train.csv").write_text("text,label\na,x\nb,y\n")
    _, files = load_task_data_with_source(TaskConfig(name="mine", train_file=str(tmp_path / "train.csv"),
                                                     dev_file=str(tmp_path / "train.csv"), text_columns=["text"]))
    assert files.kind == "files" and files.describe().endswith("train.csv): 2 train, 2 dev examples")


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
