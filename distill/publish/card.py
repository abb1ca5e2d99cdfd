"""Model cards for the students the pipeline, the sweep and general distillation write, and the upload to the hub.

A card is the ``README.md`` of a model folder, as the Hugging Face hub reads it: YAML metadata (license, base model =
the teacher, datasets, tags, ``model-index`` with the dev results) made with ``huggingface_hub``'s
:class:`~huggingface_hub.ModelCardData`, then the report table (teacher against student), the recipe, the command that
made it, the deployable files and how to load it. ``ModelCard.load`` reads it back.
"""

from __future__ import annotations

import logging
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from distill.config import PipelineConfig, StudentConfig, TrainConfig
from distill.tasks import headline_metrics
from distill.tasks.split import REPORT, half_key
from distill.tasks.base import TaskSpec
from distill.publish.report import chance_note
from students import RELATIVE_PRESETS, student_shape
from teachers.assets import HUB_IDS

logger = logging.getLogger(__name__)

TAGS = ["distillation", "knowledge-distillation", "tinybert", "tinydistill"]
# Files of a stage folder that are the run's working state, not the model: not uploaded.
NOT_UPLOADED = ["checkpoints/*", "tensorboard/*", "stage.json", "started.json", "log.jsonl", "best/*", "run.log"]


def hub_dataset_id(spec) -> str:
    """The hub id of a named task's data set: GLUE's for its tasks (``nyu-mll/glue``), else the task's own."""
    return "nyu-mll/glue" if spec.hub[0] == "glue" else spec.hub[0]


def hub_id(name: str | None) -> str | None:
    """The hub id of a model name: installed assets map to theirs, a local folder has none, a hub name is itself."""
    if name is None:
        return None
    if name in HUB_IDS:
        return HUB_IDS[name]
    return None if Path(name).exists() else name


def public_name(name: str | None) -> str | None:
    """A model or file as a card or report may name it: a hub id, an asset name or a relative path as given; an
    absolute path by its last part (its run folder too for a stage folder, ``run/teacher``), not this machine's
    path."""
    if name is None or not Path(name).expanduser().is_absolute():
        return name
    path = Path(name).expanduser()
    return f"{path.parent.name}/{path.name}" if path.name in ("teacher", "student", "student_intermediate", "pruned",
                                                              "general", "encoder") else path.name


def public_command(command: str) -> str:
    """A command line with each absolute path in it as :func:`public_name` gives it (``--data-dir /home/me/x`` ->
    ``--data-dir x``), for a card that leaves this machine."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: left as written
        return command

    def public(word: str) -> str:
        flag, equals, value = word.partition("=") if word.startswith("-") else ("", "", word)
        return f"{flag}{equals}{public_name(value)}" if value.startswith(("/", "~")) else word

    return shlex.join(public(word) for word in words)


def describe_init(student: StudentConfig, layer_map: str | list[int], general: bool = False) -> str:
    """How a student starts, in words for reports; ``general``: the job's general stage is on (``general.enabled``),
    so a student not given (``student.model``) nor pruned from the teacher starts from the general-distilled one
    ("general distillation start (random)": the shape's start before general distillation in brackets)."""
    if student.model is not None:
        return f"from {public_name(student.model)}"
    base = f"teacher layers ({layer_map})" if student.init == "teacher" else {
        "teacher_embeddings": "teacher embeddings (PCA)", "random": "random",
        "pruned": "pruned from the fine-tuned teacher"}[student.init]
    return f"general distillation start ({base})" if general and student.init != "pruned" else base


def _stage_words(stage: str | dict) -> str:
    """One shape of ``student.pruning.stages`` in words: a preset's name, or its sizes."""
    if isinstance(stage, str):
        return stage
    names = {"num_hidden_layers": "layers", "hidden_size": "hidden", "intermediate_size": "FFN",
             "num_attention_heads": "heads"}
    return ", ".join(f"{word} {stage[key]}" for key, word in names.items() if key in stage)


def recipe_lines(config: PipelineConfig, teacher_record: dict, general: dict, step1: dict, num_rows: int,
                 step2: dict | None = None, num_unlabelled: int = 0, num_augmented: int | None = None,
                 temperature: bool = True, shape: dict | None = None) -> list[str]:
    """How a student was made, in words for its model card, read from what ran where the stage records say it.

    Args:
        config: the job's config.
        teacher_record, general, step1, step2: the records of the teacher stage, the general stage
            (``general.json``), the intermediate step and the prediction step (``stage.json``). The loss weights listed
            are the terms that ran (``weights`` in the step records), the layers copied into a student cut from the
            teacher are ``copied_layers``.
        num_rows: rows of the distillation training set.
        num_unlabelled: how many of them are unlabelled text (``augment.unlabelled``).
        num_augmented: how many of them are augmented copies (None: not known, the settings alone are listed).
        temperature: the prediction loss reads the temperature (:meth:`distill.tasks.TaskType.uses_temperature`; a
            regression MSE does not).
        shape: the student's shape as the job resolved it (:attr:`distill.job.table.Job.shape`); None: read here
            (a preset relative to the teacher against ``<output_dir>/teacher``).
    """
    teacher = config.teacher
    made = (f"given: `{public_name(teacher.model)}`" if teacher.model else f"`{public_name(teacher.base_model)}` "
            "fine-tuned on the task "
            f"({teacher_record.get('steps', '?')} steps, lr {teacher.train.learning_rate:g}"
            + _teacher_examples(teacher, teacher_record)
            + (", best dev checkpoint kept" if "selection" in teacher_record else "") + ")")
    dev = ", ".join(f"{k} {teacher_record['dev'][k]:.4f}" for k in headline_metrics(teacher_record["dev"]))
    augment = config.augment
    ranked = ("" if augment.unlabelled_ranked is None
              else f"; the {augment.unlabelled_ranked:g} share of those drawn that the teacher ranked highest")
    skipped = step1.get("skipped", False)
    weights = ran_weights(config, step1, step2)
    copied = step1.get("copied_layers")
    start = (f"student layers 1..{len(copied)} copied from teacher layers {copied} (distill.layer_map "
             f"{config.distill.layer_map})" if copied else describe_init(config.student, config.distill.layer_map))
    if pruned := step1.get("pruned"):
        before = ", ".join(f"{k} {pruned['dev'][k]:.4f}" for k in headline_metrics(pruned.get("dev") or {}))
        stages = "; ".join(_stage_words(stage) for stage in config.student.pruning.stages)
        start = ("the fine-tuned teacher pruned " + (f"in stages (first to {stages}, each stage pruned from the one "
                                                    "before and distilled from the teacher like the student), then "
                                                    if stages else "")
                 + f"to the student's shape: the teacher's layers {pruned['layer_map']} ("
                 + ("the layers that change their input most" if pruned.get("layers") == "importance"
                    else f"distill.layer_map {config.distill.layer_map}")
                 + "), in each the residual channels, head dimensions and FFN neurons of highest "
                 + ("first-order Taylor importance on the teacher's loss" if pruned.get("importance") == "taylor"
                    else "activation (Minitron)")
                 + f" on {pruned.get('num_examples')} training examples; dev {before} before distillation")
    lines = [f"teacher: {made}; dev {dev}",
             _augmentation(augment, num_rows, num_augmented)
             + (f", {num_unlabelled} of them sentences of {', '.join(_corpus_name(u) for u in augment.unlabelled)} "
                f"with no label (the teacher's logits their targets{ranked})" if num_unlabelled else ""),
             (f"general distillation start: `{public_name(general['teacher'])}` on "
              f"{', '.join(Path(c).name for c in general['corpus'])}"
              f", {general['steps']} steps" if general["folder"] else f"start: {start}"),
             f"student: {public_name(config.student.model) if config.student.model is not None else shape or _student_shape(config)}",
             ("layer map: none, no layer is matched (logit-only distillation)" if skipped
              else f"layer map (student 0..M -> teacher): {step1.get('layer_map')}"),
             f"loss weights (the terms that ran): {weights}"
             + (_temperature(config.distill) if "prediction" in weights and temperature else ""),
             ("intermediate step: skipped (every intermediate loss weight is 0)" if skipped
              else f"intermediate step: {_budget(config.distill.intermediate)}")
             + f"; prediction step: {_budget(config.distill.prediction)}"]
    return lines


def _corpus_name(name: str) -> str:
    """A corpus entry in words: a shipped corpus by what it is, a file by its name, a hub dataset by its id."""
    shipped = {"transfer": "the transfer set shipped with the package (Brown and movie-review sentences)",
               "bundled": "the bundled Brown and movie-review sample"}
    return shipped.get(name, Path(name).name)


def _temperature(distill) -> str:
    """The prediction loss's temperature as it ran: with T² scaling when asked for (Hinton et al., 2015)."""
    return f"; temperature {distill.temperature}" + (" (loss × T²)" if distill.temperature_squared else "")


def _teacher_examples(teacher, record: dict) -> str:
    """The teacher's fine-tuning set as the stage record counts it (the share a CPU budget leaves, or a smaller
    training set), for the card; the configured share for records that do not count it."""
    seen = record.get("num_examples")
    if seen is None:
        share = teacher.max_train_examples_cpu
        return f", the first {share:,} training examples" if share else ""
    first = teacher.max_train_examples_cpu is not None and seen <= teacher.max_train_examples_cpu
    return f", the first {seen:,} training examples" if first else f", {seen:,} training examples"


def _augmentation(augment, num_rows: int, num_augmented: int | None) -> str:
    """The augmentation that ran, in words: its settings and the copies made, or that none was made."""
    if not augment.enabled:
        return f"no augmentation; {num_rows} training rows"
    settings = f"N={augment.num_copies}, p={augment.replace_prob}, K={augment.num_candidates}"
    if num_augmented is None:
        return f"augmentation (TinyBERT §3.3): {settings}; {num_rows} training rows"
    if num_augmented == 0:
        why = ("augment.num_copies 0" if augment.num_copies == 0
               else "the training set leaves no room under the augmentation budget")
        return f"no augmented copy made ({why}); {num_rows} training rows"
    return (f"augmentation (TinyBERT §3.3): {settings}; {num_rows} training rows, {num_augmented} of them augmented "
            "copies")


def ran_weights(config: PipelineConfig, step1: dict, step2: dict | None = None) -> dict[str, float]:
    """The loss terms that ran, with their weights: from the steps' records (``weights``), or, for records written
    before they held them, as the steps choose them (the intermediate terms weighted above 0, none when the step was
    skipped; the prediction term at its weight, and the gold-label term ``hard_label`` when it ran: see
    :func:`distill.method.objective.prediction_terms`). A record that predates the ``hard_label`` entry gets it from the
    config: the student's run id includes that weight, so the config of a finished run says what ran. The record wins
    where it has an entry."""
    from distill.method.objective import intermediate_terms, prediction_terms

    first = step1.get("weights")
    if first is None:
        first = {} if step1.get("skipped") else intermediate_terms(config.distill.weights)
    second = (step2 or {}).get("weights")
    second = {**prediction_terms(config.distill.weights, config.distill.hard_label_weight), **(second or {})}
    return {**first, **{name: weight for name, weight in second.items() if weight > 0}}


def _student_shape(config: PipelineConfig) -> dict:
    """The student's shape: a preset relative to the teacher is read against the run's (``<output_dir>/teacher``)."""
    from teachers.models import load_config

    relative = config.student.preset in RELATIVE_PRESETS
    return student_shape(config.student, load_config(str(Path(config.output_dir) / "teacher")) if relative else None)


def _budget(train: TrainConfig) -> str:
    steps = f"{train.max_steps} steps" if train.max_steps else f"{train.num_epochs:g} epoch(s)" + (
        f", at least {train.min_steps} steps" if train.min_steps else "")
    return f"{steps}, batch {train.batch_size}, lr {train.learning_rate:g}"


def _eval_results(spec: TaskSpec, dev: dict, data: dict | None) -> list[EvalResult]:
    """The ``model-index`` results: the hub dataset and split only when the dev set is the hub's (the hub, or the
    bundled copy of GLUE's dev file), with the slice a ``task.max_eval_examples`` subset took; any other dev set by
    the task's name and its size (not by the folder it was read from). Each metric is filed under its own dev set
    (MNLI's ``*_mismatched`` metrics under ``validation_mismatched``)."""
    hub_splits = {"dev": spec.hub_dev_split, **{f"dev_{suffix}": split for suffix, _, split in spec.extra_dev}}
    on_hub = bool(spec.hub) and data is not None and data["kind"] in ("hub", "bundled")
    results = []
    for name in headline_metrics(dev):
        value = dev[name]
        split = next((key for key, suffix in spec.dev_splits.items() if suffix and name.endswith(suffix)), "dev")
        label = "dev" if split == "dev" else f"dev, {split.removeprefix('dev_')}"
        if on_hub and split in data["num_examples"]:
            used, available = data["num_examples"][split], data["num_available"][split]
            subset = used < available
            names = {"dataset_type": hub_dataset_id(spec),
                     **({"dataset_config": spec.name} if spec.hub[0] == "glue" else {}),
                     "dataset_split": hub_splits[split] + (f"[:{used}]" if subset else ""),
                     "dataset_name": f"{spec.name} ({label}"
                                     + (f", first {used} of {available} examples)" if subset else ")")}
        else:  # the data set by its task's name and size: a local folder's path means nothing on the hub
            size = f", {data['num_examples'][split]} examples" if data and split in data["num_examples"] else ""
            names = {"dataset_type": spec.name, "dataset_split": split, "dataset_name": f"{spec.name} ({label}{size})"}
        results.append(EvalResult(task_type=spec.type.card_task(spec), metric_type=name,
                                  metric_value=round(float(value), 4), **names))
    return results


def _latency(value) -> str:
    """A latency cell: the median, with its p10-p90 when known."""
    if isinstance(value, dict):
        return f"{value['median']:.1f} ({value['p10']:.1f}-{value['p90']:.1f})" if "p10" in value else f"{value['median']:.1f}"
    return f"{value:.1f}"


def _table(rows: list[dict], metric_names: list[str], chance: dict | None = None) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row.get("latency_ms", {})))  # e.g. batch_1, batch_32
    spread = any(isinstance(v, dict) for row in rows for v in row.get("latency_ms", {}).values())
    header = ["model", *metric_names, "parameters", "size (MB)",
              *[f"latency {k.replace('_', ' ')} (ms{', p10-p90' if spread else ''})" for k in keys],
              "faster by", "retained"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # No retained share when the teacher (first row) or that student scores about what a constant guess does.
    reference = chance_note("teacher", rows[0]["dev"], chance) if len(rows) > 1 else None
    for i, row in enumerate(rows):
        latency = row.get("latency_ms", {})
        note = (reference or (chance_note("student", row["dev"], chance) if i else None)) if len(rows) > 1 else None
        faster = row.get("faster_by_range")
        cells = [row["name"], *[f"{row['dev'][m]:.4f}" if m in row["dev"] else "-" for m in metric_names],
                 f"{row['num_parameters'] / 1e6:.1f}M" if row.get("num_parameters") else "-",
                 f"{row['size_mb']:.1f}" if row.get("size_mb") else "-",
                 *[_latency(latency[k]) if k in latency else "-" for k in keys],
                 (f"{row['faster_by']:.2f}x" + (f" ({faster[0]:.2f}-{faster[1]:.2f}x)" if faster else ""))
                 if row.get("faster_by") else "-",
                 f"n/a — {note}" if note else f"{100 * row['retained']:.1f}%" if row.get("retained") else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def student_card(*, name: str, spec: TaskSpec, teacher: str | None, rows: list[dict], recipe: list[str],
                 command: str, export: dict | None = None, license: str = "apache-2.0", data: dict | None = None,
                 chance: dict | None = None, latency_note: str | None = None) -> ModelCard:
    """The card of a task-distilled student.

    Args:
        name: the model's name (the card's title and ``model-index`` name).
        spec: the task; its dev metrics are the ``model-index`` results.
        teacher: the teacher's name (hub id, asset name or folder): the base model when it has a hub id.
        rows: table rows, teacher first then the student: ``name``, ``dev`` (metric -> value), and optionally
            ``num_parameters``, ``size_mb``, ``latency_ms`` ({"batch_1": ms, or {"median", "p10", "p90"}}),
            ``faster_by`` and ``faster_by_range`` ([low, high]), ``retained``.
        recipe: lines saying how it was made (stages, layer map, losses, augmentation, steps).
        command: the command that made it.
        export: the ``onnx/export.json`` record, when the folder has ONNX files.
        data: the run's :class:`~distill.tasks.data.DataSource` as a dict with its ``description``: the hub dataset is
            named in the metadata only when the data came from it (or is the bundled copy of its dev set), with the
            subset ``task.max_eval_examples`` took. None: the dev set is named by the task only.
        chance: :func:`teachers.finetune.chance`'s record: a teacher or student at or near chance gets "n/a" and why
            instead of a retained share.
        latency_note: how the latency was measured (default: a generic line).
    """
    student = rows[-1]
    on_hub = bool(spec.hub) and data is not None and data["kind"] in ("hub", "bundled")
    card_data = ModelCardData(language="en", license=license, library_name=spec.type.library_name, tags=TAGS,
                              pipeline_tag=spec.type.pipeline_tag, base_model=hub_id(teacher),
                              datasets=[hub_dataset_id(spec)] if on_hub else None, model_name=name,
                              eval_results=_eval_results(spec, student["dev"], data))
    whole = headline_metrics(student["dev"])
    halves = [half_key(REPORT, m) for m in whole if all(half_key(REPORT, m) in row["dev"] for row in rows)]
    metric_names = halves + whole
    sections = [
        f"# {name}",
        f"A student distilled with tinydistill (TinyBERT-style knowledge distillation, Jiao et al., 2020) from the "
        f"teacher `{public_name(teacher)}` on {spec.name}. It is a plain `transformers` checkpoint"
        + (" and a sentence-transformers folder." if spec.type.library_name == "sentence-transformers" else "."),
        "## Results (dev set)",
        _table(rows, metric_names, chance),
        *([f"`{REPORT}/...`: on the dev set's report half, the half of dev (by a hash of each example's text) on "
           "which no setting was chosen; the other metrics on the whole dev set. The retained share is on the report "
           "half."] if halves else []),
        *([f"Data: {data['description']}."] if data else []),
        latency_note or "Latency on the CPU of the machine that made it, median of repeated runs (see report.md of "
                        "the run).",
        "## How it was made",
        "\n".join(f"- {line}" for line in recipe),
        f"Command:\n\n```bash\n{public_command(command)}\n```",
    ]
    if export:
        sections.append(_export_section(export))
    sections += ["## Use", f"```python\n{spec.type.usage('PATH_OR_REPO', spec)}\n```"]
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def latency_note(timing: dict) -> str:
    """How the report timed the models (its ``timing`` setup), for the card: median and p10-p90, when, reused or
    not, and a warning when the spread was large."""
    note = (f"Latency on the CPU of the machine that made it: median (p10-p90) of {timing['num_repeats']} interleaved "
            f"runs at sequence length {timing['seq_length']}, {timing['num_threads']} threads")
    if timing.get("timed_at"):
        note += f", timed {timing['timed_at']}" + (" (reused on a re-run of the same models)" if timing.get("reused")
                                                    else "")
    note += "; 'faster by' at the largest batch with its range (see report.md of the run)."
    if timing.get("noisy"):
        note += f" Warning: noisy timing, spread (p90 - p10) / median above {timing['max_spread']:g} for " + \
                "; ".join(timing["noisy"]) + "."
    return note


def _metrics_text(dev: dict) -> str:
    """A model's headline dev metrics in words: "f1 0.6427, exact_match 0.5204"."""
    return ", ".join(f"{name} {dev[name]:.4f}" for name in headline_metrics(dev))


def _export_section(export: dict) -> str:
    lines = [f"- `onnx/{file}`: {info['size_mb']:.1f} MB, largest |logit difference| from PyTorch on the dev set "
             f"{info['max_abs_logit_difference']:.2e}, same prediction for {100 * info['same_prediction']:.1f}% "
             f"of dev examples, dev {_metrics_text(info['dev'])}"
             for file, info in export["files"].items()]
    return ("## Deployable files\n\n" + "\n".join(lines) + "\n\nThe `onnx/` folder holds the config and tokenizer "
            "beside the graphs (ONNX Runtime, CPU).")


def record_export(folder: Path, spec: TaskSpec, export: dict) -> None:
    """Put an export's files and checks into the card of ``folder``: its "Deployable files" section is replaced (or
    added before "Use"); a folder without a card gets a short one with the dev results."""
    path = folder / "README.md"
    if not path.is_file():
        rows = [{"name": "student (PyTorch)", "dev": export["pytorch"]["dev"]}]
        card = student_card(name=folder.name, spec=spec, teacher=None, rows=rows, recipe=["see the run that made it"],
                            command="python run_distill.py export --student " + str(folder), export=export)
        card.save(path)
        return
    text = path.read_text(encoding="utf-8")
    section = _export_section(export)
    if "## Deployable files" in text:
        head, rest = text.split("## Deployable files", 1)
        tail = rest[rest.index("\n## "):] if "\n## " in rest else "\n"
        text = head + section + "\n" + tail
    elif "## Use" in text:
        text = text.replace("## Use", section + "\n\n## Use", 1)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def encoder_card(*, name: str, teacher: str, corpus: list[str], recipe: list[str], command: str,
                 license: str = "apache-2.0") -> ModelCard:
    """The card of a general-distilled student encoder (no task, no metrics: a start for task distillation)."""
    data = ModelCardData(language="en", license=license, library_name="transformers", tags=TAGS,
                         base_model=hub_id(teacher), model_name=name)
    sections = [f"# {name}",
                f"A student encoder made by general distillation (TinyBERT §3.4) of `{teacher}` on unlabelled text "
                f"({', '.join(Path(c).name for c in corpus)}); it has no task head. Distil it on a task with "
                "`python run_distill.py pipeline --student THIS_FOLDER`.",
                "## How it was made", "\n".join(f"- {line}" for line in recipe),
                f"Command:\n\n```bash\n{command}\n```"]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def push_to_hub(folder: Path, repo_id: str, token: str | None = None) -> str:
    """Upload a model folder (weights, tokenizer, card, ``onnx/``) to a hub repository, created if needed; the run's
    working files (checkpoints, logs, stage markers) stay behind. Returns the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), ignore_patterns=NOT_UPLOADED,
                      commit_message="Upload a student distilled with tinydistill")
    logger.info("uploaded %s to %s", folder, url)
    return str(url)
