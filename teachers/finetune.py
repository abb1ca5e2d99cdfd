"""Make a teacher: fine-tune a pre-trained encoder (by default the bundled MiniLM) on the task."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import datasets
import torch
from transformers import set_seed

from distill.method.checkpoint import mark_stage_done
from distill.config import TaskConfig, TeacherConfig
from distill.tasks.base import TaskSpec
from distill.tasks.data import collator, tokenize
from distill.tasks.evaluate import dev_scorer, evaluate, evaluate_task
from distill.tasks.split import TUNING, half_key
from distill.method.objective import ModelLossObjective
from distill.method.processes import on_main
from distill.tasks import record_serving, record_tuned
from distill.method.trainer import BEST_FOLDER, Selection, train
from teachers.models import ModelError, load_tokenizer, resolve_model

logger = logging.getLogger(__name__)


# The refusal bar of :func:`check_teacher_quality` and the "near chance" flag of the report and the card: chance plus
# this much on the task's primary metric.
CHANCE_MARGIN = 0.05


def chance(spec: TaskSpec, dev_labels=None) -> dict:
    """What a model that has learnt nothing scores on the task's primary metric (``spec.metrics[0]``): the best
    constant guess on this dev set, as the task's type computes it (:meth:`distill.tasks.TaskType.chance`; e.g. the
    majority-class rate for accuracy).

    Args:
        spec: the task.
        dev_labels: the main dev set's labels (:func:`dev_labels`); the types whose chance depends on their balance
            need them.

    Returns:
        {"metric": the primary metric, "value": chance on it, "basis": how it is reached, in words (e.g.
        "majority class 'equivalent'")}.

    Raises:
        ValueError: a type that needs dev labels got none.
    """
    return spec.type.chance(spec, dev_labels)


def chance_level(spec: TaskSpec, dev_labels=None) -> float:
    """The value of :func:`chance` (same arguments, same errors)."""
    return chance(spec, dev_labels)["value"]


def dev_labels(data: datasets.DatasetDict, spec: TaskSpec):
    """The main dev split's labels (for a chance level that depends on them)."""
    split = next(iter(spec.dev_splits))
    return data[split]["label"]


def check_teacher_quality(metrics: dict, spec: TaskSpec, minimum: float | None, name: str, dev_labels=None) -> None:
    """Refuse a teacher whose primary dev metric is below ``minimum`` (default: chance + :data:`CHANCE_MARGIN`, see
    :func:`chance`; a teacher that always predicts the majority class is refused).

    Args:
        metrics: the teacher's dev metrics, {name: value}.
        spec: the task.
        minimum: the bar (``teacher.min_dev_metric``), or None for chance + 0.05.
        name: the teacher, for the message.
        dev_labels: (N,) the main dev set's label ids (needed by the default bar on accuracy and F1).

    Raises:
        ModelError: naming the metric, its value, the threshold and chance.
        ValueError: the default bar on accuracy or F1 without ``dev_labels``.
    """
    metric = spec.metrics[0]
    level = chance(spec, dev_labels) if minimum is None or dev_labels is not None else None
    threshold = level["value"] + CHANCE_MARGIN if minimum is None else minimum
    if metrics[metric] < threshold:
        about = f"chance is {level['value']:.4f}, {level['basis']}" if level else "set by teacher.min_dev_metric"
        # Far below chance on a classification task is what a good teacher gives with its classes in another order.
        far_below = bool(level) and metric == "accuracy" and metrics[metric] < level["value"] / 2
        reversed_hint = (" Far below chance: a teacher whose classes are in another order than the task's scores so; "
                         "check its config's id2label (named with the task's labels, teacher.remap_labels: true "
                         "reorders them)." if far_below else "")
        raise ModelError(
            f"teacher {name!r} has dev {metric} {metrics[metric]:.4f}, below {threshold:.4f} ({about}): it is not "
            f"fine-tuned for {spec.name} or is broken. Distilling it would give a garbage student. Train it longer, "
            f"or lower teacher.min_dev_metric if you mean it.{reversed_hint}"
        )


def restarts_for(config: TeacherConfig, num_examples: int) -> int:
    """How many times the teacher is fine-tuned: ``teacher.restarts`` when it learns from fewer than
    ``teacher.restarts_below`` examples (or that is null), else once."""
    small = config.restarts_below is None or num_examples < config.restarts_below
    return config.restarts if small else 1


def finetune_teacher(
    config: TeacherConfig, task: TaskConfig, spec: TaskSpec, data: datasets.DatasetDict, stage_dir: Path, run_id: str,
    *, device: torch.device,
) -> dict:
    """Fine-tune the teacher (:func:`fine_tune_once`), or with restarts (:func:`restarts_for` above 1) fine-tune it
    that many times in ``stage_dir/restart-N`` with seeds ``train.seed``, +1, ..., keep the one best on the dev set's
    tuning half (its files moved into ``stage_dir``, the others' weights removed) and record every restart's scores
    (``restarts``: [{"seed", "dev"}], ``kept``: the seed kept). Each restart resumes and is reused like a stage.
    Arguments, return and errors: as :func:`fine_tune_once`."""
    count = len(data["train"]) if config.max_train_examples_cpu is None or torch.device(device).type != "cpu" else \
        min(config.max_train_examples_cpu, len(data["train"]))
    restarts = restarts_for(config, count)
    if restarts == 1:
        return fine_tune_once(config, task, spec, data, stage_dir, run_id, device=device)
    import dataclasses

    from distill.config import fingerprint
    from distill.method.checkpoint import finished_or_superseded

    records = []
    for number in range(restarts):
        seed = config.train.seed + number
        folder, sub_id = stage_dir / f"restart-{number + 1}", fingerprint(run_id, "restart", seed)
        once = dataclasses.replace(config, restarts=1, train=dataclasses.replace(config.train, seed=seed))
        record = finished_or_superseded(folder, sub_id) or fine_tune_once(once, task, spec, data, folder, sub_id,
                                                                          device=device)
        records.append((seed, folder, record))
        logger.info("teacher restart %d of %d (seed %d): dev %s", number + 1, restarts, seed, record["dev"])
    primary = spec.metrics[0]

    def tuning(record: dict) -> float:
        return record["dev"].get(half_key(TUNING, primary), record["dev"][primary])

    seed, best_folder, best = max(records, key=lambda found: tuning(found[2]))

    def finish() -> None:  # the kept restart's model beside the stage's record; the others' weights go
        for path in best_folder.iterdir():
            if path.is_file() and path.name not in ("stage.json", "started.json", "log.jsonl"):
                shutil.copy2(path, stage_dir / path.name)
        for _, folder, _ in records:
            for weights in folder.glob("*.safetensors"):
                weights.unlink()
        summary = [{"seed": s, "dev": r["dev"]} for s, _, r in records]
        mark_stage_done(stage_dir, run_id, {**{k: v for k, v in best.items() if k not in ("run_id", "seconds",
                                                                                           "resumed")},
                                            "restarts": summary, "kept": seed,
                                            "seconds": sum(r.get("seconds") or 0.0 for _, _, r in records)})

    return on_main(stage_dir, run_id, finish)


def fine_tune_once(
    config: TeacherConfig, task: TaskConfig, spec: TaskSpec, data: datasets.DatasetDict, stage_dir: Path, run_id: str,
    *, device: torch.device,
) -> dict:
    """Fine-tune ``config.base_model`` with a new classification head on ``data["train"]`` (on a CPU its first
    ``config.max_train_examples_cpu`` examples when set); save to ``stage_dir``.

    The run checkpoints into ``stage_dir/checkpoints`` and resumes from there; the final model and tokenizer are saved
    as a plain HF checkpoint in ``stage_dir`` and the stage is marked done with its dev metrics. Training and the
    dev evaluation run on ``device``. With ``config.select_best`` the main dev set's primary metric is scored after
    every epoch (or every ``eval_steps`` steps) and the best weights are kept, not the last: model selection on the
    dev set, as GLUE fine-tuning practice does, made on its tuning half only (:mod:`distill.tasks.split`), so the
    report half's score of the kept teacher was not used to choose it.

    Returns:
        The stage record: {"run_id", "dev": {metric: value}, "num_train_examples" (rows trained on: a QA question's
        windows count apart), "num_examples" (training examples, before tokenization), "steps", "device"}, and with
        selection {"selection": {"metric", "best_step", "evaluations": [[step, value], ...], "last": value}}.
    """
    tokenizer = load_tokenizer(config.base_model)
    set_seed(config.train.seed)  # the new classifier head is drawn from the global RNG: same seed, same teacher
    model = spec.type.model_class(spec).from_pretrained(resolve_model(config.base_model), **spec.type.head_config(spec))
    train_examples = data["train"]
    if config.max_train_examples_cpu is not None and torch.device(device).type == "cpu":  # the CPU rule (for_device)
        train_examples = train_examples.select(range(min(config.max_train_examples_cpu, len(train_examples))))
    spec.type.init_head(spec, model, train_examples)  # e.g. a multi-label head at its labels' training frequencies
    train_set = tokenize(train_examples, tokenizer, spec, task.max_seq_length)
    objective = ModelLossObjective(model)
    selection, scored = None, []  # scored: every dev evaluation's full metrics, in this process's order

    # the checkpoint is chosen on the dev set's tuning half (on the whole dev set when that half is empty: a dev set
    # of a few examples)
    selected_on = spec.metrics[0]

    def score(dev: datasets.Dataset, context, halves) -> float:
        scored.append(evaluate(model, dev, tokenizer, spec, device=device, context=context, halves=halves))
        return scored[-1][selected_on]

    if config.select_best:
        split = next(iter(spec.dev_splits))
        dev = tokenize(data[split], tokenizer, spec, task.max_seq_length)
        context = spec.type.metric_context(spec, data, split, tokenizer, task.max_seq_length)  # as evaluate_task scores
        halves = dev_scorer(spec, data, split, dev, tokenizer, task.max_seq_length)
        if len(halves.rows[TUNING]):
            selected_on = half_key(TUNING, spec.metrics[0])
        selection = Selection(lambda: score(dev, context, halves), config.eval_steps)
    state = train(objective, train_set, collator(tokenizer, spec), config.train, stage_dir, run_id, "teacher fine-tuning",
                  device=device, selection=selection)

    def finish() -> None:  # one process saves and scores the teacher; the others then read its record
        record_serving(model, spec, task.max_seq_length)  # how it is served as scored (a QA reader's windows)
        model.save_pretrained(stage_dir)
        tokenizer.save_pretrained(stage_dir)
        # The kept weights were scored on the one dev set when they were selected (same data, batches and code): reuse
        # that, not a second pass (5 minutes for SQuAD's dev set on a CPU). A run resumed after that evaluation, or a
        # task with a second dev set (MNLI mismatched), is scored here.
        scored_here = state.evaluations[len(state.evaluations) - len(scored):]  # the evaluations made in this process
        by_step = {step: metrics for (step, _), metrics in zip(scored_here, scored)}
        metrics = by_step.get(state.best_step) if len(spec.dev_splits) == 1 else None
        if metrics is None:
            metrics = evaluate_task(model, data, tokenizer, spec, task.max_seq_length, device=device)
        logger.info("teacher dev metrics: %s", metrics)
        check_teacher_quality(metrics, spec, config.min_dev_metric, str(stage_dir), dev_labels(data, spec))
        if record_tuned(model, spec, metrics):  # a decision threshold chosen on dev's tuning half ships with it
            model.config.save_pretrained(stage_dir)
        shutil.rmtree(stage_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(stage_dir / BEST_FOLDER, ignore_errors=True)
        record = {"dev": metrics, "num_train_examples": len(train_set), "num_examples": len(train_examples),
                  "steps": state.step, "device": str(device)}
        if selection is not None:
            record["selection"] = {"metric": selected_on, "best_step": state.best_step,
                                   "evaluations": state.evaluations, "last": state.evaluations[-1][1]}
        mark_stage_done(stage_dir, run_id, record)

    return on_main(stage_dir, run_id, finish)
