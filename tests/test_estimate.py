"""The dry run's estimate of each stage's minutes (distill/job/estimate.py): the work counted from the config and the
data (steps, rows through the teacher, masked-LM words), priced by a clock; a clock that says the same seconds for
every shape here, so the counting is checked by hand."""

import math

import pytest

from distill.config import load_config
from distill.job.estimate import LOOP_OVERHEAD, Clock, Lengths, estimate_minutes
from distill.job.pipeline import plan_markdown
from distill.tasks import get_task
from distill.tasks.data import load_task_data


class FixedClock(Clock):
    """Every training step takes 2 s and every forward pass 0.5 s, whatever the shape (nothing is timed)."""

    def __init__(self):
        self.measured, self.busy, self.calls = 0, False, []

    def seconds(self, config, batch, length, kind):
        self.calls.append((config.num_hidden_layers, batch, kind))
        return 2.0 if kind.endswith("step") else 0.5


@pytest.fixture(scope="module")
def job():
    config = load_config("sst2_minilm.yaml", {"task.max_train_examples": 100, "task.max_eval_examples": 40,
                                              "augment.max_examples": 20, "augment.num_copies": 3,
                                              "augment.max_rows": None})
    return config, load_task_data(config.task), get_task("sst2")


def test_each_stage_is_its_steps_and_passes_priced_by_the_clock(job):
    config, data, spec = job
    stages = ["teacher", "mlm", "augmented", "student_intermediate", "teacher_logits", "student", "general"]
    rows = [{"stage": name, "action": "run"} for name in stages] + [{"stage": "report", "action": "reuse"}]
    clock = FixedClock()
    minutes = estimate_minutes(config, rows, data, spec, clock)
    assert "report" not in minutes and "general" in minutes  # a reused stage costs nothing
    rows_trained = 100 + 20 * 3  # the first 20 examples three times over, beside the 100
    scale = (1 + LOOP_OVERHEAD) / 60

    def steps(train, count):
        return train.max_steps or max(math.ceil(train.num_epochs * math.ceil(count / train.batch_size)),
                                      train.min_steps or 0)

    teacher = config.teacher.train
    evaluations = max(1, math.ceil(teacher.num_epochs))  # dev scored after each epoch, the best kept
    assert minutes["teacher"] == pytest.approx((steps(teacher, 100) * 2.0 + evaluations * math.ceil(40 / 64) * 0.5)
                                               * scale)
    assert minutes["mlm"] == pytest.approx(config.mlm.train.max_steps * 2.0 * scale)
    step1 = config.distill.intermediate
    no_cache = 0 if config.distill.teacher_cache else steps(step1, rows_trained) * 0.5  # the teacher beside it
    assert minutes["student_intermediate"] == pytest.approx((steps(step1, rows_trained) * 2.0 + no_cache) * scale)
    assert minutes["teacher_logits"] == pytest.approx(math.ceil(rows_trained / 64) * 0.5 * scale)
    assert minutes["student"] == pytest.approx((steps(config.distill.prediction, rows_trained) * 2.0 + 0.5) * scale)
    assert minutes["augmented"] > 0
    # the student is priced at its own shape (3 layers, cut from the 6-layer teacher), the teacher at its own
    assert {layers for layers, _, _ in clock.calls} == {3, 6}


def test_a_resumed_stage_is_priced_from_its_newest_checkpoint_on(job, tmp_path):
    config, data, spec = job
    folders = {name: tmp_path / name for name in ("teacher", "student")}
    steps = {"teacher": math.ceil(config.teacher.train.num_epochs * math.ceil(100 / config.teacher.train.batch_size)),
             "student": config.distill.prediction.max_steps or math.ceil(
                 config.distill.prediction.num_epochs * math.ceil(160 / config.distill.prediction.batch_size))}
    for name, folder in folders.items():  # half the steps behind each (an older checkpoint beside the newest)
        (folder / "checkpoints" / f"step-{steps[name] // 4:06d}").mkdir(parents=True)
        (folder / "checkpoints" / f"step-{steps[name] // 2:06d}").mkdir()
    fresh = [{"stage": name, "action": "run", "folder": str(folder)} for name, folder in folders.items()]
    resumed = [{**row, "action": "resume"} for row in fresh]
    whole = estimate_minutes(config, fresh, data, spec, FixedClock())
    left = estimate_minutes(config, resumed, data, spec, FixedClock())
    scale = (1 + LOOP_OVERHEAD) / 60
    for name in folders:  # the steps behind it, at 2 s each, left out (and the dev evaluations among them)
        saved = whole[name] - left[name]
        assert saved >= steps[name] // 2 * 2.0 * scale - 1e-9
        assert saved <= (steps[name] // 2 * 2.0 + config.teacher.train.num_epochs * 0.5) * scale + 1e-9
    empty = [{"stage": "student", "action": "resume", "folder": str(tmp_path / "nothing")}]  # no checkpoint yet
    assert estimate_minutes(config, empty, data, spec, FixedClock())["student"] == pytest.approx(whole["student"])


def test_a_sweeps_student_is_priced_at_its_own_shape(job):
    config, data, spec = job
    small = load_config("sst2_minilm.yaml", {"student.preset": None, "student.num_hidden_layers": 2,
                                             "student.hidden_size": 192, "student.intermediate_size": 768,
                                             "student.num_attention_heads": 12, "student.init": "random"})
    rows = [{"stage": "small: student", "action": "run"}, {"stage": "half: student", "action": "run"}]
    clock = FixedClock()
    minutes = estimate_minutes(config, rows, data, spec, clock, entries={"small": small, "half": config})
    assert set(minutes) == {"small: student", "half: student"}
    assert sorted({layers for layers, _, kind in clock.calls if kind == "step"}) == [2, 3]


def test_a_random_batch_pads_to_its_longest_a_grouped_one_to_about_the_mean():
    import numpy as np

    lengths = Lengths(np.array([10.0] * 31 + [100.0]), np.array([5.0]))
    assert lengths.padded(32, grouped=True) == pytest.approx(np.mean([10.0] * 31 + [100.0]))
    assert lengths.padded(32, grouped=False) > 50  # most batches of 32 drawn from them hold the long one
    assert lengths.padded(32, grouped=True, dev=True) == 5.0


def test_the_plan_shows_each_stages_minutes_and_a_dash_where_none():
    rows = [{"stage": "teacher", "action": "run", "run_id": "abc", "folder": "runs/x/teacher"},
            {"stage": "general", "action": "skip", "run_id": None, "folder": None, "why": "general.enabled is false"}]
    table = plan_markdown(rows, {"teacher": 12.34})
    assert table.splitlines()[0].split() == ["stage", "action", "min", "run", "id", "folder"]
    assert "12.3" in table.splitlines()[1] and table.splitlines()[2].split()[2] == "-"
    assert "min" not in plan_markdown(rows).splitlines()[0]  # without an estimate, no column


def test_the_dry_run_prints_the_plan_with_minutes_then_the_data_and_the_config_only_when_asked(tmp_path, capsys,
                                                                                                 monkeypatch):
    import run_distill

    monkeypatch.delenv("TINYDISTILL_ESTIMATE")
    monkeypatch.setattr("distill.job.estimate._measure", lambda config, batch, length, kind: 0.25)
    monkeypatch.setattr("distill.job.estimate._load", lambda: 0.0)  # an idle machine: its timings are kept
    command = ["pipeline", "--config", "smoke.yaml", "--output-dir", str(tmp_path / "run"), "--dry-run"]
    assert run_distill.main(command) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].split()[:3] == ["stage", "action", "min"] and lines[1].split()[0] == "teacher"
    estimate = next(line for line in lines if line.startswith("estimated: "))
    assert "on this machine (timed " in estimate and lines.index(estimate) < lines.index(
        next(line for line in lines if line.startswith("data: ")))
    assert "task:" not in printed and "--show-config" in lines[-1]  # the resolved config only when asked
    assert run_distill.main([*command, "--show-config"]) == 0
    again = capsys.readouterr().out
    assert "\ntask:\n" in again and "from the model shapes' timings on this machine" in again  # kept, not timed again


def test_the_clock_times_a_real_model_at_a_fractional_mean_length_and_keeps_it(tmp_path, monkeypatch):
    """The lengths the estimate asks for are means (fractions of a token): the clock times a real model at the
    whole length it keys the timing by, and a second clock reads the timing from the file instead of timing again."""
    from transformers import BertConfig

    monkeypatch.setattr("distill.job.estimate._load", lambda: 0.0)  # an idle machine: its timings are kept
    config = BertConfig(vocab_size=1100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    clock = Clock(tmp_path / "timings.json")
    for kind in ("step", "forward", "latency"):
        assert clock.seconds(config, 4, 13.4, kind) > 0
    assert clock.measured == 3
    again = Clock(tmp_path / "timings.json")
    assert again.known_seconds(config, 4, 15.9, "step") == clock.known_seconds(config, 4, 13.4, "step")  # both 16
    again.seconds(config, 4, 13.4, "forward")
    assert again.measured == 0


def test_unlabelled_text_counts_the_rows_it_adds_and_the_sentences_the_teacher_ranks(tmp_path):
    """The distillation set holds the unlabelled text's rows in the room ``max_rows`` leaves, as the run fills it: at
    ranked share r, room / r sentences drawn (fewer when the text has fewer), the teacher scores them all and the r
    share is kept, never more than the room."""
    import dataclasses

    from distill.config import AugmentConfig
    from distill.job.estimate import _unlabelled_rows

    text = tmp_path / "text.txt"
    text.write_text("".join(f"line number {i} here\n" for i in range(10)) + "too short\n")  # ten of three words or more
    augment = AugmentConfig(unlabelled=[str(text)], max_rows=20)
    assert _unlabelled_rows(augment, 12) == (8, 0)  # the room: 8 of the 10 lines, no ranking
    assert _unlabelled_rows(dataclasses.replace(augment, unlabelled_ranked=0.5), 12) == (5, 10)  # 16 asked, 10 there
    assert _unlabelled_rows(dataclasses.replace(augment, unlabelled_ranked=0.5), 19) == (1, 2)  # room 1: 2 drawn
    assert _unlabelled_rows(dataclasses.replace(augment, unlabelled=[]), 12) == (0, 0)
