"""What a new user meets first (issue 27, findings 7, 9, 12, 14): the shipped configs found from any directory, one
``error:`` line for a wrong path or an unreachable hub, the command named as it was run, ``--version``, the API in
``dir``/``help``, stage messages from Python without library chatter, and ``export`` checked on the run's own dev set.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

import run_distill
from distill.config import ConfigError, load_config, resolve_config, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(path.name for path in (ROOT / "configs").glob("*.yaml"))


def _error_line(err: str) -> str:
    """The one ``error:`` line of a refused command's stderr (log lines before it are allowed, a traceback not)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def _record_config(monkeypatch) -> dict:
    """Stand the pipeline command in with one that keeps the config it would run."""
    seen = {}

    def record(config, args):
        seen["config"] = config
        return 0

    monkeypatch.setitem(run_distill.COMMANDS, "pipeline", record)
    monkeypatch.setattr(run_distill, "_setup_logging", lambda output_dir: None)
    return seen


# --- finding 7: the shipped configs, from any directory ---

def test_the_shipped_configs_are_the_repositorys_in_a_checkout():
    assert shipped_configs() == ROOT / "configs" and "smoke.yaml" in SHIPPED


@pytest.mark.parametrize("given", ["configs/smoke.yaml", "smoke.yaml", "smoke", "./configs/smoke.yaml"])
def test_a_shipped_config_is_found_by_name_from_another_directory(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    assert resolve_config(given) == ROOT / "configs" / "smoke.yaml"
    seen = _record_config(monkeypatch)
    assert run_distill.main(["pipeline", "--config", given]) == 0
    assert seen["config"].output_dir == "runs/smoke" and seen["config"].task.max_train_examples == 48


def test_a_relative_config_that_exists_is_the_file_named(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "smoke.yaml").write_text("output_dir: mine\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config("configs/smoke.yaml") == Path("configs/smoke.yaml")
    assert load_config("configs/smoke.yaml").output_dir == "mine"


def test_a_config_found_nowhere_is_one_error_line_listing_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"config configs/smok.yaml not found: looked for .*configs/smok.yaml and "
                                          r"among the shipped configs in .*\(.*general_minilm.yaml, .*smoke.yaml"):
        resolve_config("configs/smok.yaml")
    assert run_distill.main(["pipeline", "--config", "nope.yaml", "--output-dir", str(tmp_path / "run")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "nope.yaml not found" in line and ", ".join(SHIPPED) in line
    assert not (tmp_path / "run").exists()


def test_the_command_is_named_as_it_was_run_and_has_a_version(monkeypatch, capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        run_distill.main(["pipeline", "--help"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("usage: run_distill.py pipeline ")
    monkeypatch.setattr(sys, "argv", ["run-distill", "export", "--help"])
    with pytest.raises(SystemExit):
        run_distill.console_main()
    assert capsys.readouterr().out.startswith("usage: run-distill export ")
    with pytest.raises(SystemExit) as stop:
        run_distill.main(["--version"], prog="run-distill")
    assert stop.value.code == 0 and capsys.readouterr().out == f"run-distill {version('tinydistill')} (tinydistill)\n"


def test_each_command_says_its_own_default_config(capsys):
    helps = {}
    for command in ("pipeline", "seeds", "distill", "sweep", "benchmark", "export", "augment", "adapt-mlm"):
        with pytest.raises(SystemExit):
            run_distill.parse_args([command, "--help"])
        helps[command] = " ".join(capsys.readouterr().out.split())
    for command in ("pipeline", "seeds"):
        assert "default: sst2_minilm.yaml; without --config, a task's own recipe" in helps[command]
        assert "mrpc, stsb" in helps[command] and "wnut_17, conll2003: ner_minilm.yaml" in helps[command]
        assert "ner_minilm.yaml" in helps[command] and "squad: squad_minilm.yaml" in helps[command]
    assert "default: sweep_sst2.yaml" in helps["sweep"]
    assert "default: the config.json of the pipeline output folder that --student names" in helps["export"]
    assert "default: none, the built-in defaults" in helps["augment"] and "default: none" in helps["adapt-mlm"]
    assert "--output-dir" not in helps["export"]  # the ONNX files go beside the checkpoint, student/onnx/
    # The login the upload needs, with the command the installed huggingface_hub ships (hf; huggingface-cli is gone).
    assert "needs a token: hf auth login" in helps["pipeline"] and "huggingface-cli" not in helps["pipeline"]
    assert "the task data read as the run reads it (bad data refused as the run would)" in helps["pipeline"]
    with pytest.raises(SystemExit):
        run_distill.parse_args(["export", "--student", "x", "--output-dir", "y"])
    assert "unrecognized arguments: --output-dir" in capsys.readouterr().err


def test_options_before_a_command_name_the_command_to_add(capsys):
    """`run_distill.py --config configs/x.yaml` left argparse to take the path for the command."""
    with pytest.raises(SystemExit):
        run_distill.parse_args(["--config", "configs/sst2_pruned.yaml", "--dry-run"])
    err = capsys.readouterr().err
    assert "--config: name the command first, e.g. run_distill.py pipeline --config configs/sst2_pruned.yaml --dry-run" \
        in err and "commands: pipeline, distill, seeds, compress, sweep" in err and "invalid choice" not in err
    with pytest.raises(SystemExit):  # the command given after its options is moved to the front
        run_distill.parse_args(["--config", "sweep_pruned_sst2", "sweep", "--dry-run"])
    assert "e.g. run_distill.py sweep --config sweep_pruned_sst2 --dry-run (commands" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a value with a space is quoted as a shell needs it
        run_distill.parse_args(["--config", "my config.yaml"])
    assert "e.g. run_distill.py pipeline --config 'my config.yaml' (commands" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own abbreviation of --version still answers
        run_distill.parse_args(["--vers"])
    assert "tinydistill" in capsys.readouterr().out
    assert run_distill.parse_args(["pipeline", "--config", "smoke"]).command == "pipeline"


def test_a_dry_run_that_is_refused_prints_the_error_alone(capsys):
    """A dry run of an unknown task printed the whole resolved config, then the error at its foot."""
    assert run_distill.main(["pipeline", "--task", "sst3", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "unknown task 'sst3'; known tasks: cola" in _error_line(err) and "output_dir:" not in out


# --- finding 9: one error line where a traceback was ---

def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file")
    for given, why in [(tmp_path / "taken", "it is a file"), (tmp_path / "taken" / "run", "above it, is a file")]:
        assert run_distill.main(["pipeline", "--output-dir", str(given)]) == 2
        line = _error_line(capsys.readouterr().err)
        assert f"output_dir {given} cannot be a folder" in line and why in line and "--output-dir DIR" in line


def _without_network(tmp_path, **env) -> dict:
    """A child's environment with empty hub caches, so nothing the machine holds can answer for the hub."""
    return {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets"),
            **env}


@pytest.mark.parametrize("env, why", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set and the datasets cache holds no copy"),
    # A hub address where nothing listens: refused at once, as an unreachable hub is, with no retries to wait for.
    ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}, "the hub is unreachable (http://127.0.0.1:9: "),
], ids=["offline", "unreachable"])
def test_a_glue_task_without_local_data_and_no_hub_is_one_error_line(tmp_path, env, why):
    result = subprocess.run([sys.executable, str(ROOT / "run_distill.py"), "pipeline", "--task", "mrpc",
                             "--output-dir", str(tmp_path / "run")], cwd=tmp_path, capture_output=True, text=True,
                            env=_without_network(tmp_path, **env), timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    line = _error_line(result.stderr)
    assert line.startswith("error: task mrpc: no local data (--data-dir DIR with train.tsv and dev.tsv)")
    assert why in line and "pass --data-dir" in line


# --- finding 12: the API in dir() and help(), stage messages from Python, no library chatter ---

def test_dir_and_help_list_the_api():
    import pydoc

    import distill

    assert set(distill.__all__) <= set(dir(distill)) and len(distill.__all__) == 21
    assert {"resolve_model", "ModelLossObjective", "run_pipeline"} <= set(dir(distill))
    text = pydoc.render_doc(distill, renderer=pydoc.plaintext)
    functions = text.split("FUNCTIONS", 1)[1]
    for name in ("run_pipeline(", "load_config(", "build_student(", "train(", "evaluate_task("):
        assert name in functions, name
    assert "class DistillationObjective" in text and "class StudentConfig" in text and "class QuestionAnswerer" in text


@contextmanager
def no_logging_configured():
    """The root logger as in a plain script: no handlers (pytest's own are put back afterwards)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        yield
    finally:
        root.handlers[:] = saved


def test_library_info_chatter_stays_off_the_console(capsys):
    with no_logging_configured():
        logging.getLogger("distill.job.pipeline").info("=== stage: teacher -> runs/x/teacher")
        logging.getLogger("onnx_ir.passes.common.initializer_deduplication").info("Replaced initializer 'val_82'")
        logging.getLogger("httpx").info("HTTP Request: HEAD https://huggingface.co")
    err = capsys.readouterr().err
    assert "INFO distill.job.pipeline: === stage: teacher -> runs/x/teacher" in err
    assert "Replaced initializer" not in err and "HTTP Request" not in err


def test_an_application_that_configures_logging_gets_each_record_once(caplog, capsys):
    with caplog.at_level(logging.INFO):
        logging.getLogger("distill.job.pipeline").info("=== stage: report")
    assert caplog.text.count("=== stage: report") == 1
    assert "=== stage: report" not in capsys.readouterr().err  # the default handler stands back


@pytest.fixture(scope="module")
def python_run(tmp_path_factory):
    """The tiny pipeline job run from Python as a plain script would (no logging configured), with the ONNX export on
    and a GLUE-format data folder of its own: (output folder, data folder, what it printed to stderr)."""
    import io
    from contextlib import redirect_stderr

    from transformers import BertTokenizer

    import distill
    from conftest import SPECIAL, WORDS, tiny_bert, tiny_job
    from tests.glue_fixtures import write_glue_folder

    tmp_path = tmp_path_factory.mktemp("python_run")
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    data = write_glue_folder(tmp_path, "sst2")
    path = tiny_job(tmp_path, tiny_bert(id2label={0: "negative", 1: "positive"}), tokenizer,
                    task={"name": "sst2", "data_dir": str(data)}, export={"onnx": True, "int8": False})
    err = io.StringIO()
    with no_logging_configured(), redirect_stderr(err):
        distill.run_pipeline(distill.load_config(path))
    return tmp_path / "run", data, err.getvalue()


@pytest.mark.slow
def test_a_pipeline_run_from_python_shows_its_stages_and_not_the_exporters_chatter(python_run):
    run, _, err = python_run
    for stage in ("task distillation, intermediate step", "task distillation, prediction step"):
        assert f"INFO distill.job.pipeline: === stage: {stage}" in err, err[-3000:]
    assert (run / "student" / "onnx" / "model.onnx").is_file()  # the exporter ran, quietly:
    assert "onnx_ir" not in err and "Replaced initializer" not in err and "torchvision" not in err
    assert "UserWarning" not in err and "FutureWarning" not in err


# --- finding 14: export checks the files on the dev set the student was made with ---

@pytest.mark.slow
def test_export_reads_the_runs_config_and_never_reports_another_dev_sets_numbers(python_run, capsys, caplog):
    run, data, _ = python_run
    num_dev = len((data / "dev.tsv").read_text().splitlines()) - 1
    record_file = run / "student" / "onnx" / "export.json"
    made = json.loads(record_file.read_text())  # by the pipeline, on the run's dev set
    assert made["num_dev_examples"] == num_dev

    # Without --config: the run's config.json (its data folder, not the default job's 872 bundled dev examples), so
    # the pipeline's check is the one for this dev set.
    for student in (run, run / "student"):
        with caplog.at_level(logging.INFO, logger="distill.publish.export"):
            assert run_distill.main(["export", "--student", str(student)]) == 0
        out, err = capsys.readouterr()
        assert f"config: {run / 'config.json'}, the config the student was made with" in err
        assert f"is up to date (same weights, same {num_dev} dev examples)" in caplog.text
        assert json.loads(record_file.read_text()) == made and str(run / "student" / "onnx" / "model.onnx") in out
        caplog.clear()

    # Another dev set: checked again, never called up to date with the old numbers.
    with caplog.at_level(logging.INFO, logger="distill.publish.export"):
        assert run_distill.main(["export", "--student", str(run), "--set", "task.max_eval_examples=2"]) == 0
    assert "up to date" not in caplog.text
    assert json.loads(record_file.read_text())["num_dev_examples"] == 2


# --- the shared data the tests read: missing is a failure, not a skip ---

def test_a_test_whose_shared_data_is_missing_fails_instead_of_skipping(tmp_path, monkeypatch):
    from tests import conftest as suite

    assert suite.shared_data("ner/wnut17") == suite.SHARED_DATA / "ner" / "wnut17"  # here, as in CI
    monkeypatch.setattr(suite, "SHARED_DATA", tmp_path / "elsewhere" / "shared" / "data")
    with pytest.raises(pytest.fail.Exception, match=r"the shared data .*elsewhere/shared/data/ner/wnut17 is missing: "
                                                    r"link the shared data folder beside the checkout"):
        suite.shared_data("ner/wnut17")


# --- a run's saved config names its files absolutely, so its tools work from any folder ---

def test_the_saved_config_makes_local_paths_absolute_and_keeps_names_and_run_ids(tmp_path, monkeypatch):
    from distill.config import to_dict, with_absolute_paths
    from distill.job.stages import STAGES

    from tests.glue_fixtures import write_glue_folder

    write_glue_folder(tmp_path / "data", "sst2")
    (tmp_path / "corpus.txt").write_text("a line\n")
    (tmp_path / "teacher_model").mkdir()
    monkeypatch.chdir(tmp_path)
    config = load_config(None, {"output_dir": "runs/x", "task.data_dir": "data/sst2", "teacher.model": "teacher_model",
                                "mlm.corpus": ["bundled", "corpus.txt"], "general.cache_dir": "cache",
                                "augment.stopwords": "missing.txt",
                                "sweep": [{"name": "a", "student": {"model": "teacher_model"}}, {"name": "b"}]})
    absolute = with_absolute_paths(config)
    assert absolute.output_dir == str(tmp_path / "runs" / "x") and absolute.general.cache_dir == str(tmp_path / "cache")
    assert absolute.task.data_dir == str(tmp_path / "data" / "sst2")
    assert absolute.teacher.model == absolute.sweep[0].student.model == str(tmp_path / "teacher_model")
    assert absolute.mlm.corpus == ["bundled", str(tmp_path / "corpus.txt")]
    # Names stay names (an installed asset, the bundled corpus, the installed vectors, a hub id), and a path that
    # does not exist is left for the loader to report as written.
    assert (absolute.teacher.base_model, absolute.augment.word_vectors) == ("minilm", "glove-6b-50d")
    assert absolute.augment.stopwords == "missing.txt" and absolute.sweep[1].student.model is None
    assert STAGES["teacher"].run_id(absolute, {}) == STAGES["teacher"].run_id(config, {})
    assert STAGES["augmented"].run_id(absolute, {"mlm": "m"}) == STAGES["augmented"].run_id(config, {"mlm": "m"})
    assert to_dict(with_absolute_paths(absolute)) == to_dict(absolute)


@pytest.mark.slow
def test_a_run_started_with_relative_paths_is_exported_from_another_folder(tmp_path, monkeypatch, capsys):
    """The run saves its data folder and teacher absolute in config.json, so `export --student /abs/run/student`
    from elsewhere checks the files on the run's dev set; the card names the data set, not its folder."""
    from transformers import BertTokenizer

    from conftest import SPECIAL, WORDS, tiny_bert, tiny_job
    from tests.glue_fixtures import write_glue_folder

    work = tmp_path / "work"
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}, do_lower_case=True)
    write_glue_folder(work / "data", "sst2")
    path = tiny_job(work, tiny_bert(id2label={0: "negative", 1: "positive"}), tokenizer,
                    task={"name": "sst2", "data_dir": "data/sst2"}, export={"onnx": False})
    monkeypatch.chdir(work)
    assert run_distill.main(["pipeline", "--config", path, "--output-dir", "run", "--set",
                             "teacher.model=teacher_model"]) == 0
    saved = json.loads((work / "run" / "config.json").read_text())
    assert saved["task"]["data_dir"] == str(work / "data" / "sst2") and saved["output_dir"] == str(work / "run")
    assert (saved["teacher"]["model"], saved["teacher"]["base_model"]) == (str(work / "teacher_model"), "minilm")
    from huggingface_hub import ModelCard

    (result,) = ModelCard.load(work / "run" / "student" / "README.md").data.eval_results
    assert result.dataset_name == "sst2 (dev, 6 examples)"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert run_distill.main(["export", "--student", str(work / "run" / "student"), "--no-int8"]) == 0, \
        capsys.readouterr().err
    assert json.loads((work / "run" / "student" / "onnx" / "export.json").read_text())["num_dev_examples"] == 6


# --- the README's smoke commands, one per task type, run as written ---

def readme_smoke_commands() -> list[list[str]]:
    """The argument lists of the README's smoke commands (the ```bash block after "To check an install"), without
    the leading ``python run_distill.py``."""
    import re
    import shlex

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.findall(r"```bash\n(.*?)```", readme.split("To check an install", 1)[1], flags=re.S)[0]
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert all(command[:2] == ["python", "run_distill.py"] for command in commands), block
    return [command[2:] for command in commands]


def test_the_readme_has_a_smoke_command_for_each_task_type_and_each_passes_the_dry_run(monkeypatch, capsys):
    """As written, from the repository root (the shared data beside it, as CI links it): the dry run reads the data
    and runs every check the run makes before its first stage, and writes nothing. tests/test_end_to_end.py runs
    them."""
    from tests.conftest import shared_data

    commands = readme_smoke_commands()
    pipelines = [c for c in commands if c[0] == "pipeline"]
    tasks = [c[c.index("--task") + 1] if "--task" in c else "sst2" for c in pipelines]
    assert tasks == ["sst2", "wnut_17", "squad"]
    assert [c[0] for c in commands] == ["pipeline"] * 3 + ["benchmark"]
    for command in pipelines[1:]:
        data = Path(command[command.index("--data-dir") + 1])
        assert shared_data(str(data.relative_to("../shared/data"))).is_dir()
    monkeypatch.chdir(ROOT)
    for command, task in zip(pipelines, tasks):
        output = ROOT / command[command.index("--output-dir") + 1]
        existed = output.exists()
        assert run_distill.main([*command, "--dry-run", "--show-config"]) == 0, task
        out = capsys.readouterr().out
        assert "data: " in out and "  train 0: " in out, task
        augmented = yaml.safe_load(out.rsplit("\n\n", 1)[-1])["augment"]["enabled"]  # the resolved config, last
        assert augmented is (task != "squad"), task
        assert output.exists() == existed, task  # nothing written
