"""The README's Python quick start runs as written, with a local teacher in place of the hub one."""

import re
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from teachers.models import resolve_model

ROOT = Path(__file__).resolve().parents[1]
HUB_TEACHER = "textattack/bert-base-uncased-SST-2"


@pytest.mark.slow
def test_the_readme_quick_start_distils_and_evaluates(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python quick start", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert HUB_TEACHER in code
    # The hub is unreachable here: the bundled MiniLM with a new classifier head stands in for the teacher, and the
    # one epoch becomes 3 steps (the test checks the API, not the accuracy).
    teacher = tmp_path / "teacher"
    AutoModelForSequenceClassification.from_pretrained(resolve_model("minilm"), num_labels=2).save_pretrained(teacher)
    AutoTokenizer.from_pretrained(resolve_model("minilm")).save_pretrained(teacher)
    code = code.replace(HUB_TEACHER, str(teacher)).replace("TrainConfig(num_epochs=1,", "TrainConfig(max_steps=3,")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README quick start", "exec"), {})
    printed = capsys.readouterr().out
    assert re.search(r"\{'accuracy': 0\.\d+\}", printed), printed
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "runs" / "my_student")
    assert student.config.num_hidden_layers == 4 and student.config.hidden_size == 312
    assert (tmp_path / "runs" / "my_student" / "log.jsonl").is_file()
