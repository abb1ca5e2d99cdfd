"""The README's Python quick start runs exactly as written, offline, and leaves the student in a folder of its own."""

import re
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification

ROOT = Path(__file__).resolve().parents[1]


def quick_start_code() -> str:
    """The first ```python block under the README's "## Python quick start" heading (the offline one; the hub variant
    after it needs the network)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_the_quick_start_needs_no_hub_model():
    code = quick_start_code()
    assert "from_pretrained(minilm" in code and 'resolve_model("minilm")' in code
    assert not re.search(r"from_pretrained\(\"[^\"]+/", code), "a hub name in the offline quick start"


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(quick_start_code(), "README quick start", "exec"), {})
    printed = capsys.readouterr().out
    # the whole dev set's accuracy, then its tuning and report halves' (distill/tasks/split.py)
    halves = r"'tuning/accuracy': 0\.\d+, 'report/accuracy': 0\.\d+"
    assert re.search(rf"^teacher \{{'accuracy': 0\.\d+, {halves}\}}$", printed, flags=re.M), printed
    assert re.search(rf"^student \{{'accuracy': 0\.\d+, {halves}\}}$", printed, flags=re.M), printed
    out = tmp_path / "runs" / "quickstart"
    student = AutoModelForSequenceClassification.from_pretrained(out / "student")
    assert student.config.num_hidden_layers == 3 and student.config.hidden_size == 384
    assert student.config.id2label == {0: "negative", 1: "positive"}
    # The student's folder holds the model and tokenizer only; the training checkpoints are in folders of their own.
    assert not (out / "student" / "checkpoints").exists() and not (out / "student" / "log.jsonl").exists()
    for folder in ("teacher_training", "student_training"):
        assert (out / folder / "log.jsonl").is_file() and (out / folder / "checkpoints").is_dir(), folder
