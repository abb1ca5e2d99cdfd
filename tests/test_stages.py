"""Run ids derived from what each stage reads: a changed field re-runs the stages that read it and the ones after
them, and reuses the rest; a stage cannot read a field it does not declare."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from transformers import BertTokenizer

from distill.config import load_config
from distill.job.pipeline import run_pipeline
from distill.job.stages import STAGES, UndeclaredFieldError
from tests.conftest import SPECIAL, WORDS, tiny_job_every_stage

STAGE_FOLDERS = ("teacher", "mlm", "augmented", "teacher_logits", "student_intermediate", "student")


def _markers(out) -> dict[str, tuple[str, int]]:
    """Each stage's run id and when its stage.json was written."""
    return {stage: (json.loads((out / stage / "stage.json").read_text())["run_id"],
                    (out / stage / "stage.json").stat().st_mtime_ns) for stage in STAGE_FOLDERS}


def _changed(before: dict, after: dict) -> set[str]:
    return {stage for stage in STAGE_FOLDERS if before[stage] != after[stage]}


@pytest.fixture
def finished_run(tmp_path):
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = load_config(tiny_job_every_stage(tmp_path, tokenizer))
    run_pipeline(config)
    return config, tmp_path / "run"


def test_the_teacher_keeps_its_best_scored_weights(finished_run):
    config, out = finished_run
    record = json.loads((out / "teacher" / "stage.json").read_text())
    selection = record["selection"]
    # chosen on the dev set's tuning half
    assert selection["metric"] == "tuning/accuracy" and [step for step, _ in selection["evaluations"]] == [2]
    assert record["dev"]["tuning/accuracy"] == pytest.approx(selection["evaluations"][0][1])
    assert not (out / "teacher" / "best").exists()  # kept until the stage is done, then removed
    # The report says what was kept against what plain fine-tuning (the last step) gives.
    report = (out / "report.md").read_text()
    value = selection["evaluations"][0][1]
    assert f"step 2: {value:.4f}" in report and f"the best, step 2 ({value:.4f}), is kept" in report
    assert json.loads((out / "report.json").read_text())["teacher"]["selection"] == selection


def test_the_teacher_dev_metrics_are_the_selections_own_score_of_the_kept_weights(tmp_path, monkeypatch):
    """The kept weights were scored when selected: that score is the stage's dev record, the same numbers a fresh
    evaluation of the saved teacher gives, with no second pass over the dev set (one per evaluation only)."""
    import teachers.finetune as finetune
    from distill.tasks.data import load_task_data, task_spec
    from distill.tasks.evaluate import evaluate_task

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})
    config = load_config(tiny_job_every_stage(tmp_path, tokenizer))
    config = dataclasses.replace(config, teacher=dataclasses.replace(config.teacher, eval_steps=1))
    spec = task_spec(config.task)
    data = load_task_data(config.task, spec)
    calls = []
    real = finetune.evaluate

    def evaluate(*args, **kwargs):  # the real scores, and which evaluation gave them; the last one made the worst
        calls.append(1)
        scores = real(*args, **kwargs)
        if len(calls) == 2:
            scores = {name: value - 1.0 for name, value in scores.items()}
        return {**scores, "evaluation": len(calls)}

    monkeypatch.setattr(finetune, "evaluate", evaluate)
    monkeypatch.setattr(finetune, "evaluate_task", lambda *a, **k: pytest.fail("the dev set was scored again"))
    record = finetune.finetune_teacher(config.teacher, config.task, spec, data, tmp_path / "teacher", "id",
                                       device="cpu")
    evaluations = record["selection"]["evaluations"]
    assert [step for step, _ in evaluations] == [1, 2] and len(calls) == 2
    assert record["selection"]["best_step"] == 1
    assert record["dev"].pop("evaluation") == 1  # the kept step's scores, not the last evaluation's
    model = spec.type.model_class(spec).from_pretrained(tmp_path / "teacher")
    assert record["dev"] == evaluate_task(model, data, tokenizer, spec, config.task.max_seq_length, device="cpu")


def test_a_new_temperature_reruns_the_prediction_step_only(finished_run):
    config, out = finished_run
    before = _markers(out)
    old_student = before["student"][0]
    run_pipeline(dataclasses.replace(config, distill=dataclasses.replace(config.distill, temperature=2.0)))
    after = _markers(out)
    assert _changed(before, after) == {"student"}
    # The replaced output is kept, not deleted.
    kept = out / "superseded" / f"student-{old_student}"
    assert json.loads((kept / "stage.json").read_text())["run_id"] == old_student
    assert (kept / "model.safetensors").is_file()


def test_new_augmentation_settings_rerun_augmentation_and_what_follows(finished_run):
    config, out = finished_run
    before = _markers(out)
    run_pipeline(dataclasses.replace(config, augment=dataclasses.replace(config.augment, num_copies=3)))
    assert _changed(before, _markers(out)) == {"augmented", "teacher_logits", "student_intermediate", "student"}


def test_a_deleted_masked_lm_is_not_adapted_again_for_a_finished_augmented_set(finished_run):
    import shutil

    config, out = finished_run
    stages = [stage for stage in STAGE_FOLDERS if stage != "mlm"]
    before = {stage: (out / stage / "stage.json").stat().st_mtime_ns for stage in stages}
    shutil.rmtree(out / "mlm")
    run_pipeline(config)
    assert not (out / "mlm").exists()  # the augmented set it made is finished: nothing needs it
    assert {stage: (out / stage / "stage.json").stat().st_mtime_ns for stage in stages} == before


def test_speed_only_settings_rerun_nothing(finished_run):
    config, out = finished_run
    before = _markers(out)
    run_pipeline(dataclasses.replace(config, augment=dataclasses.replace(config.augment, batch_size=7)))
    assert _changed(before, _markers(out)) == set()


def test_a_stage_cannot_read_a_field_it_does_not_declare():
    config = load_config(None)
    view = STAGES["student"].view(config)
    assert view.distill.temperature == 1.0  # declared
    assert view.distill.prediction.learning_rate == config.distill.prediction.learning_rate  # inside a declared section
    assert view.distill.weights.get("prediction", 1.0) == 1.0
    for read in (lambda: view.distill.layer_map, lambda: view.teacher, lambda: view.distill.weights.get("hidden")):
        with pytest.raises(UndeclaredFieldError, match=r"stage 'student' read config field 'distill\.|'teacher'"):
            read()


def test_run_ids_follow_the_declared_fields_and_inputs():
    config = load_config(None)
    spec = STAGES["student_intermediate"]
    inputs = {"teacher": "t", "augmented": "a", "general": "g"}
    base = spec.run_id(config, inputs)
    assert spec.run_id(dataclasses.replace(config, distill=dataclasses.replace(config.distill, temperature=3.0)),
                       inputs) == base
    assert spec.run_id(dataclasses.replace(config, distill=dataclasses.replace(config.distill, layer_map="last")),
                       inputs) != base
    assert spec.run_id(config, {**inputs, "teacher": "t2"}) != base
    assert spec.run_id(config, {**inputs, "general": "g2"}) != base


def test_the_teachers_bar_is_not_in_its_run_id():
    """teacher.min_dev_metric decides whether the job goes on with the teacher, not the teacher: lowering it after a
    refusal, as the refusal suggests, keeps the run id, so the finished fine-tuning is scored again, not redone."""
    config = load_config(None)
    spec = STAGES["teacher"]
    lowered = dataclasses.replace(config, teacher=dataclasses.replace(config.teacher, min_dev_metric=0.3))
    assert spec.run_id(lowered, {}) == spec.run_id(config, {})
    other = dataclasses.replace(config, teacher=dataclasses.replace(config.teacher, select_best=False))
    assert spec.run_id(other, {}) != spec.run_id(config, {})


def test_local_word_vectors_and_stop_words_count_by_their_bytes(tmp_path):
    """An edited GloVe or stop-word file re-runs augmentation; the same bytes elsewhere do not; the default names (an
    installed package, NLTK's list) count by name, so the shipped configs' run ids stay as they were."""
    config = load_config(None)
    spec = STAGES["augmented"]
    default = spec.run_id(config, {"mlm": "m"})
    vectors, stopwords = tmp_path / "vectors.txt", tmp_path / "stop.txt"
    vectors.write_text("film 0.1 0.2\nmovie 0.1 0.3\n")
    stopwords.write_text("the\na\n")

    def run_id(**fields):
        return spec.run_id(dataclasses.replace(config, augment=dataclasses.replace(config.augment, **fields)),
                           {"mlm": "m"})

    before = run_id(word_vectors=str(vectors), stopwords=str(stopwords))
    assert before != default
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "v.txt").write_bytes(vectors.read_bytes())
    (moved / "s.txt").write_bytes(stopwords.read_bytes())
    assert run_id(word_vectors=str(moved / "v.txt"), stopwords=str(moved / "s.txt")) == before
    vectors.write_text("film 0.1 0.2\nmovie 0.1 0.4\n")
    assert run_id(word_vectors=str(vectors), stopwords=str(stopwords)) != before
    vectors.write_text("film 0.1 0.2\nmovie 0.1 0.3\n")
    stopwords.write_text("the\nan\n")
    assert run_id(word_vectors=str(vectors), stopwords=str(stopwords)) != before


def test_the_general_stage_is_made_once_and_reused_by_another_output_folder(finished_run):
    """The general-distilled student lives in the cache, keyed by teacher, student shape, corpus and settings: a second
    output folder of the same job (or another task) starts from it without making it again."""
    config, out = finished_run
    general = json.loads((out / "general.json").read_text())
    marker = json.loads((out / "student_intermediate" / "stage.json").read_text())
    assert marker["start"] == general["folder"] and general["steps"] == 2
    made = (Path(general["folder"]) / "stage.json").stat().st_mtime_ns
    other = dataclasses.replace(config, output_dir=str(out.parent / "other"))
    run_pipeline(other)
    assert json.loads((out.parent / "other" / "general.json").read_text())["run_id"] == general["run_id"]
    assert (Path(general["folder"]) / "stage.json").stat().st_mtime_ns == made
    # A new student shape is another general stage.
    shape = dataclasses.replace(config.student, hidden_size=8, intermediate_size=16)
    run_pipeline(dataclasses.replace(other, student=shape))
    assert json.loads((out.parent / "other" / "general.json").read_text())["run_id"] != general["run_id"]


def _status(config) -> dict[str, str]:
    from distill.job.pipeline import plan_pipeline

    return {row["stage"]: row["action"] for row in plan_pipeline(config)}


def test_a_dry_run_reads_the_finished_folder_and_changes_nothing(finished_run):
    config, out = finished_run
    before = _markers(out)
    assert {stage: action for stage, action in _status(config).items() if stage in (*STAGE_FOLDERS, "general")} == {
        stage: "reuse" for stage in (*STAGE_FOLDERS, "general")}
    hotter = dataclasses.replace(config, distill=dataclasses.replace(config.distill, temperature=2.0))
    planned = _status(hotter)
    assert planned["student"] == "replace" and planned["student_intermediate"] == "reuse"
    assert _markers(out) == before and not (out / "superseded").exists()  # the plan moved nothing
    run_pipeline(hotter)
    assert _changed(before, _markers(out)) == {stage for stage, action in planned.items() if action != "reuse"
                                               and stage in STAGE_FOLDERS}


def test_editing_a_data_file_reruns_exactly_the_stages_that_read_it(finished_run, tmp_path):
    """Run ids cover the bytes of the data files a stage reads, not their path: a label flipped in train.tsv re-runs
    the teacher, augmentation and everything after them (the masked LM does not read the task); a copy of the same
    files elsewhere, or a file the task does not read, re-runs nothing."""
    config, out = finished_run
    data = Path(config.task.data_dir)
    before = _markers(out)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (copy / name).write_bytes((data / name).read_bytes())
    (copy / "test.tsv").write_text("sentence\nnot read by the task\n")
    moved = dataclasses.replace(config, task=dataclasses.replace(config.task, data_dir=str(copy)))
    run_pipeline(moved)
    assert _changed(before, _markers(out)) == set()
    lines = (copy / "train.tsv").read_text().splitlines()
    sentence, label = lines[1].split("\t")
    lines[1] = f"{sentence}\t{1 - int(label)}"
    (copy / "train.tsv").write_text("\n".join(lines) + "\n")
    run_pipeline(moved)
    assert _changed(before, _markers(out)) == {"teacher", "augmented", "teacher_logits", "student_intermediate",
                                               "student"}


def test_a_teacher_retrained_into_the_same_folder_reruns_what_reads_it(tmp_path, tiny_tokenizer):
    from tests.conftest import tiny_bert, tiny_job

    config = load_config(tiny_job(tmp_path, tiny_bert(seed=0), tiny_tokenizer))
    out = Path(config.output_dir)
    run_pipeline(config)
    stages = ("teacher", "teacher_logits", "student_intermediate", "student")
    before = {stage: json.loads((out / stage / "stage.json").read_text())["run_id"] for stage in stages}
    # The same weights copied elsewhere are the same teacher.
    copy = tmp_path / "copy_of_teacher"
    copy.mkdir()
    for file in Path(config.teacher.model).iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    assert _status(dataclasses.replace(config, teacher=dataclasses.replace(config.teacher, model=str(copy))))[
        "teacher"] == "reuse"
    tiny_bert(seed=1).save_pretrained(config.teacher.model)  # "retrained" at the same path
    assert {stage: action for stage, action in _status(config).items() if stage in stages} == {
        stage: "replace" for stage in stages}
    run_pipeline(config)
    after = {stage: json.loads((out / stage / "stage.json").read_text())["run_id"] for stage in stages}
    assert all(after[stage] != before[stage] for stage in stages)


def test_the_general_cache_is_keyed_by_the_teachers_weights_not_its_path(tmp_path, tiny_tokenizer, monkeypatch):
    """Two projects each with a teacher saved as runs/teacher: two cache entries; the same teacher copied: one."""
    from distill.config import GeneralConfig
    from distill.job.general import general_run_id
    from tests.conftest import tiny_bert

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the movie was good\n")
    ids = []
    for project, seed in (("a", 0), ("b", 1), ("c", 0)):
        monkeypatch.chdir(tmp_path)
        (tmp_path / project).mkdir()
        monkeypatch.chdir(tmp_path / project)
        tiny_bert(seed=seed).save_pretrained("runs/teacher")
        tiny_tokenizer.save_pretrained("runs/teacher")
        ids.append(general_run_id(GeneralConfig(teacher="runs/teacher", corpus=[str(corpus)]))[0])
    assert ids[0] != ids[1] and ids[0] == ids[2]


def test_a_refused_run_leaves_a_finished_folder_as_it_was(finished_run):
    from distill.tasks import DataError

    config, out = finished_run
    saved = {path: path.read_bytes() for path in (out / "config.json", out / "report.json",
                                                   *(out / stage / "stage.json" for stage in STAGE_FOLDERS))}
    with pytest.raises(DataError, match="sst3"):
        run_pipeline(dataclasses.replace(config, task=dataclasses.replace(config.task, name="sst3")))
    assert {path: path.read_bytes() for path in saved} == saved
    assert not (out / "superseded").exists()


def test_a_given_teachers_run_id_ignores_the_fine_tuning_settings_it_does_not_use():
    given = load_config(None, {"teacher.model": "org/fine-tuned"})
    teacher = STAGES["teacher"]
    unused = load_config(None, {"teacher.model": "org/fine-tuned", "teacher.train.learning_rate": 1e-3,
                                "teacher.base_model": "bert-base-uncased", "teacher.eval_steps": 50})
    assert teacher.run_id(unused, {}) == teacher.run_id(given, {})  # nothing is fine-tuned: nothing to redo
    assert teacher.run_id(load_config(None, {"teacher.model": "org/other"}), {}) != teacher.run_id(given, {})
    fine_tuned = load_config(None)  # with nothing given, the same settings make another teacher
    assert teacher.run_id(load_config(None, {"teacher.train.learning_rate": 1e-3}), {}) != teacher.run_id(fine_tuned, {})
