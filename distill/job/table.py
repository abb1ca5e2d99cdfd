"""The job's stages in one table, which the run, the dry run, the sweep and the seeds command all walk.

Each :class:`Step` of :data:`TABLE` is one stage, or one stage with the cache it makes and reads (the intermediate step
with its teacher-output cache, the prediction step with the teacher logits), in the order the job runs them. A step
says its scope (once per output folder, once per student, or once at the end of a single job), the function that runs
it on a :class:`Job`, the function that plans it (the dry run's rows, changing nothing) and the stage folders it
writes (whose wall time the report lists). What decides a stage is said once, and both functions use it:

- whether it runs at all: one rule in the stage's module (:func:`~distill.job.stage_augment.mlm_skip`,
  :func:`~distill.job.stage_distill.general_skip`, :func:`~distill.job.pruned.pruning_skip`), which the stage's code
  follows and the plan prints;
- its run id: the fields and inputs it declares in :mod:`distill.job.stages`;
- whether it is finished, unfinished or another run's: its folder's ``stage.json``
  (:func:`distill.method.checkpoint.stage_status`).

:func:`distill.job.pipeline.run_pipeline` walks every scope; :func:`~distill.job.pipeline.run_sweep` walks the shared
steps once and the student steps once per student (then benchmarks them); the dry runs walk the same steps with
:func:`plan_steps`; the seeds command runs or plans one of those per seed. A step added here is run and planned, in its
place, by every command.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import datasets
import torch
from accelerate import PartialState

from distill.config import PipelineConfig, fingerprint, to_dict, with_absolute_paths
from distill.job.general import cache_folder, general_config, general_run_id
from distill.job.pruned import pruning_skip, stage_config, stage_shapes
from distill.job.stage_augment import (
    augment_stage,
    augmented_inputs,
    makes_no_copy,
    mlm_run_id,
    mlm_skip,
)
from distill.job.stage_distill import (
    general_skip,
    general_stage,
    intermediate_step,
    prediction_step,
    pruned_start,
    student_layers,
    teacher_cache_folder,
    teacher_outputs_run_id,
)
from distill.job.stage_report import (
    card_recipe,
    publish_stage,
    report_stage,
    rescored,
    run_record,
)
from distill.job.stage_teacher import teacher_stage
from distill.job.stages import STAGES
from distill.method.checkpoint import stage_status, write_json_atomic
from distill.method.layer_map import build_layer_map
from distill.method.objective import intermediate_terms
from distill.method.processes import is_main_process
from distill.tasks.base import TaskSpec
from distill.tasks.data import (
    DataSource,
    load_task_data_with_source,
    task_spec,
    tokenize,
)
from students import student_shape
from teachers import load_tokenizer
from teachers.finetune import chance, dev_labels
from teachers.models import load_config as load_model_config

SHARED = "shared"  # once per output folder: every student of a sweep reads it
STUDENT = "student"  # once per student (a sweep's entries each in students/<name>/)
FINAL = "final"  # once at the end of a single job (a sweep benchmarks its students instead)
SCOPES = (SHARED, STUDENT, FINAL)


@dataclass
class Job:
    """One walk of the table: the config, where it writes, and what the steps run so far made.

    Attributes:
        config: the job (a sweep entry's, for a student's steps).
        out: the output folder (teacher, masked LM, augmented set, teacher logits).
        student_dir: where the student's own stages go (``out``; a sweep's ``out/students/<name>``).
        device: where every stage computes; None when the job is planned, not run.
        command: the command line that started it, for the model card.
        spec, data, source, teacher, train_data, data_run_id: set by the shared steps (the task, its data and
            where they come from, the teacher stage's record, the distillation set and its run id).
        general, start, step1, student, report: set by the student and final steps (the general stage's record,
            the student the intermediate step starts from, the two steps' records, the report).
        teacher_config, shape: the teacher's model config and the student's shape, each resolved once on first use
            (properties) and passed down to the stages that prune, build or describe the student.
    """

    config: PipelineConfig
    out: Path
    student_dir: Path
    device: torch.device | None = None
    command: str | None = None
    spec: TaskSpec | None = None
    data: datasets.DatasetDict | None = None
    source: DataSource | None = None
    teacher: dict | None = None
    train_data: datasets.Dataset | None = None
    data_run_id: str | None = None
    general: dict | None = None
    start: dict | None = None
    step1: dict | None = None
    student: dict | None = None
    report: dict | None = None
    _train_set: datasets.Dataset | None = field(default=None, repr=False)
    _teacher_config: Any = field(default=None, repr=False)
    _shape: dict | None = field(default=None, repr=False)

    @property
    def teacher_config(self) -> Any:
        """The teacher's model config, read once: the fine-tuned teacher in ``out/teacher`` once the teacher stage
        has made it (every step that asks comes after it), else the configured model (a dry run before the teacher
        stage); None when neither can be read here (a hub teacher offline)."""
        if self._teacher_config is None:
            self._teacher_config = _planned_teacher_config(self.config, self.out)
        return self._teacher_config

    @property
    def shape(self) -> dict | None:
        """The student's shape (:func:`students.student_shape`: depth, width, heads, FFN), resolved once against
        :attr:`teacher_config` (a preset relative to the teacher is read against it); None for a student started from
        a checkpoint (``student.model``: its own shape) or when the teacher's config cannot be read yet."""
        if self._shape is None and self.config.student.model is None and self.teacher_config is not None:
            self._shape = student_shape(self.config.student, self.teacher_config)
        return self._shape

    @property
    def train_set(self) -> datasets.Dataset:
        """The distillation set tokenized by the teacher's tokenizer (made once per job, on first use)."""
        if self._train_set is None:
            tokenizer = load_tokenizer(str(self.out / "teacher"))
            columns = [*self.spec.text_columns, "label"]
            self._train_set = tokenize(self.train_data.select_columns(columns), tokenizer, self.spec,
                                       self.config.task.max_seq_length)
        return self._train_set

    def for_student(self, config: PipelineConfig, student_dir: Path) -> "Job":
        """This job's shared results with another student's config and folder (a sweep's entry)."""
        return dataclasses.replace(self, config=config, student_dir=student_dir, general=None, start=None,
                                   step1=None, student=None, report=None, _train_set=None, _shape=None)


@dataclass
class Plan:
    """The dry run's rows so far (see :func:`distill.job.pipeline.plan_pipeline`) and the run ids planned, by input
    name ("teacher", "augmented", "general", "start": the intermediate step's start, "student_intermediate",
    "teacher_logits", "student")."""

    rows: list[dict] = field(default_factory=list)
    ids: dict[str, str | None] = field(default_factory=dict)

    def add(self, stage: str, folder: Path | None, run_id: str | None, why: str | None = None) -> str | None:
        """A row: ``skip`` with ``why``; ``run`` for a stage without a folder; ``unknown`` for one whose run id cannot
        be known yet; else what its folder holds (:func:`distill.method.checkpoint.stage_status`). Returns
        ``run_id``."""
        action = ("skip" if why else "run" if folder is None else "unknown" if run_id is None
                  else stage_status(folder, run_id))
        self.rows.append({"stage": stage, "folder": str(folder) if folder else None, "run_id": run_id,
                          "action": action, **({"why": why} if why else {})})
        return run_id


@dataclass(frozen=True)
class Step:
    """One step of :data:`TABLE`: its name, scope (:data:`SCOPES`), the function that runs it on a :class:`Job`, the
    function that adds its rows to a :class:`Plan`, and the stage folders it writes under a config."""

    name: str
    scope: str
    run: Callable[[Job], None]
    plan: Callable[[Job, Plan], None]
    folders: Callable[[PipelineConfig], list[str]] = lambda config: []


# --- teacher ---------------------------------------------------------------------------------------------------------

def _run_teacher(job: Job) -> None:
    job.spec = task_spec(job.config.task)
    job.data, job.source = load_task_data_with_source(job.config.task, job.spec)
    # Written once the config and the data are known to be good: a run refused before here leaves a finished
    # folder's record of its config as it was.
    if is_main_process():
        write_json_atomic(job.out / "config.json", to_dict(with_absolute_paths(job.config)))  # read from any folder
    job.teacher = teacher_stage(job.config, job.spec, job.data, job.out, device=job.device)


def _plan_teacher(job: Job, plan: Plan) -> None:
    plan.ids["teacher"] = plan.add("teacher", job.out / "teacher", STAGES["teacher"].run_id(job.config, {}))


# --- masked LM and augmentation --------------------------------------------------------------------------------------

def _run_augmented(job: Job) -> None:
    job.train_data, job.data_run_id = augment_stage(job.config, job.spec, job.data, job.out, job.teacher,
                                                    device=job.device)


def _plan_augmented(job: Job, plan: Plan) -> None:
    config, out = job.config, job.out
    no_copy = makes_no_copy(config) if config.augment.enabled else None  # None: the data are not read here
    why = mlm_skip(config, None if no_copy is None else not no_copy)
    plan.add("mlm", None if why else out / "mlm", None if why else mlm_run_id(config), why)
    if not why and plan.rows[-1]["action"] != "reuse" and no_copy is None and config.augment.max_rows is not None:
        plan.rows[-1]["note"] = "not if the training set leaves no room for copies under augment.max_rows"
    if not config.augment.enabled:
        plan.add("augmented", None, None, "augment.enabled is false")
        plan.ids["augmented"] = STAGES["augmented"].run_id(config, {"mlm": "none"})
    else:
        plan.ids["augmented"] = plan.add("augmented", out / "augmented", STAGES["augmented"].run_id(
            config, augmented_inputs(config, plan.ids["teacher"])))


def _augmented_folders(config: PipelineConfig) -> list[str]:
    return ["mlm"] * (mlm_skip(config, None) is None) + ["augmented"] * bool(config.augment.enabled)


# --- general distillation --------------------------------------------------------------------------------------------

def _run_general(job: Job) -> None:
    job.general = job.start = general_stage(job.config, job.student_dir, device=job.device)


def _plan_general(job: Job, plan: Plan) -> None:
    why = general_skip(job.config)
    if why:
        plan.add("general", None, None, why)
        plan.ids["general"] = "none"
    else:
        general = general_config(job.config)
        run_id = general_run_id(general)[0]
        plan.ids["general"] = plan.add("general", cache_folder(general, run_id), run_id)
    plan.ids["start"] = plan.ids["general"]


# --- pruning ---------------------------------------------------------------------------------------------------------

def _run_pruned(job: Job) -> None:
    pruned = pruned_start(job.config, job.spec, job.data, job.teacher, job.train_set, job.data_run_id, job.out,
                          job.student_dir, device=job.device, teacher_config=job.teacher_config, shape=job.shape)
    job.start = pruned if pruned["folder"] else job.general


def _plan_pruned(job: Job, plan: Plan) -> None:
    config, ids = job.config, plan.ids
    if pruning_skip(config):
        return
    logits_id = _logits_id(job, plan)
    source_id = None
    teacher_config = job.teacher_config if config.student.pruning.stages else None
    for number, shape in enumerate(stage_shapes(config.student, teacher_config) if teacher_config else [], 1):
        stage, where = stage_config(config, shape), job.student_dir / "pruning" / f"stage-{number}"
        pruned_id = STAGES["pruned"].run_id(stage, {"teacher": ids["teacher"]})
        pruned_id = plan.add(f"pruning stage {number}: pruned", where / "pruned",
                             pruned_id if source_id is None else fingerprint(pruned_id, source_id))
        step_id = plan.add(f"pruning stage {number}: student_intermediate", where / "student_intermediate",
                           STAGES["student_intermediate"].run_id(
                               stage, {"teacher": ids["teacher"], "augmented": ids["augmented"], "general": pruned_id}))
        if stage.distill.teacher_cache is not None:  # its run id follows the layers the stage's pruning keeps
            plan.rows[-1]["note"] = f"with its teacher-output cache in {where / 'teacher_outputs'}"
        source_id = plan.add(f"pruning stage {number}: student", where / "student", STAGES["student"].run_id(
            stage, {"student_intermediate": step_id, "teacher_logits": logits_id}))
    pruned_id = STAGES["pruned"].run_id(config, {"teacher": ids["teacher"]})
    ids["start"] = plan.add("pruned", job.student_dir / "pruned",
                            None if config.student.pruning.stages and teacher_config is None
                            else pruned_id if source_id is None else fingerprint(pruned_id, source_id))
    if ids["start"] is None:
        plan.rows[-1]["note"] = "in stages, whose shapes are read against the teacher's config: not readable yet"


def _pruned_folders(config: PipelineConfig) -> list[str]:
    return [] if pruning_skip(config) else ["pruning"] * bool(config.student.pruning.stages) + ["pruned"]


# --- task distillation: intermediate step (with the teacher-output cache), prediction step (with the teacher logits) --

def _run_intermediate(job: Job) -> None:
    job.step1 = intermediate_step(job.config, job.spec, job.teacher, job.train_set, job.data_run_id, job.start, job.out,
                                  job.student_dir / "student_intermediate", device=job.device, shape=job.shape)


def _plan_intermediate(job: Job, plan: Plan) -> None:
    config, ids = job.config, plan.ids
    if config.distill.teacher_cache is not None:
        cache_id = _planned_cache_id(job, ids["teacher"], ids["augmented"])
        plan.add("teacher_outputs", teacher_cache_folder(job.student_dir, job.out, cache_id) if cache_id
                 else job.student_dir / "teacher_outputs", cache_id,
                 None if cache_id else "no intermediate term, or the teacher's config cannot be read yet")
    ids["student_intermediate"] = plan.add(
        "student_intermediate", job.student_dir / "student_intermediate", None if ids["start"] is None else
        STAGES["student_intermediate"].run_id(config, {"teacher": ids["teacher"], "augmented": ids["augmented"],
                                                       "general": ids["start"]}))
    rows = plan.rows
    if ids["student_intermediate"] and rows[-1]["action"] == "reuse" and rows[-2]["stage"] == "teacher_outputs" \
            and rows[-2]["action"] != "reuse":
        rows[-2].update(action="skip", why="the intermediate step is finished; its teacher outputs are not needed")


def _intermediate_folders(config: PipelineConfig) -> list[str]:
    return ["teacher_outputs"] * (config.distill.teacher_cache is not None) + ["student_intermediate"]


def _logits_id(job: Job, plan: Plan) -> str:
    return STAGES["teacher_logits"].run_id(job.config, {"teacher": plan.ids["teacher"],
                                                        "augmented": plan.ids["augmented"]})


def _run_student(job: Job) -> None:
    job.student = prediction_step(job.config, job.spec, job.data, job.teacher, job.train_set, job.data_run_id,
                                  job.step1, job.out, job.student_dir / "student", device=job.device)


def _plan_student(job: Job, plan: Plan) -> None:
    config, ids, rows = job.config, plan.ids, plan.rows
    ids["teacher_logits"] = plan.add("teacher_logits", job.out / "teacher_logits", _logits_id(job, plan))
    if config.distill.teacher_cache is not None and rows[-1]["action"] in ("run", "resume", "replace") \
            and not rows[-1].get("note"):
        rows[-1]["note"] = "from the teacher-output cache's own forward pass when that kept them"
    ids["student"] = plan.add("student", job.student_dir / "student", None if ids["student_intermediate"] is None
                              else STAGES["student"].run_id(config, {"student_intermediate": ids["student_intermediate"],
                                                                     "teacher_logits": ids["teacher_logits"]}))
    if rows[-1]["action"] == "reuse" and rows[-2]["action"] != "reuse":  # only the prediction step reads the cache
        rows[-2].update(action="skip", why="the student is finished; the teacher logits are not needed")


# --- report and export (a single job's; a sweep benchmarks its students instead) -----------------------------------

def _run_report(job: Job) -> None:
    config, spec, data, out = job.config, job.spec, job.data, job.out
    job.teacher = rescored(job.teacher, out / "teacher", config, spec, data, job.device)
    job.student = rescored(job.student, job.student_dir / "student", config, spec, data, job.device)
    # Under a multi-process launch the main process times the models and writes the report, the ONNX files and the
    # card; the others then build the same report from the timing it stored (no second timing on shared cores, no
    # two writers of one file).
    processes = PartialState()
    with processes.main_process_first():
        job.report = report_stage(config, spec, job.teacher, job.student, out, device=job.device,
                                  stages=stage_folders(config), chance=chance(spec, dev_labels(data, spec)),
                                  run=run_record(spec, job.source, out), write=processes.is_main_process)


def _run_export(job: Job) -> None:
    processes = PartialState()
    if processes.is_main_process:
        out = job.out
        general = json.loads((job.student_dir / "general.json").read_text(encoding="utf-8"))
        step1 = json.loads((job.student_dir / "student_intermediate" / "stage.json").read_text(encoding="utf-8"))
        recipe = card_recipe(job.config, job.spec, job.teacher, general, step1, job.train_data, job.student,
                             shape=job.shape)
        publish_stage(job.config, job.spec, job.data, out, job.report, recipe,
                      job.command or f"python run_distill.py pipeline --config {out / 'config.json'}")
    processes.wait_for_everyone()


def _plan_export(job: Job, plan: Plan) -> None:
    plan.add("export", None, None, None if job.config.export.onnx else "export.onnx is false")


TABLE: list[Step] = [
    Step("teacher", SHARED, _run_teacher, _plan_teacher, lambda config: ["teacher"]),
    Step("augmented", SHARED, _run_augmented, _plan_augmented, _augmented_folders),
    Step("general", STUDENT, _run_general, _plan_general, lambda config: ["general"]),
    Step("pruned", STUDENT, _run_pruned, _plan_pruned, _pruned_folders),
    Step("student_intermediate", STUDENT, _run_intermediate, _plan_intermediate, _intermediate_folders),
    Step("student", STUDENT, _run_student, _plan_student, lambda config: ["teacher_logits", "student"]),
    Step("report", FINAL, _run_report, lambda job, plan: plan.add("report", None, None)),
    Step("export", FINAL, _run_export, _plan_export),
]


def run_steps(job: Job, scopes: tuple[str, ...] = SCOPES) -> Job:
    """Run :data:`TABLE`'s steps of ``scopes`` on ``job``, in order (each skipping or reusing what is done)."""
    for step in TABLE:
        if step.scope in scopes:
            step.run(job)
    return job


def plan_steps(job: Job, plan: Plan, scopes: tuple[str, ...] = SCOPES) -> Plan:
    """Add the rows of :data:`TABLE`'s steps of ``scopes`` for ``job`` to ``plan``, in order, changing nothing."""
    for step in TABLE:
        if step.scope in scopes:
            step.plan(job, plan)
    return plan


def stage_folders(config: PipelineConfig) -> list[str]:
    """The stage folders a job with this config runs or reuses, in order (for its report's stage times)."""
    return [folder for step in TABLE for folder in step.folders(config)]


def _planned_teacher_config(config: PipelineConfig, out: Path) -> Any:
    """The teacher's config as the run will read it (the fine-tuned one in ``out/teacher``, else the configured
    model), or None when it cannot be read yet (a hub teacher offline)."""
    teacher = out / "teacher"
    try:
        return load_model_config(str(teacher) if (teacher / "config.json").is_file()
                                 else config.teacher.model or config.teacher.base_model)
    except (OSError, ValueError):  # ModelError is a ValueError
        return None


def _planned_cache_id(job: Job, teacher_id: str, data_id: str) -> str | None:
    """The teacher-output cache's run id as the pipeline will compute it for ``job``'s student, or None when there is
    no intermediate term or the teacher's config cannot be read (a hub teacher offline, before the teacher stage
    ran)."""
    config, teacher_config, student_dir = job.config, job.teacher_config, job.student_dir
    terms = intermediate_terms(config.distill.weights)
    if not terms or teacher_config is None:
        return None
    try:
        layers = student_layers(config, job.shape)
    except (OSError, ValueError):  # ModelError is a ValueError
        return None
    layer_map = build_layer_map(config.distill.layer_map, teacher_config.num_hidden_layers, layers)
    if config.student.init == "pruned" and (config.student.pruning.layers == "importance"
                                            or config.student.pruning.stages):
        pruned = student_dir / "pruned" / "stage.json"  # the layers the pruning stage chose (its stages too), once run
        if not pruned.is_file():
            return None
        layer_map = json.loads(pruned.read_text(encoding="utf-8"))["layer_map"]
    return teacher_outputs_run_id(config, teacher_id, data_id, terms, layer_map)
