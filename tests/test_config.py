import dataclasses
from pathlib import Path

import pytest

from distill.config import ConfigError, PipelineConfig, fingerprint, load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["sst2_minilm.yaml", "smoke.yaml", "sweep_sst2.yaml", "general_minilm.yaml"])
def test_shipped_configs_load(name):
    config = load_config(ROOT / "configs" / name)
    assert config.task.name == "sst2"


def test_default_config_cuts_the_student_from_the_teacher_and_augments_by_the_pair_recipes_rule():
    """One data rule for every task family: the single-sentence default augments as the pair recipe does (copies of
    as many examples as fit a row budget, no first-N cut-off), with the paper's p and K."""
    config = load_config(ROOT / "configs" / "sst2_minilm.yaml")
    pair = load_config(ROOT / "configs" / "pair_minilm.yaml")
    assert (config.student.preset, config.student.init) == ("teacher-half", "teacher")
    assert (config.augment.replace_prob, config.augment.num_candidates) == (0.4, 15)
    rule = ("num_copies", "max_examples", "max_rows", "max_mlm_words")
    assert {key: getattr(config.augment, key) for key in rule} == {key: getattr(pair.augment, key) for key in rule}
    assert config.augment.max_examples is None and config.augment.max_rows == 25000


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("distill:\n  temperatur: 2\n", "unknown config key distill.temperatur"),
        ("distill:\n  temperature: -1\n", "distill.temperature: must be > 0"),
        ("augment:\n  replace_prob: 1.5\n", r"augment.replace_prob: must be in \[0, 1\]"),
        ("distill:\n  intermediate:\n    learning_rate: abc\n", "distill.intermediate.learning_rate: expected float"),
        ("task:\n  max_seq_length: 12.5\n", "task.max_seq_length: expected int"),
        ("distill:\n  weights: {atention: 1}\n", "distill.weights.atention: unknown loss term"),
        ("student:\n  init: pca\n", "student.init: must be random, teacher_embeddings, teacher or pruned"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("general:\n  weights: {prediction: 1}\n", "general.weights.prediction: unknown loss term"),
        ("general:\n  streaming: true\n  train: {num_epochs: 1, max_steps: null}\n",
         "general.train.max_steps: must be set when streaming"),
        ("general:\n  student: {init: pca}\n", "general.student.init: must be"),
        ("task:\n  max_seq_length: [64\n", r"bad.yaml, line 3, column 1: not valid YAML"),
        ("sweep:\n  - student: {preset: 2l-128}\n", r"sweep\[0\].name: required, and not given"),
        ("sweep:\n  - name: a\n  - name: a\n", r"sweep: student name\(s\) \['a'\] given more than once"),
        ("sweep:\n  - name: teacher\n", "sweep: a student may not be named 'teacher'"),
    ],
)
def test_bad_config_names_the_field(tmp_path, yaml_text, message):
    """Each bad value is refused naming its field: by the config's own checks, or, for names that registries of the
    layers above it define (loss terms, task types, metrics), by the job's preparation of it
    (distill.job.preflight.prepare, which every entry of the job calls first)."""
    from distill.job.preflight import prepare

    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        prepare(load_config(path))


@pytest.mark.parametrize("override, message", [
    ({"task.task_type": "sentiment"}, "task.task_type: must be .* got 'sentiment'"),
    ({"task.metrics": ["acc"]}, r"task.metrics: unknown metric\(s\) \['acc'\]"),
    ({"distill.weights": {"atention": 1.0}}, "distill.weights.atention: unknown loss term; use embedding")])
def test_names_of_the_registries_are_checked_by_the_job_not_the_config(override, message):
    """The config module imports nothing above it: it loads a name the registries do not know, and the job's
    preparation refuses it in one line before any stage (the command line prepares every config it loads)."""
    from distill.job.pipeline import plan_pipeline
    from distill.job.preflight import prepare

    config = load_config(None, override)  # loads: the config cannot know the registries' names
    with pytest.raises(ConfigError, match=message):
        prepare(config)
    with pytest.raises(ConfigError, match=message):
        plan_pipeline(config)


def test_augmentation_auto_is_resolved_by_the_task_type_when_the_job_prepares_the_config():
    from distill.job.preflight import prepare

    raw = load_config(None, {"augment.enabled": "auto", "task.name": "squad"})
    assert raw.augment.enabled == "auto"
    assert prepare(raw).augment.enabled is False  # QA: word replacement would move the answers
    assert prepare(load_config(None, {"augment.enabled": "auto"})).augment.enabled is True


def test_overrides_and_fingerprints():
    config = load_config(None, {"task.data_dir": "x", "teacher.model": None, "distill.layer_map": [1, 2]})
    assert config.task.data_dir == "x" and config.teacher.model is None and config.distill.layer_map == [1, 2]
    assert fingerprint(PipelineConfig().teacher) == fingerprint(PipelineConfig().teacher)
    assert fingerprint(config.task) != fingerprint(PipelineConfig().task)


def test_set_flags_override_any_field_with_yaml_values():
    from run_distill import set_overrides

    overrides = set_overrides(["student.init=random", "distill.layer_map=[1, 3]", "student.model=null",
                               "general.train={max_steps: 5, batch_size: 8}"])
    assert overrides == {"student.init": "random", "distill.layer_map": [1, 3], "student.model": None,
                         "general.train": {"max_steps": 5, "batch_size": 8}}
    config = load_config(ROOT / "configs" / "sst2_minilm.yaml", overrides, ignore_none=False)
    assert config.student.init == "random" and config.distill.layer_map == [1, 3]
    assert config.general.train.max_steps == 5 and config.general.train.batch_size == 8
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        set_overrides(["student.init"])
    with pytest.raises(ConfigError, match="student.init.x: init is not a section"):
        load_config(ROOT / "configs" / "sst2_minilm.yaml", {"student.init.x": 1})


def test_a_section_given_in_part_keeps_its_own_defaults_for_the_rest(tmp_path):
    """``--max-steps`` of ``distill --stage general`` is the override ``general.train.max_steps``: the general stage's
    other settings stay its own (learning rate 1e-4, the student from the teacher's embeddings), not those of a plain
    TrainConfig or StudentConfig; the same for a YAML section written in part."""
    defaults = PipelineConfig()
    config = load_config(None, {"general.train.max_steps": 10, "general.student.preset": "tinybert-4l-312",
                                "distill.prediction.num_epochs": 2, "mlm.train.batch_size": 8})
    assert config.general.train.max_steps == 10 and config.general.student.preset == "tinybert-4l-312"
    assert config.general.train.learning_rate == defaults.general.train.learning_rate == 1e-4
    assert config.general.student.init == defaults.general.student.init == "teacher_embeddings"
    assert config.distill.prediction.learning_rate == defaults.distill.prediction.learning_rate == 3e-5
    assert config.mlm.train.max_steps == defaults.mlm.train.max_steps == 400
    written = tmp_path / "mine.yaml"
    written.write_text("general:\n  train: {max_steps: 10}\n", encoding="utf-8")
    assert load_config(written).general.train == dataclasses.replace(defaults.general.train, max_steps=10)
    # Every field left out is the section's default; a field given replaces it (a mapping field as a whole).
    assert load_config(None, {"distill.weights": {"relation": 1.0}}).distill == dataclasses.replace(
        defaults.distill, weights={"relation": 1.0})


def test_augment_flags_come_from_the_config_fields_and_their_help(capsys):
    import dataclasses

    import run_distill
    from distill.config import AugmentConfig

    flags = {key: (flag, kind, text) for flag, key, kind, text in run_distill.augment_flags()}
    # Every field but the switch, the token-classification setting and the unlabelled text and its ranking (the
    # pipeline's: it fills the room the augmented set leaves), which the augment command does not take.
    assert set(flags) == {f.name for f in dataclasses.fields(AugmentConfig)} - {"enabled", "replace_entities",
                                                                                 "unlabelled", "unlabelled_ranked"}
    assert flags["num_copies"][:2] == ("--num-copies", int) and flags["max_vocab"][1] is int
    assert flags["replace_prob"][1] is float and "p_t" in flags["replace_prob"][2]
    args = run_distill.parse_args(["augment", "--mlm", "m", "--max-rows", "900", "--output-dir", "o"])
    assert args.max_rows == 900
    # Its own folder, always: without one it would write into the config's job folder (runs/sst2_minilm).
    with pytest.raises(SystemExit):
        run_distill.parse_args(["augment", "--mlm", "m"])
    assert "required: --output-dir" in capsys.readouterr().err


def test_a_setting_added_later_keeps_the_run_ids_of_outputs_made_before_it():
    """Run ids of the default config's stages, computed by the code before ``group_by_length`` existed: outputs made
    then are still found finished; turning the setting on gives the stages that read it new ids."""
    from distill.job.stages import STAGES

    def run_ids(config):
        return {name: spec.run_id(config, {i: "x" for i in spec.inputs}) for name, spec in STAGES.items()}

    before = {"teacher": "4d2ea927021c373f", "mlm": "ccaad421b9026bfa", "augmented": "00c4245b17bd731a",
              "teacher_logits": "3688d0ffc3d0fbd7", "student_intermediate": "884970031e968a9c",
              "student": "4f6ccce2b4d3a53e"}
    ids = run_ids(PipelineConfig())
    assert {name: ids[name] for name in before} == before
    assert fingerprint(PipelineConfig().general) == "9b437fb63dd5d259"
    # Turned on, it enters the ids of the stages that read it (the others see them through their run ids, "x" here).
    for section, stages in [("teacher.train", {"teacher"}), ("mlm.train", {"mlm"}),
                            ("distill.intermediate", {"student_intermediate"}), ("distill.prediction", {"student"})]:
        grouped = load_config(None, {f"{section}.group_by_length": True})
        assert {name for name, run_id in run_ids(grouped).items() if run_id != ids[name]} == stages, section
    cached = load_config(None, {"distill.teacher_cache": "float16"})  # the teacher-output cache, added later too
    assert {name for name, run_id in run_ids(cached).items() if run_id != ids[name]} == {"student_intermediate",
                                                                                         "teacher_outputs"}
    grouped = load_config(None, {"general.train.group_by_length": True})
    assert fingerprint(grouped.general) != "9b437fb63dd5d259"


@pytest.mark.parametrize("argv, pair, output_dir", [
    (["pipeline", "--task", "mrpc"], True, "runs/mrpc"),
    (["pipeline", "--task", "stsb", "--output-dir", "elsewhere"], True, "elsewhere"),
    (["seeds", "--task", "rte"], True, "runs/rte_seeds"),
    (["pipeline", "--task", "sst2"], False, "runs/sst2_minilm"),
    (["seeds", "--task", "stsb", "--output-dir", "mine"], True, "mine"),
    (["pipeline", "--task", "mrpc", "--config", "configs/sst2_minilm.yaml"], False, "runs/sst2_minilm"),
    # Another task on the default job's recipe (no recipe of its own) gets a folder of its own too.
    (["pipeline", "--task", "goemotions"], False, "runs/goemotions"),
    (["seeds", "--task", "cola"], False, "runs/cola_seeds"),
    # The student's shape follows the teacher (preset teacher-half), so a teacher of the user's gets the recipe too.
    (["pipeline", "--task", "mrpc", "--teacher", "my/bert-base-mrpc"], True, "runs/mrpc"),
])
def test_a_pair_or_regression_task_without_a_config_gets_the_pair_recipe(monkeypatch, capsys, argv, pair,
                                                                          output_dir):
    import run_distill

    seen = {}

    def record(config, args):  # stands in for the job: only the config it would run is checked
        seen["config"] = config
        return 0

    monkeypatch.chdir(ROOT)
    for command in ("pipeline", "seeds"):
        monkeypatch.setitem(run_distill.COMMANDS, command, record)
    monkeypatch.setattr(run_distill, "_setup_logging", lambda output_dir: None)
    assert run_distill.main(argv) == 0
    config = seen["config"]
    assert (config.output_dir, config.task.name) == (output_dir, argv[2])
    assert config.task.max_seq_length == (128 if pair else 64)  # the pair config's, or the default job's
    said = "configs/pair_minilm.yaml, the recipe for pair and regression tasks" in capsys.readouterr().err
    assert said == pair


@pytest.mark.parametrize("how, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_stop_outside_a_training_loop_exits_with_its_signals_code(monkeypatch, capsys, how, code):
    """SIGTERM while no training loop runs (loading data, augmenting) exits 128 + 15 as inside one; Ctrl-C 128 + 2."""
    import os
    import signal

    import run_distill

    def stopped(config, args):
        if how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)  # main's handler turns it into KeyboardInterrupt("SIGTERM")
        raise KeyboardInterrupt()

    monkeypatch.setitem(run_distill.COMMANDS, "pipeline", stopped)
    monkeypatch.setattr(run_distill, "_setup_logging", lambda output_dir: None)
    assert run_distill.main(["pipeline", "--task", "sst2"]) == code
    assert "interrupted: finished stages, checkpoints and augmentation shards are kept" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_config_loads_and_its_student_fits_its_teacher(path):
    from distill.job.preflight import check_student_fits_teacher
    from students import student_shape
    from teachers.models import load_config as load_model_config

    config = load_config(path)
    if config.teacher.base_model == "minilm":  # the bundled weights' config; MPNet is extracted on first use
        student_shape(config.student, load_model_config("minilm"))  # raises on an unknown preset or a bad shape
        check_student_fits_teacher(config)
    else:
        student_shape(config.student)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_config_that_augments_bounds_its_masked_lm_work(path):
    """A row budget does not bound augmentation's time (one masked row per word, as long as the text): every shipped
    recipe that augments also sets augment.max_mlm_words, so a task of long texts stays inside its stated time."""
    import yaml

    if "task" not in yaml.safe_load(path.read_text()):  # general_minilm.yaml: the general stage only, no task
        return
    config = load_config(path)
    if config.augment.enabled and config.augment.num_copies > 0:
        assert config.augment.max_mlm_words is not None and config.augment.max_mlm_words <= 9_000_000


def _recipe_of_the_measured_command(name: str, base: str, overrides: dict, **kwargs):
    """The shipped ``configs/<name>.yaml``, asserted equal field for field to ``configs/<base>.yaml`` with the measured
    command's ``--set`` values (``overrides``), its output folder ``runs/<name>`` aside; returned with the base."""
    import dataclasses

    recipe = load_config(ROOT / f"configs/{name}.yaml")
    measured = load_config(ROOT / f"configs/{base}.yaml", overrides, **kwargs)
    assert recipe.output_dir == f"runs/{name}"
    assert dataclasses.asdict(recipe) == dataclasses.asdict(dataclasses.replace(measured, output_dir=recipe.output_dir))
    return recipe, load_config(ROOT / f"configs/{base}.yaml")


def test_the_shipped_tinybert_recipe_is_the_measured_command():
    """configs/sst2_tinybert.yaml is the default job with the five settings of the measured 4-layer/312 recipe
    (docs/results.md) and the augmented set it was measured on (the first 1,000 examples, 20 copies), field for
    field: its stages reuse the default job's teacher and masked LM."""
    recipe, default = _recipe_of_the_measured_command("sst2_tinybert", "sst2_minilm", {
        "student.preset": "tinybert-4l-312", "student.init": "teacher_embeddings", "distill.teacher_cache": "float16",
        "distill.intermediate.num_epochs": 10, "distill.prediction.num_epochs": 3,
        "augment.num_copies": 20, "augment.max_examples": 1000, "augment.max_rows": None}, ignore_none=False)
    for section in ("task", "teacher", "mlm"):
        assert getattr(recipe, section) == getattr(default, section), section


def test_the_shipped_pair_tinybert_recipe_is_the_measured_command():
    """configs/pair_tinybert.yaml is the pair recipe with the six settings of the measured 4-layer/312 pair runs
    (docs/results.md, "The 4-layer/312 recipe on pairs"), field for field, and its general stage is the one those
    runs made: its teacher, masked LM and augmented set are the pair recipe's, so their folders can be reused."""
    from distill.job.general import general_config
    from distill.job.preflight import check_student_fits_teacher

    recipe, pair = _recipe_of_the_measured_command("pair_tinybert", "pair_minilm", {
        "student.preset": "tinybert-4l-312", "student.init": "teacher_embeddings", "general.enabled": True,
        "distill.teacher_cache": "float16", "distill.intermediate.num_epochs": 10, "distill.prediction.num_epochs": 3})
    check_student_fits_teacher(recipe)
    assert recipe.general.enabled and general_config(recipe).student.preset == "tinybert-4l-312"
    for section in ("task", "teacher", "mlm", "augment"):
        assert getattr(recipe, section) == getattr(pair, section), section


def test_the_shipped_pair_pruned_recipe_is_the_measured_command():
    """configs/pair_pruned.yaml is the pair recipe with the pruned 4-layer/312 student of the measured runs, ranked by
    Taylor importance (docs/results.md, "Pruned from the teacher" under the pair tasks), field for field, so the pair
    recipe's teacher, masked LM and augmented set folders can be reused; the shape is reachable from the MiniLM-L6
    teacher."""
    from distill.job.preflight import check_student_fits_teacher

    recipe, pair = _recipe_of_the_measured_command("pair_pruned", "pair_minilm", {
        "student.preset": "tinybert-4l-312", "student.init": "pruned", "student.pruning.importance": "taylor"})
    check_student_fits_teacher(recipe)
    for section in ("task", "teacher", "mlm", "augment", "distill"):
        assert getattr(recipe, section) == getattr(pair, section), section
    assert recipe.student != pair.student


def test_the_shipped_squad_pruned_recipe_is_the_measured_command():
    """configs/squad_pruned.yaml is the QA recipe with the pruned 4-layer/312 reader of the measured runs
    (docs/results.md, "The 4-layer/312 reader": `--set student.preset=tinybert-4l-312 --set student.init=pruned --set
    distill.prediction.num_epochs=2`), field for field, so those runs' teacher folders are this config's (the same
    run ids); the shape is reachable from the MiniLM-L6 teacher."""
    from distill.job.preflight import check_student_fits_teacher
    from distill.job.stages import STAGES

    recipe, squad = _recipe_of_the_measured_command("squad_pruned", "squad_minilm", {
        "student.preset": "tinybert-4l-312", "student.init": "pruned", "distill.prediction.num_epochs": 2})
    check_student_fits_teacher(recipe)
    for section in ("task", "teacher", "augment", "general", "report"):
        assert getattr(recipe, section) == getattr(squad, section), section
    assert STAGES["teacher"].run_id(recipe, {}) == STAGES["teacher"].run_id(squad, {})
    assert recipe.distill.prediction.num_epochs == 2 != squad.distill.prediction.num_epochs


def test_the_mpnet_pruned_sweep_reuses_the_measured_whole_set_pipeline():
    """configs/sweep_pruned_mpnet.yaml's 4-layer/312 entry is the measured whole-set MPNet pipeline (docs/results.md,
    "The whole training set as the transfer set"), field for field but the benchmark and the sweep list, so that
    pipeline's folders are the sweep's (every stage's run id equal); its students of equal depth share one
    teacher-output cache run id and the others do not."""
    import dataclasses

    from distill.job.pipeline import sweep_entries
    from distill.job.stage_distill import teacher_outputs_run_id
    from distill.method.layer_map import build_layer_map
    from distill.method.objective import intermediate_terms
    from students import student_shape
    from transformers import MPNetConfig

    sweep = load_config(ROOT / "configs/sweep_pruned_mpnet.yaml")
    measured = load_config(ROOT / "configs/sst2_mpnet.yaml", {
        "student.init": "pruned", "student.pruning.importance": "taylor", "teacher.max_train_examples_cpu": 10000,
        "distill.teacher_cache": "float16", "distill.intermediate.num_epochs": 1, "distill.prediction.num_epochs": 3,
        "distill.intermediate.group_by_length": True, "distill.prediction.group_by_length": True})
    entries = sweep_entries(sweep)
    entry = dataclasses.replace(entries["pruned-4l-312"], output_dir=measured.output_dir, sweep=measured.sweep,
                                benchmark=measured.benchmark)
    assert dataclasses.asdict(entry) == dataclasses.asdict(measured)

    def cache_id(config):  # as the pipeline computes it for the uniform map of the entry's depth from 12 layers
        depth = student_shape(config.student, MPNetConfig())["num_hidden_layers"]  # MPNet-base: 12 layers of 768
        layer_map = build_layer_map("uniform", 12, depth)
        return teacher_outputs_run_id(config, "teacher", "data", intermediate_terms(config.distill.weights), layer_map)

    ids = {name: cache_id(config) for name, config in entries.items()}
    assert ids["pruned-4l-312"] == ids["pruned-4l-192"] == ids["pruned-4l-96"]
    assert len({ids["pruned-4l-312"], ids["pruned-6l-384"], ids["pruned-2l-192"]}) == 3
    assert ids["teacher-half"] == ids["pruned-6l-384"]  # the same teacher layers 2, 4, ..., 12, whatever the width


@pytest.mark.parametrize("written, value", [("1e-4", 1e-4), ("1E-4", 1e-4), ("3e-4", 3e-4), ("5e+2", 500.0),
                                            (".5", 0.5), ("2", 2.0), ("1.0e-4", 1e-4), ("1_000.5", 1000.5)])
def test_a_float_field_takes_a_number_in_any_form_people_write(tmp_path, written, value):
    """YAML 1.1 reads 1e-4 (no dot) as the string "1e-4": a float field still takes it, from a file and from --set."""
    from run_distill import set_overrides

    path = tmp_path / "job.yaml"
    path.write_text(f"distill:\n  intermediate:\n    learning_rate: {written}\n")
    assert load_config(path).distill.intermediate.learning_rate == pytest.approx(value)
    overrides = set_overrides([f"distill.intermediate.learning_rate={written}", f"teacher.min_dev_metric={written}"])
    config = load_config(None, overrides)
    assert config.distill.intermediate.learning_rate == pytest.approx(value)
    assert config.teacher.min_dev_metric == pytest.approx(value)


@pytest.mark.parametrize("written, message", [
    ("-1e-4", r"distill.intermediate.learning_rate: must be > 0, got -0.0001"),  # the real error, not the type
    ("abc", r"distill.intermediate.learning_rate: expected float, got 'abc'"),
    ("1e-4x", r"distill.intermediate.learning_rate: expected float, got '1e-4x'"),
    ("nan", r"distill.intermediate.learning_rate: expected float, got 'nan'"),
    ("true", r"distill.intermediate.learning_rate: expected float, got True"),
])
def test_a_float_field_names_the_real_error(written, message):
    from run_distill import set_overrides

    with pytest.raises(ConfigError, match=message):
        load_config(None, set_overrides([f"distill.intermediate.learning_rate={written}"]))


def test_an_int_field_takes_a_whole_number_written_as_a_float():
    assert load_config(None, {"distill.intermediate.max_steps": "1e3"}).distill.intermediate.max_steps == 1000
    assert load_config(None, {"distill.intermediate.max_steps": 2.0e3}).distill.intermediate.max_steps == 2000
    with pytest.raises(ConfigError, match="task.max_seq_length: expected int, got '2.5e0'"):
        load_config(None, {"task.max_seq_length": "2.5e0"})


def test_mixed_precision_no_reads_as_the_string_yaml_would_make_a_boolean(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("teacher:\n  train: {mixed_precision: no}\n")  # YAML 1.1: a bare no is false
    assert load_config(path).teacher.train.mixed_precision == "no"
    assert load_config(None, {"distill.prediction.mixed_precision": False}).distill.prediction.mixed_precision == "no"
    with pytest.raises(ConfigError, match="mixed_precision: must be one of no, bf16, fp16, got 'yes'"):
        load_config(None, {"teacher.train.mixed_precision": "yes"})


@pytest.mark.parametrize("task, head, recipe, init", [
    ("mrpc", False, "pair_12layer.yaml", "pruned"), ("sst2", False, "sst2_12layer.yaml", "pruned"),
    ("wnut_17", True, "ner_12layer.yaml", "pruned"), ("goemotions", False, "sst2_12layer.yaml", "pruned")])
def test_a_12_layer_teacher_gets_its_task_types_12_layer_recipe(tmp_path, monkeypatch, capsys, task, head, recipe,
                                                                 init):
    """--teacher names a 12-layer model: a bare encoder is fine-tuned on the task (teacher.base_model), a fine-tuned
    one distilled as it is (teacher.model); either way the recipe is the type's for a 12-layer teacher (a pruned
    4-layer/312 student), not the MiniLM recipe's student at half the teacher's depth."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    import run_distill

    shape = BertConfig(vocab_size=40, hidden_size=24, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=48)
    teacher = tmp_path / "encoder"
    (BertForSequenceClassification(shape) if head else BertModel(shape)).save_pretrained(teacher)
    seen = {}
    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(run_distill.COMMANDS, "pipeline", lambda config, args: seen.update(config=config) or 0)
    monkeypatch.setattr(run_distill, "_setup_logging", lambda output_dir: None)
    argv = ["pipeline", "--teacher", str(teacher)] + (["--task", task] if task != "sst2" else [])
    assert run_distill.main(argv) == 0
    config = seen["config"]
    assert f"config: configs/{recipe}, " in capsys.readouterr().err
    assert config.student.preset == "tinybert-4l-312" and config.student.init == init
    assert config.output_dir == f"runs/{task}"
    if head:  # a fine-tuned teacher is distilled as it is
        assert config.teacher.model == str(teacher)
    else:  # an encoder is fine-tuned here
        assert (config.teacher.model, config.teacher.base_model) == (None, str(teacher))


def test_the_12_layer_pair_recipe_is_the_measured_mrpc_job():
    """configs/pair_12layer.yaml is configs/pair_pruned.yaml from MPNet with the teacher's outputs cached and three
    intermediate and three prediction epochs: the command its results in docs/results.md were measured with."""
    from distill.job.stages import STAGES

    def run_ids(config):
        return {name: spec.run_id(config, {i: "x" for i in spec.inputs}) for name, spec in STAGES.items()}

    recipe = load_config(ROOT / "configs/pair_12layer.yaml", {"task.name": "mrpc"})
    measured = load_config(ROOT / "configs/pair_pruned.yaml", {
        "task.name": "mrpc", "teacher.base_model": "mpnet", "distill.teacher_cache": "float16",
        "distill.intermediate.num_epochs": 3, "distill.prediction.num_epochs": 3})
    assert run_ids(recipe) == run_ids(measured)
