"""Command line: parse, build, call. All logic lives in the packages, where tests reach it.

    python run_distill.py pipeline   [--config FILE] [--output-dir DIR] [--task NAME] [--data-dir DIR] [--teacher X]
                                     [--student DIR]
    python run_distill.py seeds      [--seeds 42 43 44] [pipeline's flags but --push-to-hub]
    python run_distill.py sweep      [--config FILE] [--seeds 42 43 44] [--output-dir DIR] [--dry-run]
    python run_distill.py distill --stage general [--teacher ENCODER] [--corpus FILE|HUB ...] [--max-steps N]
                                     [--streaming] [--output-dir DIR]
    python run_distill.py adapt-mlm  [--model ENCODER] [--corpus FILE ...] [--max-steps N] --output-dir DIR
    python run_distill.py augment    --mlm MODEL [--input FILE|DIR|HUB [--text-columns A [B]]] [--task NAME]
                                     --output-dir DIR [options]
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import shlex
import signal
import sys
import time
from pathlib import Path

from distill.config import shipped_configs

# The shipped configs: the repository's configs/ in a checkout, distill/configs/ in an installed wheel.
DEFAULT_CONFIG = shipped_configs() / "sst2_minilm.yaml"
SWEEP_CONFIG = DEFAULT_CONFIG.with_name("sweep_sst2.yaml")
CONFIG_HELP = "YAML config: a file, or the name of a shipped config (configs/NAME.yaml or NAME.yaml: "


def pipeline_configs() -> str:
    """The default config of ``pipeline`` and ``seeds``, and the recipe each named task's type picks without
    ``--config`` (from the registry of tasks: :meth:`distill.tasks.TaskType.recipe`)."""
    from distill.tasks import TASKS

    recipes: dict[str, list[str]] = {}
    for name, spec in TASKS.items():
        recipe = spec.type.recipe(spec)
        if recipe is not None:
            recipes.setdefault(recipe[0], []).append(name)
    return (f"{DEFAULT_CONFIG.name}; without --config, a task's own recipe: "
            + ", ".join(f"{', '.join(names)}: {config}" for config, names in recipes.items()))


def _common(parser: argparse.ArgumentParser, config_default: str, output_dir: bool = True,
            output_dir_help: str | None = None) -> None:
    parser.add_argument("--config", help=f"{CONFIG_HELP}{', '.join(_shipped_names())}); default: {config_default}")
    if output_dir:
        parser.add_argument("--output-dir", required=output_dir_help is not None,
                            help=output_dir_help or "folder for every stage's output (overrides output_dir)")
    parser.add_argument("--task", help="task name, e.g. sst2 (overrides task.name)")
    parser.add_argument("--data-dir", help="the task's data folder: GLUE TSV files (train.tsv, dev.tsv), CoNLL files "
                        "(wnut_17, conll2003) or SQuAD JSON files (squad) (overrides task.data_dir)")
    _set_flag(parser)


def _own_files(parser: argparse.ArgumentParser) -> None:
    """The flags of a task of the user's own files, which need no config (see :func:`_files_task`)."""
    parser.add_argument("--train-file", help="your training file (CSV, TSV, JSONL, CoNLL or SQuAD JSON); with no "
                        "--config the task type, text and label columns are read from it and the type's recipe runs "
                        "(overrides task.train_file)")
    parser.add_argument("--dev-file", help="your dev file, in the training file's layout (overrides task.dev_file)")
    parser.add_argument("--text-columns", nargs="+", metavar="COLUMN", help="the text column, or two for pairs "
                        "(default: the one or two columns of text besides the label)")
    parser.add_argument("--label-column", help="the label column (default: the column called label or labels)")


def _files_task(args: argparse.Namespace, config_file: str | None) -> tuple[dict, tuple[str, str] | None]:
    """The ``task.*`` overrides of ``--train-file`` / ``--dev-file`` (with ``--text-columns``, ``--label-column``),
    what the files say (:func:`distill.tasks.infer.infer_task`: type, columns, regression) where the config
    (``config_file``, given with ``--config``) leaves the task's type and text columns unset, and with no
    ``--config`` the recipe of that task type: (overrides, (recipe file, what it is for) or None).

    Raises:
        DataError: a dev file without a training file or the other way round, or files that do not say their task
            (the message names the flag that settles it).
    """
    from distill.tasks import DataError

    train, dev = getattr(args, "train_file", None), getattr(args, "dev_file", None)
    if train is None and dev is None:
        return {}, None
    if train is None or dev is None:
        raise DataError(f"--{'dev' if dev is None else 'train'}-file is missing: a task of your own files needs "
                        "both --train-file and --dev-file (the dev file scores teacher and student)")
    overrides = {"task.train_file": train, "task.dev_file": dev, "task.text_columns": args.text_columns,
                 "task.label_column": args.label_column}
    from distill.config import load_config
    from distill.tasks.data import task_spec
    from distill.tasks.infer import infer_task, task_name

    given = set_overrides(args.set)
    if config_file is not None:  # the config's own task settings stand; the files fill in what it leaves unset
        task = load_config(config_file, given).task
        if task.task_type is not None:  # the type is named: its own defaults read the files
            return {**overrides, "task.name": args.task or given.get("task.name") or task.name}, None
    inferred = infer_task(train, args.text_columns or None, args.label_column)
    overrides.update({key: value for key, value in inferred.items() if key not in given})
    overrides["task.name"] = args.task or given.get("task.name") or task_name(train)
    if config_file is not None:
        return overrides, None
    spec = task_spec(load_config(None, {**overrides, **given}).task)
    return overrides, spec.type.recipe(spec, _named_teacher(args)[0])


def _set_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config field, e.g. --set student.init=random --set distill.temperature=2 "
                        "(VALUE is read as YAML; repeatable)")


def set_overrides(pairs: list[str]) -> dict:
    """``["student.init=random", "x.y=[1, 2]"]`` -> ``{"student.init": "random", "x.y": [1, 2]}`` (values as YAML).

    Raises:
        ConfigError: an entry has no ``=`` or its value is not valid YAML.
    """
    import yaml

    from distill.config import ConfigError

    overrides = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set student.init=random")
        try:
            overrides[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {pair!r}: the value is not valid YAML ({error.problem})") from None
    return overrides


def augment_flags() -> list[tuple[str, str, type, str]]:
    """Flags of the augment command: one per field of the augment config section, with the field's help."""
    from distill.config import AugmentConfig, command_line_options

    return command_line_options(AugmentConfig)


def _shipped_names() -> list[str]:
    return sorted(path.name for path in shipped_configs().glob("*.yaml"))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tinydistill")
    except PackageNotFoundError:
        return "(not installed: run from a source checkout)"


def parse_args(argv: list[str] | None = None, prog: str = "run_distill.py") -> argparse.Namespace:
    """The command line's arguments; ``prog`` names the program in usage lines and messages (``run_distill.py`` as a
    script, ``run-distill`` as the installed command)."""
    parser = argparse.ArgumentParser(prog=prog, description="TinyBERT-style knowledge distillation")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()} (tinydistill)")
    parser.set_defaults(prog=prog)
    commands = parser.add_subparsers(dest="command", required=True)

    pipeline = commands.add_parser("pipeline", help="teacher, masked LM, augmentation, task distillation, report")
    _common(pipeline, pipeline_configs())
    _own_files(pipeline)
    pipeline.add_argument("--teacher", help="fine-tuned model with the task's head (hub name or folder); default: "
                          "fine-tune")
    pipeline.add_argument("--student", help="start the student from this checkpoint, e.g. the output of "
                          "`distill --stage general` (overrides student.model)")
    pipeline.add_argument("--dry-run", action="store_true", help="print what each stage would do (run, resume, "
                          "reuse, replace, skip) with its run id and its estimated minutes on this machine, and the "
                          "task data read as the run reads it (bad data refused as the run would), then stop; nothing "
                          "is written but the cached timings of the model shapes")
    pipeline.add_argument("--show-config", action="store_true", help="with --dry-run: print the resolved config too")
    pipeline.add_argument("--push-to-hub", metavar="REPO", help="upload the student folder with its model card to "
                          "this hub repository (overrides export.push_to_hub; needs a token: hf auth login)")

    distill = commands.add_parser("distill", help="general distillation on a text corpus (--stage general), or task "
                                  "distillation (--stage task: the pipeline)")
    _common(distill, "sst2_minilm.yaml (--stage general: its general section)")
    distill.add_argument("--stage", choices=["general", "task"], required=True)
    distill.add_argument("--teacher", help="general: pre-trained encoder (hub name, folder, 'minilm'); task: a "
                         "fine-tuned classifier")
    distill.add_argument("--student", help="task: start from this checkpoint (e.g. a general-distilled student)")
    distill.add_argument("--corpus", nargs="+", help="general: text files (.txt/.gz, one sentence a line, blank line "
                         "between documents) or hub datasets name[:config] (overrides general.corpus)")
    distill.add_argument("--max-steps", type=int, help="general: optimizer steps (overrides general.train.max_steps)")
    distill.add_argument("--streaming", action="store_true", default=None,
                         help="general: pack the corpus on the fly instead of once (large corpora)")

    seeds = commands.add_parser("seeds", help="the pipeline once per seed, then the mean and spread of teacher, student "
                                "and retained metric over the runs")
    _common(seeds, pipeline_configs())
    _own_files(seeds)
    seeds.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="one run per seed, each in "
                       "OUTPUT_DIR/seed-N (default: 42 43 44; 42 is the plain job's seed; OUTPUT_DIR defaults to the "
                       "config's output_dir + '_seeds')")
    seeds.add_argument("--teacher", help="fine-tuned model with the task's head (hub name or folder); default: fine-tune one "
                       "per seed")
    seeds.add_argument("--student", help="start every student from this checkpoint (overrides student.model)")
    seeds.add_argument("--dry-run", action="store_true", help="print what each seed's stages would do (run, "
                       "resume, reuse, replace, skip) with their run ids and estimated minutes, and the task data "
                       "read as the run reads it, then stop; nothing is written but the cached timings")
    seeds.add_argument("--show-config", action="store_true", help="with --dry-run: print the resolved config too")

    compress = commands.add_parser("compress", help="from a teacher and a budget (speed-up, latency or size) to the "
                                   "smallest student that keeps its score: shapes measured here, ranked, the best "
                                   "distilled, the choice shipped")
    _common(compress, "the task's recipe, as pipeline chooses it")
    compress.add_argument("--teacher", help="the teacher: fine-tuned (with the task's head) or an encoder to fine-tune "
                          "(mpnet, bert-base-uncased); default the recipe's")
    budget = compress.add_mutually_exclusive_group(required=True)
    budget.add_argument("--speedup", type=float, help="at least this many times faster than the teacher")
    budget.add_argument("--latency-ms", type=float, help="at most this many milliseconds a batch")
    budget.add_argument("--size-mb", type=float, help="at most this many MB of fp32 weights")
    compress.add_argument("--batch-size", type=int, default=32, help="the batch a latency is measured at (default 32)")
    compress.add_argument("--seq-length", type=int, default=None, help="the tokens an example a latency is measured at "
                          "(default the recipe's report length)")
    compress.add_argument("--keep", type=float, default=0.97, help="the share of the teacher's metric to keep "
                          "(default 0.97)")
    compress.add_argument("--candidates", type=int, default=2, help="shapes distilled in full, the best by importance "
                          "kept (default 2)")
    compress.add_argument("--dry-run", action="store_true", help="print every shape's latency here and whether it "
                          "meets the budget, and the stages and their estimated minutes; nothing is trained")

    sweep = commands.add_parser("sweep", help="distil several students from one teacher and augmented set, then "
                                "benchmark them together (config: sweep list)")
    _common(sweep, "sweep_sst2.yaml")
    sweep.add_argument("--seeds", type=int, nargs="+", help="run the sweep once per seed, each in OUTPUT_DIR/seed-N "
                       "(OUTPUT_DIR defaults to the config's output_dir + '_seeds'), then write seeds.md, seeds.json "
                       "and seeds.png there: every student's metric and retained share as mean and spread over the "
                       "seeds, e.g. --seeds 42 43 44")
    sweep.add_argument("--dry-run", action="store_true", help="print what each shared stage and each student's "
                       "stages would do (run, resume, reuse, replace, skip) with their run ids and estimated minutes, "
                       "and the task data read as the run reads it, then stop; nothing is written but the cached "
                       "timings")
    sweep.add_argument("--show-config", action="store_true", help="with --dry-run: print the resolved config too")

    bench = commands.add_parser("benchmark", help="size, speed and accuracy of a teacher and students side by side, "
                                "with int8 and ONNX Runtime variants")
    _common(bench, "the config.json of the pipeline output folder that --teacher (else the first --student) names "
            "or is a stage folder of (RUN, RUN/teacher, RUN/student), else sst2_minilm.yaml (the config the models "
            "were made with sets the task, its data and dev subset)")
    bench.add_argument("--teacher", required=True, help="teacher checkpoint folder (e.g. RUN/teacher), or a pipeline "
                       "output folder")
    bench.add_argument("--student", action="append", required=True, help="student checkpoint folder (e.g. "
                       "RUN/student) or pipeline output folder (repeat for several)")
    bench.add_argument("--no-compress", action="store_true", help="skip the int8 / ONNX rows")

    export = commands.add_parser("export", help="write a student's ONNX Runtime files (fp32, int8) checked on the "
                                 "dev set, and its model card")
    _common(export, "the config.json of the pipeline output folder that --student names or is in, else "
            "sst2_minilm.yaml", output_dir=False)
    export.add_argument("--student", required=True, help="student checkpoint folder, or a pipeline output folder")
    export.add_argument("--int8", action=argparse.BooleanOptionalAction, default=None,
                        help="write model_quantized.onnx (int8 weights) too, or not (default: the config's export.int8, "
                        "on in the shipped configs)")

    mlm = commands.add_parser("adapt-mlm", help="train a masked-LM head for an encoder that has none")
    mlm.add_argument("--config", help=f"{CONFIG_HELP}{', '.join(_shipped_names())}) whose mlm section is used; "
                     "default: none, the built-in defaults")
    mlm.add_argument("--model", help="encoder (hub name, folder, or 'minilm'); overrides mlm.base_model")
    mlm.add_argument("--corpus", nargs="+", help="text files, one sentence a line (.txt/.gz); overrides mlm.corpus")
    mlm.add_argument("--max-steps", type=int, help="optimizer steps (overrides mlm.train.max_steps)")
    mlm.add_argument("--output-dir", required=True, help="where the ...ForMaskedLM checkpoint is saved")
    _set_flag(mlm)

    augment = commands.add_parser("augment", help="TinyBERT data augmentation of a training set")
    # Required: the augmented set is a stage of its own, not to be written into a job's folder (a config's output_dir).
    _common(augment, "none, the built-in defaults of every field",
            output_dir_help="folder for the augmented set's shards and stage record")
    augment.add_argument("--input", help="a .csv/.tsv/.jsonl file, a save_to_disk folder, or a hub dataset name[:config] "
                         "(default: the training set of --task)")
    augment.add_argument("--text-columns", nargs="+", help="column(s) to augment (default: the first pair or column "
                         "the input has of sentence1 sentence2, premise hypothesis, question1 question2, question "
                         "sentence, sentence, text)")
    augment.add_argument("--split", default="train", help="split of a saved DatasetDict or hub dataset (default: train)")
    augment.add_argument("--mlm", help="masked LM (hub name or folder with an MLM head); overrides mlm.model")
    augment.add_argument("--export", help="also write the result as one .jsonl, .csv or .tsv file")
    for flag, key, kind, text in augment_flags():
        augment.add_argument(flag, type=kind, help=f"{text} (augment.{key})")
    argv = sys.argv[1:] if argv is None else argv
    ours = argv and (argv[0] == "-h" or argv[0].startswith("--") and any(  # -h, --help, --version, --vers ...
        option.startswith(argv[0]) for option in ("--help", "--version")))
    if argv and argv[0].startswith("-") and not ours:
        # argparse would take the option's value for the command ("invalid choice: 'configs/x.yaml'"); a command
        # given after its options (the last such word: `--config sweep pipeline` names pipeline) goes to the front
        at = max((i for i, a in enumerate(argv) if a in commands.choices), default=None)
        line = [argv[at], *argv[:at], *argv[at + 1:]] if at is not None else ["pipeline", *argv]
        parser.error(f"{argv[0]}: name the command first, e.g. {prog} {shlex.join(line)} "
                     f"(commands: {', '.join(commands.choices)})")
    return parser.parse_args(argv)


def _setup_logging(output_dir: Path | None) -> None:
    """Log INFO and above to stderr and ``output_dir/run.log``; the libraries' INFO chatter is left out.

    Raises:
        ConfigError: ``output_dir`` (or a folder above it) is a file.
    """
    import transformers

    from distill.config import check_output_dir
    from distill.logs import FORMAT, quiet_libraries

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if output_dir is not None:
        check_output_dir(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(output_dir / "run.log", encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format=FORMAT, handlers=handlers)
    quiet_libraries()
    transformers.logging.set_verbosity_error()  # expected "newly initialised head" load reports are noise here
    transformers.logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars on every load


def _join_process_group() -> None:
    """Under `accelerate launch` / torchrun (LOCAL_RANK set) on a machine without CUDA, join a CPU process group
    (gloo): accelerate would otherwise run every process alone. Elsewhere accelerate picks the device itself."""
    import os

    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    use_cpu = parse_flag_from_env("ACCELERATE_USE_CPU")
    launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
    if use_cpu or (launched and not torch.cuda.is_available()):
        PartialState(cpu=True)


def _leave_process_group() -> None:
    """Destroy the process group a launched run joined, if any, before the interpreter exits: a gloo group left to
    the exit's destructors can abort the process (``terminate called without an active exception``) after its work
    is done."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as error:  # the run's own outcome stands; a failed teardown is only worth a warning
            logging.getLogger(__name__).warning("leaving the process group failed: %s", error)


def _default_task() -> str:
    """The task the default job's config is for (``sst2``)."""
    import yaml

    return yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))["task"]["name"]


def _task_recipe(name: str | None, teacher_layers: int | None = None) -> tuple[str, str] | None:
    """The shipped config for a named task (the default job's when None) that the default job's is not for (see
    :meth:`distill.tasks.TaskType.recipe`; ``teacher_layers``: the named teacher's depth): (file name, what it is for),
    or None."""
    from distill.tasks import TASKS

    spec = TASKS.get(name or _default_task())
    return spec.type.recipe(spec, teacher_layers) if spec is not None else None


def _teacher_as_is(task: str | None, task_type: str | None = None) -> bool:
    """Whether the task's type (``task_type`` when given, else the named task's) distils its teacher as given (a
    sentence encoder's), never fine-tuning it."""
    from distill.tasks import TASK_TYPES, TASKS

    if task_type in TASK_TYPES:
        return TASK_TYPES[task_type].teacher_as_is
    spec = TASKS.get(task or _default_task())
    return bool(spec is not None and spec.type.teacher_as_is)


# The heads of a checkpoint fine-tuned for a task (a teacher to distil as it is); any other is an encoder to fine-tune.
TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")


def _named_teacher(args: argparse.Namespace) -> tuple[int | None, str]:
    """The depth of the teacher ``--teacher`` names, and when it is a bare encoder (no task head: an encoder to
    fine-tune, ``teacher.base_model``, rather than a fine-tuned teacher, ``teacher.model``) its architectures in words,
    else ""; (None, "") when there is none or its config cannot be read here (a hub model offline)."""
    name = getattr(args, "teacher", None)
    if not name or not (args.command in ("pipeline", "seeds", "compress") or getattr(args, "stage", None) == "task"):
        return None, ""
    try:
        from teachers.models import load_config

        config = load_config(name)
    except Exception:  # not readable here: a hub name offline, a typo (the run itself says which)
        return None, ""
    architectures = getattr(config, "architectures", None) or []
    bare = not any(a.endswith(TASK_HEADS) for a in architectures)
    return getattr(config, "num_hidden_layers", None), (", ".join(architectures) or "an encoder") if bare else ""


def main(argv: list[str] | None = None, prog: str = "run_distill.py") -> int:
    args = parse_args(argv, prog)
    _join_process_group()
    defaults = {"pipeline": DEFAULT_CONFIG, "seeds": DEFAULT_CONFIG, "distill": DEFAULT_CONFIG, "compress": DEFAULT_CONFIG,
                "benchmark": DEFAULT_CONFIG, "sweep": SWEEP_CONFIG, "export": DEFAULT_CONFIG}
    config_file = args.config or (str(defaults[args.command]) if args.command in defaults else None)
    overrides = {"output_dir": getattr(args, "output_dir", None)}
    refused = _flags_not_for(args)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    if args.command == "export":
        config_file, overrides["output_dir"] = _export_config(args, config_file)
        overrides["export.int8"] = args.int8
    if args.command == "benchmark":
        config_file = _benchmark_config(args, config_file)
    try:
        files, files_recipe = _files_task(args, args.config)
    except KnownErrors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    teacher_layers, bare_encoder = _named_teacher(args)
    recipe = files_recipe or (_task_recipe(getattr(args, "task", None), teacher_layers) if not files else None)
    task_job = args.command in ("pipeline", "seeds", "compress") or (args.command == "distill" and args.stage == "task")
    if files and args.config is None and task_job and "task.task_type" in files:
        task = files["task.name"]
        overrides["output_dir"] = args.output_dir or f"runs/{task}"
        if recipe is not None:
            config_file = str(DEFAULT_CONFIG.with_name(recipe[0]))
        print(f"task {task} of your files: a {files['task.task_type'].replace('_', ' ')} task"
              + (f", text {', '.join(files['task.text_columns'])}, labels {files['task.label_column']}"
                 if files.get("task.text_columns") else "")
              + (" (scores: regression)" if files.get("task.regression") else "")
              + f"; config: configs/{Path(config_file).name}"
              + (f", {recipe[1]}" if recipe else ", the default job's") + " (--config FILE for another)",
              file=sys.stderr)
    elif args.config is None and task_job and recipe is not None:
        config_file = str(DEFAULT_CONFIG.with_name(recipe[0]))
        overrides["output_dir"] = args.output_dir or f"runs/{args.task or _default_task()}"
        print(f"config: configs/{recipe[0]}, {recipe[1]} (--config FILE for another)", file=sys.stderr)
    elif args.config is None and task_job and args.task not in (None, _default_task()):
        # Another task on the default job's recipe gets its own folder: the default job's stay as they are.
        overrides["output_dir"] = args.output_dir or f"runs/{args.task}"
    if args.command == "benchmark" and args.no_compress:
        overrides["benchmark.compress"] = []
    if args.command in ("pipeline", "seeds", "augment", "distill", "benchmark", "sweep", "export", "compress"):
        overrides.update({"task.name": args.task, "task.data_dir": args.data_dir})
    overrides.update(files)
    if args.command == "compress":  # its own folder: a search beside the task's pipeline run, not inside it
        task = files.get("task.name") or args.task or _default_task()
        overrides["output_dir"] = args.output_dir or f"runs/compress_{task}"
    if args.command in ("pipeline", "seeds", "compress") or (args.command == "distill" and args.stage == "task"):
        overrides.update({"teacher.model": args.teacher, "student.model": getattr(args, "student", None)})
        named_type = files.get("task.task_type") or set_overrides(args.set).get("task.task_type")
        if bare_encoder and args.config is not None and not named_type:
            from distill.config import load_config

            named_type = load_config(config_file).task.task_type
        if bare_encoder and _teacher_as_is(files.get("task.name") or args.task, named_type):
            bare_encoder = ""  # a sentence encoder's task distils the encoder as it is
        if bare_encoder:  # a pre-trained encoder (--teacher mpnet, bert-base-uncased): fine-tuned here on the task
            overrides.update({"teacher.model": None, "teacher.base_model": args.teacher})
            print(f"teacher {args.teacher} has no task head ({bare_encoder}): fine-tuned on the task first "
                  "(teacher.base_model)", file=sys.stderr)
    if args.command == "pipeline":
        overrides["export.push_to_hub"] = args.push_to_hub
    if args.command == "distill" and args.stage == "general":
        overrides.update({"general.teacher": args.teacher, "general.corpus": args.corpus,
                          "general.train.max_steps": args.max_steps, "general.streaming": args.streaming})
    if args.command == "adapt-mlm":
        overrides.update({"mlm.base_model": args.model, "mlm.corpus": args.corpus, "mlm.train.max_steps": args.max_steps})
    if args.command == "augment":
        overrides["mlm.model"] = args.mlm
        overrides.update({f"augment.{key}": getattr(args, key) for _, key, _, _ in augment_flags()})
    # SIGTERM stops cleanly, as Ctrl-C does (training loops finish their step and checkpoint first).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args, config_file, overrides)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _leave_process_group()


def console_main() -> int:
    """The installed ``run-distill`` command."""
    return main(prog="run-distill")


def _flags_not_for(args: argparse.Namespace) -> str | None:
    """Why the command line gives a flag its command (or its ``distill --stage``) would ignore, or None."""
    if args.command == "export" and not Path(args.student).exists():
        return f"--student {args.student} does not exist; give a student folder or a pipeline output folder"
    if args.command != "distill":
        return None
    stage_flags = {"general": ("corpus", "max_steps", "streaming"), "task": ("student", "task", "data_dir")}
    other = "task" if args.stage == "general" else "general"
    given = [f"--{name.replace('_', '-')}" for name in stage_flags[other] if getattr(args, name, None) is not None]
    if not given:
        return None
    return (f"distill --stage {args.stage} does not take {', '.join(given)} (flags of --stage {other}); "
            f"see run_distill.py distill --help")


def _export_config(args: argparse.Namespace, config_file: str) -> tuple[str, str]:
    """``export``'s config file and output folder (its run.log): without --config, the config.json of the pipeline
    output folder the student came from, so the files are checked on the dev set the student was scored on."""
    from distill.publish.export import pipeline_folder_of

    run = pipeline_folder_of(Path(args.student))
    return _run_config(args.student, args.config, config_file, "the student"), str(
        run if run is not None else Path(args.student))


def _benchmark_config(args: argparse.Namespace, config_file: str) -> str:
    """``benchmark``'s config file: without --config, that of the pipeline run the teacher is from (the run folder
    or one of its stage folders), else of the first student's run, else ``config_file``."""
    from distill.publish.export import pipeline_folder_of

    if args.config is None:
        for model, role in ((args.teacher, "the teacher"), *((student, "the student") for student in args.student)):
            if pipeline_folder_of(Path(model)) is not None:
                return _run_config(model, None, config_file, role)
    return config_file


def _run_config(model: str, given: str | None, config_file: str, role: str) -> str:
    """Without --config, the config.json of the pipeline output folder that ``model`` names or is in (the task, data
    and dev subset it was made for), else ``config_file``."""
    from distill.publish.export import pipeline_folder_of

    run = pipeline_folder_of(Path(model))
    if given is not None or run is None:
        return config_file
    print(f"config: {run / 'config.json'}, the config {role} was made with (--config FILE for another)",
          file=sys.stderr)
    return str(run / "config.json")


def _run(args: argparse.Namespace, config_file: str | None, overrides: dict) -> int:
    from distill.config import load_config

    try:
        overrides = {k: v for k, v in overrides.items() if v is not None}
        overrides.update(set_overrides(args.set))  # explicit: null is a value here
        from distill.job.preflight import prepare

        config = prepare(load_config(config_file, overrides, ignore_none=False))  # names checked, "auto" resolved
        if (args.command == "seeds" or getattr(args, "seeds", None)) and args.output_dir is None:
            # beside the plain job's folder, not inside it
            config = dataclasses.replace(config, output_dir=f"{config.output_dir}_seeds")
        _setup_logging(None if getattr(args, "dry_run", False) else Path(config.output_dir))
        return COMMANDS[args.command](config, args)
    except KnownErrors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:
        from distill.method.trainer import TrainingInterrupted

        if isinstance(error, TrainingInterrupted):
            print(f"interrupted: {error}", file=sys.stderr)
            return 128 + error.signal_number
        print("interrupted: finished stages, checkpoints and augmentation shards are kept; re-run the same command to "
              "resume", file=sys.stderr)
        # Ctrl-C: 128 + SIGINT, as a shell reports it; SIGTERM outside a training loop (_interrupt), or a second one
        # inside it ("second SIGTERM"): 128 + SIGTERM.
        named = str(error.args[0]) if error.args else ""
        return 128 + (signal.SIGTERM if named.split()[-1:] == [signal.SIGTERM.name] else signal.SIGINT)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: the disk is full ({error.filename or error}): finished stages and the last checkpoint are kept; "
              "free space and re-run the same command to resume", file=sys.stderr)
        return 2


def _interrupt(signal_number, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signal_number).name)


def KnownErrors() -> tuple[type[Exception], ...]:
    """Errors that carry a message for the user (no traceback needed)."""
    from augment import VectorsError
    from distill.method.capture import CaptureError
    from distill.method.checkpoint import CheckpointError
    from distill.config import ConfigError
    from distill.tasks import DataError
    from distill.method.trainer import NonFiniteLossError
    from teachers import ModelError

    return ConfigError, DataError, ModelError, CheckpointError, VectorsError, CaptureError, NonFiniteLossError


def _command_line(prog: str) -> str:
    """The command as typed, for model cards (flags and values quoted as a shell would need them)."""
    program = ["python", prog] if prog.endswith(".py") else [prog]
    return " ".join([*program, *[shlex.quote(a) for a in sys.argv[1:]]])


def _dry_run(config, plan, show_config: bool = False, entries: dict | None = None) -> int:
    """Print ``plan(config)``'s rows with each stage's estimated minutes on this machine, the task data as the run
    reads it and, with ``show_config``, ``config`` as it would run here (``entries``: a sweep's student configs, for
    the estimate)."""
    import yaml

    from distill.config import to_dict
    from distill.device import run_device
    from distill.job.pipeline import data_preview, for_device, plan_markdown, plan_minutes

    # The config as it would run here: budget rules that depend on the device resolved (task.max_train_examples_cpu)
    resolved = for_device(config, run_device())
    rows = plan(config)  # first: what the plan refuses (an unknown task, an unreachable shape) is the only output
    preview = data_preview(resolved)  # read as the run reads it: what the run would refuse is refused here
    minutes, why = plan_minutes(resolved, rows, entries)
    print(plan_markdown(rows, minutes))
    print()
    if minutes is not None:
        print(f"estimated: {sum(minutes.values()):.0f} minutes on this machine ({why})")
    else:
        print(f"no estimate of the minutes: {why}")
    print()
    print(preview)
    print()
    if show_config:
        print(yaml.safe_dump(to_dict(resolved), sort_keys=False).rstrip())
    else:
        print(f"the resolved config: add --show-config to print it (the run saves it as "
              f"{Path(config.output_dir) / 'config.json'})")
    return 0


def _entries(config, plan) -> dict | None:
    """A sweep's student configs by name (for the dry run's estimate), or None for a pipeline's plan."""
    from distill.job.pipeline import plan_sweep, sweep_entries

    return sweep_entries(config) if plan is plan_sweep else None


def run_pipeline_command(config, args) -> int:
    from distill.job.pipeline import plan_pipeline, run_pipeline

    if getattr(args, "dry_run", False):
        return _dry_run(config, plan_pipeline, args.show_config)

    start = time.perf_counter()
    report = run_pipeline(config, command=_command_line(args.prog))
    out = Path(config.output_dir)
    print((out / "report.md").read_text(encoding="utf-8"))
    print(f"done in {time.perf_counter() - start:.0f} s; student: {out / 'student'}; report: {out / 'report.md'}")
    return 0 if report else 1


def run_seeds_command(config, args) -> int:
    from distill.job.pipeline import plan_pipeline
    from distill.job.seeds import run_seeds

    return _over_seeds(config, args, plan_pipeline, run_seeds, "runs", "summary")


def _over_seeds(config, args, plan, run, done: str, outputs: str) -> int:
    """``seeds`` and ``sweep --seeds``: the dry run (``plan`` for each seed) or ``run``, then the summary printed."""
    from distill.method.checkpoint import is_main_process
    from distill.job.seeds import SeedsFailedError, plan_seeds

    if args.dry_run:
        rows = plan_seeds(config, args.seeds, plan=plan)  # a bad seed list is refused before the config is printed
        return _dry_run(config, lambda _: rows, args.show_config, _entries(config, plan))
    start = time.perf_counter()
    out = Path(config.output_dir)
    try:
        run(config, args.seeds, command=_command_line(args.prog))
    except SeedsFailedError as error:
        if is_main_process() and (out / "seeds.md").is_file():
            print((out / "seeds.md").read_text(encoding="utf-8"))
        print(f"error: {error}", file=sys.stderr)
        return 1
    if not is_main_process():  # under a multi-process launch the main process writes and prints the summary
        return 0
    print((out / "seeds.md").read_text(encoding="utf-8"))
    print(f"{len(args.seeds)} {done} done in {time.perf_counter() - start:.0f} s; {outputs}: {out / 'seeds.md'}")
    return 0


def run_distill_command(config, args) -> int:
    if args.stage == "task":
        return run_pipeline_command(config, args)
    from distill.method.checkpoint import output_lock
    from distill.job.general import general_config, run_general_distillation

    folder = Path(config.output_dir) / "general"
    with output_lock(Path(config.output_dir), "distill --stage general"):  # a second run there is refused
        record = run_general_distillation(general_config(config, for_pipeline=False), folder)
    from accelerate import PartialState

    if not PartialState().is_main_process:
        return 0
    print(f"general distillation: {record['steps']} steps, {record['samples']} sequences in {record['seconds']:.0f} s; "
          f"final losses {record['final']}")
    print(f"student encoder saved to {folder}; distil it on a task with "
          f"`{'python ' if args.prog.endswith('.py') else ''}{args.prog} pipeline --student {folder}`")
    return 0


def run_sweep_command(config, args) -> int:
    from distill.job.pipeline import plan_sweep, run_sweep

    if args.seeds:  # once per seed, then the summary over the seeds
        from distill.job.seeds import run_sweep_seeds

        return _over_seeds(config, args, plan_sweep, run_sweep_seeds, "sweeps", "summary (plot: seeds.png)")
    if args.dry_run:
        return _dry_run(config, plan_sweep, args.show_config, _entries(config, plan_sweep))
    start = time.perf_counter()
    report = run_sweep(config)
    if report is None:  # another process of a multi-process launch: the main one benchmarks and prints
        return 0
    out = Path(config.output_dir) / "benchmark"
    print((out / "benchmark.md").read_text(encoding="utf-8"))
    print(f"sweep done in {time.perf_counter() - start:.0f} s; {len(report['rows'])} rows in {out}")
    return 0


def _model_folder(given: str, stage: str) -> tuple[Path, str]:
    """``resolve_model_folder`` for a path given on the command line: a missing folder is a DataError (exit 2)."""
    from distill.publish.benchmark import resolve_model_folder
    from distill.tasks import DataError

    try:
        return resolve_model_folder(Path(given), stage)
    except FileNotFoundError as error:
        raise DataError(str(error)) from None


def run_benchmark_command(config, args) -> int:
    from distill.publish.benchmark import run_benchmark, unique_name
    from distill.tasks.data import load_task_data, task_spec

    from distill.tasks import check_model_head

    teacher, _ = _model_folder(args.teacher, "teacher")
    students = {}
    for given in args.student:
        students[unique_name(Path(given).name, {"teacher", *students})] = _model_folder(given, "student")
    spec = task_spec(config.task)
    for role, folder in (("--teacher", teacher), *(("--student", folder) for folder, _ in students.values())):
        check_model_head(folder, spec, role)  # one line, before the dev set is read and any model loaded
    dev = load_task_data(config.task, spec)["dev"]
    out = Path(args.output_dir) if args.output_dir else Path(config.output_dir) / "benchmark"
    report = run_benchmark(teacher, students, spec, dev, config.benchmark, out, config.task.max_seq_length)
    print((out / "benchmark.md").read_text(encoding="utf-8"))
    print(f"{len(report['rows'])} rows; table, CSV, JSON and plot (benchmark.md, .csv, .json, .png) in {out}")
    models = out / "models"
    if models.is_dir():
        size = sum(f.stat().st_size for f in models.rglob("*") if f.is_file()) / 1e6
        print(f"the compressed copies it timed (int8, ONNX) are in {models}, {size:.0f} MB: delete the folder when "
              "done with them (a later benchmark there makes them again)")
    return 0


def run_export_command(config, args) -> int:
    from distill.tasks.data import load_task_data, task_spec
    from distill.publish.export import ONNX_FOLDER, export_student

    from distill.tasks import check_model_head

    folder, _ = _model_folder(args.student, "student")
    spec = task_spec(config.task)
    check_model_head(folder, spec, "--student")  # one line, before the dev set is read
    record = export_student(folder, spec, load_task_data(config.task, spec)["dev"], config.task.max_seq_length,
                            int8=config.export.int8)
    from distill.publish.card import record_export

    record_export(folder, spec, record)
    for name, info in record["files"].items():
        print(f"{folder / ONNX_FOLDER / name}: {info['size_mb']:.1f} MB, max |logit difference| "
              f"{info['max_abs_logit_difference']:.2e}, same prediction {100 * info['same_prediction']:.1f}%, dev "
              f"{info['dev']}")
    return 0


def run_adapt_mlm_command(config, args) -> int:
    from distill.method.checkpoint import stage_done
    from distill.device import run_device
    from distill.job.stages import STAGES
    from teachers import adapt_mlm

    folder = Path(config.output_dir)
    # The pipeline's own masked-LM run id: the encoder and corpus count by their bytes (an edited corpus or an encoder
    # trained again in place is a new run), and a folder made here is the one a pipeline's mlm stage would reuse.
    run_id = STAGES["mlm"].run_id(config, {})
    if stage_done(folder, run_id) is None:
        adapt_mlm(config.mlm, folder, run_id, device=run_device())
    print(f"masked LM saved to {folder}")
    return 0


def run_augment_command(config, args) -> int:
    from distill.job.augmentation import run_augment

    summary = run_augment(config, args.input, args.text_columns, args.split, args.export)
    print(f"{summary['num_rows']} rows ({summary['num_augmented']} augmented) from {summary['num_examples']} "
          f"examples in {summary['output']} ({summary['seconds']:.0f} s)")
    for row in summary["sample"]:
        print(row)
    return 0


def _budget(config, args):
    from distill.job.compress import Budget

    return Budget(speedup=args.speedup, latency_ms=args.latency_ms, size_mb=args.size_mb, batch_size=args.batch_size,
                  seq_length=args.seq_length or config.report.seq_length)


def run_compress_command(config, args) -> int:
    from distill.job.compress import entries, plan_compress, run_compress

    budget = _budget(config, args)
    if args.dry_run:
        from distill.job.pipeline import plan_sweep

        shapes, teacher_ms = plan_compress(config, budget)
        fits = [shape for shape in shapes if shape.fits]
        print(f"budget: {budget.describe()} (the teacher: {teacher_ms:.1f} ms); keep {args.keep:.0%}; {len(fits)} of "
              f"{len(shapes)} shapes meet it; the {args.candidates} the teacher's importance ranks first are distilled")
        print(f"{'shape':<22}{'ms':>9}{'faster by':>11}{'MB':>8}  in budget")
        for shape in shapes:
            print(f"{shape.name:<22}{shape.latency_ms:>9.1f}{teacher_ms / shape.latency_ms:>10.1f}x"
                  f"{shape.size_mb:>8.1f}  {'yes' if shape.fits else 'no'}")
        print()
        # the stages, priced as the largest shapes inside the budget (the proxy needs the fine-tuned teacher)
        sweep = entries(config, fits[:args.candidates])
        return _dry_run(sweep, plan_sweep, False, _entries(sweep, plan_sweep))
    start = time.perf_counter()
    record = run_compress(config, budget, keep=args.keep, candidates=args.candidates)
    if not record:
        return 0
    folder = Path(record["folder"])
    print((folder / "compress.md").read_text(encoding="utf-8"))
    print(f"compress done in {time.perf_counter() - start:.0f} s; chosen: {config.output_dir}/{record['student']}; "
          f"the search: {folder / 'compress.md'}")
    return 0


COMMANDS = {"pipeline": run_pipeline_command, "seeds": run_seeds_command, "distill": run_distill_command,
            "compress": run_compress_command, "benchmark": run_benchmark_command,
            "sweep": run_sweep_command, "export": run_export_command,
            "adapt-mlm": run_adapt_mlm_command, "augment": run_augment_command}

if __name__ == "__main__":
    sys.exit(main())
