"""The `augment` command through the real CLI: a user's CSV, a tiny masked LM and a GloVe-format file on disk."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import BertModel, BertTokenizer

from run_distill import main
from tests.conftest import SPECIAL, WORDS, tiny_bert_config, tiny_masked_lm, tiny_vectors

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def assets(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    tiny_masked_lm().save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    vectors = tiny_vectors()
    (tmp_path / "glove.txt").write_text(
        "".join(f"{w} {' '.join(str(x) for x in vectors[w])}\n" for w in vectors.index_to_key))
    (tmp_path / "data.csv").write_text(
        "id,text,label\n"
        'a,"The movie was wonderful, the plot terrible.",1\n'
        "b,a boring film,0\n"
        "c,Great cast and a fine story !,1\n"
    )
    return tmp_path


def _cli(assets, *extra):
    args = ["augment", "--input", str(assets / "data.csv"), "--text-columns", "text", "--mlm", str(assets / "mlm"),
            "--word-vectors", str(assets / "glove.txt"), "--num-copies", "6", "--replace-prob", "0.5",
            "--output-dir", str(assets / "out"), *extra]
    return subprocess.run([sys.executable, str(ROOT / "run_distill.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=assets)


def test_augment_command_on_a_csv_file(assets):
    result = _cli(assets, "--export", str(assets / "augmented.jsonl"))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((assets / "out" / "stage.json").read_text())
    assert record["num_examples"] == 3 and record["num_rows"] > 3 and record["num_augmented"] == record["num_rows"] - 3
    assert f"{record['num_rows']} rows ({record['num_augmented']} augmented) from 3 examples" in result.stdout
    rows = [json.loads(line) for line in (assets / "augmented.jsonl").read_text().splitlines()]
    assert len(rows) == record["num_rows"]
    assert set(rows[0]) == {"id", "text", "label", "source_index", "is_augmented"}
    by_id = {"a": 1, "b": 0, "c": 1}
    assert all(row["label"] == by_id[row["id"]] for row in rows)  # other columns kept with their rows
    assert any(row["is_augmented"] and row["text"].startswith("The ") for row in rows)  # casing kept

    again = _cli(assets)
    assert again.returncode == 0 and "complete; skipping" in again.stderr
    other = _cli(assets, "--seed", "7")
    assert other.returncode == 2 and "holds the output of another run" in other.stderr
    # The input counts by its bytes: the same file edited in place (same rows, one word) is another run, not the
    # finished shards of the old text.
    data = assets / "data.csv"
    data.write_text(data.read_text().replace("a boring film", "a boring play"))
    edited = _cli(assets)
    assert edited.returncode == 2 and "holds the output of another run" in edited.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mlm", None], "augment needs a masked LM: pass --mlm"),
        (["--mlm", "encoder"], "has no masked-LM head .* adapt-mlm"),
        (["--text-columns", "sentence"], r"missing column\(s\) \['sentence'\]; present: \['id', 'text', 'label'\]"),
        (["--text-columns", "label"], r"column\(s\) \['label'\] are not text"),
        (["--replace-prob", "1.5"], r"augment.replace_prob: must be in \[0, 1\]"),
        (["--word-vectors", "missing.txt"], "word vectors 'missing.txt' not found"),
    ],
)
def test_augment_command_errors(assets, capsys, extra, message):
    args = {"--input": str(assets / "data.csv"), "--text-columns": "text", "--mlm": str(assets / "mlm"),
            "--word-vectors": str(assets / "glove.txt"), "--output-dir": str(assets / "out")}
    flag, value = extra
    args[flag] = str(assets / value) if value in ("encoder",) else value
    argv = ["augment"] + [part for k, v in args.items() if v is not None for part in (k, v)]
    assert main(argv) == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_augment_refuses_a_multi_process_launch(assets, monkeypatch):
    """Every process would write the same shards; the pipeline's stage is the one that shares augmentation out."""
    from distill.job.augmentation import run_augment
    from distill.config import ConfigError, load_config

    config = load_config(None, {"output_dir": str(assets / "out"), "mlm.model": str(assets / "mlm"),
                                "augment.word_vectors": str(assets / "glove.txt")})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="augment runs in one process"):
        run_augment(config, str(assets / "data.csv"), ["text"])
    assert not (assets / "out").exists()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert run_augment(config, str(assets / "data.csv"), ["text"])["num_examples"] == 3
