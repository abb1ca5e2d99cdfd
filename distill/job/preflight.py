"""Checks of a job's inputs before its first stage runs, so that a typo or an impossible shape is not found an hour in."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from augment import check_word_vectors, load_stopwords
from distill.method.capture import CaptureError, capture_support
from distill.config import ConfigError, PipelineConfig, with_overrides
from distill.job.corpus import corpus_sources
from distill.tasks.data import task_spec
from distill.job.general import general_config
from distill.method.layer_map import build_layer_map
from distill.method.objective import intermediate_terms
from distill.job.stages import STAGES
from students import RELATIVE_PRESETS, student_family, student_shape
from teachers.mlm import corpus_files
from teachers.models import check_teacher_config, load_config as load_model_config

logger = logging.getLogger(__name__)


def check_names(config: PipelineConfig) -> None:
    """The names a config gives that registries of the layers above the config define: ``task.task_type`` (a
    registered task type), ``task.metrics`` (metrics a type scores) and the loss weights' terms (``distill.weights``:
    intermediate and prediction terms; ``general.weights``: intermediate ones).

    Raises:
        ConfigError: an unknown name, naming its field and the known ones.
    """
    from distill.method.terms import terms_of
    from distill.tasks import TASK_TYPES, metric_names

    types, metrics = tuple(TASK_TYPES), metric_names()
    task = config.task
    if task.task_type not in (None, *types):
        raise ConfigError(f"task.task_type: must be {', '.join(types[:-1])} or {types[-1]}, got {task.task_type!r}")
    unknown = [m for m in task.metrics or [] if m not in metrics]
    if unknown:
        raise ConfigError(f"task.metrics: unknown metric(s) {unknown}; use {', '.join(metrics)}")
    sections = [("distill", config.distill.weights, ("intermediate", "prediction")),
                ("general", config.general.weights, ("intermediate",))]
    for where, weights, steps in sections:
        terms = tuple(name for step in steps for name in terms_of(step))
        for term in weights:
            if term not in terms:
                raise ConfigError(f"{where}.weights.{term}: unknown loss term; use {', '.join(terms)}")


def augments(task) -> bool:
    """Whether ``augment.enabled: auto`` augments this task: its task type (``task.task_type``, a named task's, else
    sequence classification) keeps its labels under word replacement (:attr:`distill.tasks.TaskType.
    supports_augmentation`; not extractive QA)."""
    from distill.tasks import DEFAULT_TYPE, TASKS, get_task_type

    named = TASKS.get(task.name) if task.train_file is None else None
    return get_task_type(task.task_type or (named.task_type if named else DEFAULT_TYPE)).supports_augmentation


def prepare(config: PipelineConfig) -> PipelineConfig:
    """A loaded config made ready for the job: its names checked against the registries (:func:`check_names`) and
    ``augment.enabled: auto`` resolved by the task type (:func:`augments`), so that stages and run ids see a bool. Every
    entry of the job (pipeline, plan, sweep, the command line) calls it; a prepared config is returned as it is.

    Raises:
        ConfigError: what :func:`check_names` refuses.
    """
    check_names(config)
    if config.augment.enabled == "auto":
        return with_overrides(config, {"augment.enabled": augments(config.task)})
    return config


def preflight(config: PipelineConfig) -> None:
    """Check inputs of later stages before the first one runs, so a typo is not found an hour in.

    Raises:
        VectorsError, DataError: missing word vectors, stop word list or corpus file (masked LM, unlabelled text or
            general stage).
        ModelError: the general stage's teacher cannot be found.
        ConfigError: an unknown student preset or an impossible student shape; augmentation on for a task type that
            it would corrupt (question answering); unlabelled text a run cannot use (:func:`check_unlabelled`).
    """
    spec = task_spec(config.task)
    kind = spec.type
    kind.check_options(spec)  # e.g. a sentence encoder's pooling and teacher_space, before any stage runs
    if kind.teacher_as_is and config.teacher.model is None:
        raise ConfigError(f"teacher.model: a {kind.description} task distils the encoder you deploy, as it is (it is "
                          "not fine-tuned here): name it with --teacher (e.g. --teacher minilm, --teacher mpnet, or a "
                          "sentence-transformers folder)")
    if config.augment.unlabelled and not config.augment.enabled:
        raise ConfigError("augment.unlabelled: its sentences join the augmented set, and augment.enabled is false; "
                          "set augment.enabled: true, or drop augment.unlabelled")
    if config.augment.enabled:
        kind = task_spec(config.task).type
        if not kind.supports_augmentation:
            raise ConfigError(f"augment.enabled: TinyBERT's word replacement would change the labels of a "
                              f"{kind.description} {kind.augmentation_refusal}; set augment.enabled: false (or auto)"
                              .replace("  ", " "))
        if config.augment.replace_entities and config.distill.hard_label_weight > 0:
            # measured on WNUT-17: the teacher gives a replaced entity word the tag its copy keeps 13% of the time
            logger.warning("augment.replace_entities with distill.hard_label_weight=%g: a copy keeps the tags of the "
                           "entity words it replaced, which the new words mostly do not bear, and the hard-label term "
                           "trains on them; set distill.hard_label_weight: 0 (the teacher's logits are the targets) "
                           "or augment.replace_entities: false", config.distill.hard_label_weight)
        if config.augment.unlabelled:
            check_unlabelled(config)
        elif config.augment.unlabelled_ranked is not None:
            raise ConfigError(f"augment.unlabelled_ranked={config.augment.unlabelled_ranked:g} ranks the sentences of "
                              "augment.unlabelled, which names no text; name some (e.g. [transfer]) or drop it")
        check_word_vectors(config.augment.word_vectors)
        load_stopwords(config.augment.stopwords)
        if config.mlm.model is None:
            corpus_files(config.mlm.corpus)
        else:
            check_masked_lm(config.mlm.model)
    check_not_a_stage_folder(config)
    teacher = load_model_config(config.teacher.model or config.teacher.base_model)
    if config.student.model is None:
        try:
            shape = student_shape(config.student, teacher)
        except ValueError as error:
            raise ConfigError(f"student: {error}") from None
        if config.general.enabled:
            corpus_sources(config.general.corpus)
            general_teacher = load_model_config(general_config(config).teacher)
            try:
                build_layer_map(config.general.layer_map, general_teacher.num_hidden_layers,
                                shape["num_hidden_layers"])
            except ValueError as error:
                raise ConfigError(f"general.layer_map: {error}") from None
    check_student_fits_teacher(config, teacher)


def check_masked_lm(name_or_path: str) -> None:
    """``mlm.model`` names a masked LM (its config's ``architectures`` a ``...ForMaskedLM``, when it says).

    Raises:
        ModelError: it cannot be found, or it is a model without a masked-LM head.
    """
    from teachers.models import ModelError

    architectures = load_model_config(name_or_path).architectures or []
    if architectures and not any(name.endswith("ForMaskedLM") for name in architectures):
        raise ModelError(f"mlm.model: {name_or_path} is a {', '.join(architectures)}, not a masked LM; give a "
                         "...ForMaskedLM checkpoint, or leave mlm.model null to adapt one (run_distill.py adapt-mlm)")


def check_not_a_stage_folder(config: PipelineConfig) -> None:
    """``teacher.model`` and ``student.model`` are not folders of this job's own stages: naming one changes the run ids
    of the stages that write them, which moves that very folder to ``superseded/`` before it is loaded.

    Raises:
        ConfigError: naming the field and what to do.
    """
    out = Path(config.output_dir).resolve()
    for field, value in (("teacher.model", config.teacher.model), ("student.model", config.student.model)):
        if not value or not Path(value).exists():
            continue
        path = Path(value).resolve()
        if path.parent == out and path.name in STAGES:
            raise ConfigError(f"{field}: {value} is this job's own {path.name} stage folder, which a changed setting "
                              f"moves to superseded/ before it is read; copy it elsewhere first (cp -r {value} "
                              f"{path.name}-kept) and name the copy, or give another --output-dir")


def check_unlabelled(config: PipelineConfig) -> None:
    """``augment.unlabelled`` can run: a task whose rows are one text, a budget, no hard-label term, files that exist,
    and a transfer score where ``augment.unlabelled_ranked`` asks for one.

    Raises:
        ConfigError: a pair or question-answering task, no ``augment.max_rows``, ``distill.hard_label_weight`` > 0,
            or ``augment.unlabelled_ranked`` for a task type without :meth:`~distill.tasks.TaskType.transfer_scores`.
        DataError: a file it names does not exist.
    """
    spec = task_spec(config.task)
    try:
        spec.type.unlabelled_rows(spec, ["a sentence of text"])
    except ValueError as error:
        raise ConfigError(f"augment.unlabelled: {error}; drop augment.unlabelled") from None
    if config.augment.max_rows is None:
        raise ConfigError("augment.unlabelled: its sentences fill the room augment.max_rows leaves after augmentation, "
                          "and augment.max_rows is not set; set it (configs/ner_minilm.yaml: 50000)")
    if config.distill.hard_label_weight > 0:
        raise ConfigError(f"augment.unlabelled: its sentences have no labels, and distill.hard_label_weight="
                          f"{config.distill.hard_label_weight:g} would train on their placeholders; set "
                          "distill.hard_label_weight: 0 (the teacher's logits are the targets)")
    if config.augment.unlabelled_ranked is not None and spec.type.transfer_scores(spec, [], []) is None:
        raise ConfigError(f"augment.unlabelled_ranked: a {spec.type.description} has no transfer score to rank "
                          "unlabelled text by (token classification has); drop augment.unlabelled_ranked and the "
                          "sentences are drawn at random")
    corpus_sources(config.augment.unlabelled)


def check_student_fits_teacher(config: PipelineConfig, teacher: PretrainedConfig | None = None) -> None:
    """The student's depth, heads and initialisation against the teacher's config (read from the given teacher or
    the base model to fine-tune, unless ``teacher`` is that config already; no weights loaded).

    Raises:
        ConfigError: the layer map cannot be built (a student deeper than the teacher, a bad explicit map), the
            student's head count does not divide the teacher's while the attention loss is on, or ``init: teacher``
            with a student of another family or width than the teacher's; each names the field to change.
        CaptureError: a family whose attention scores cannot be captured (layer-wise losses on).
        ModelError: the teacher or student checkpoint cannot be found.
    """
    if teacher is None:
        teacher = load_model_config(config.teacher.model or config.teacher.base_model)
    if config.teacher.model is not None:
        check_teacher_config(teacher, task_spec(config.task), config.teacher.model, config.teacher.remap_labels)
    if config.student.model is not None:
        student = load_model_config(config.student.model)
        layers, heads, hidden = student.num_hidden_layers, student.num_attention_heads, student.hidden_size
        student_type = student.model_type
    else:
        shape = student_shape(config.student, teacher)
        layers, heads, hidden = shape["num_hidden_layers"], shape["num_attention_heads"], shape["hidden_size"]
        student_type = shape.get("model_type", student_family(teacher.model_type, config.student.init))
    if intermediate_terms(config.distill.weights):  # logit-only: any teacher family, no layer map
        check_layer_wise(config, teacher, student_type, layers, heads, hidden)
    if config.student.model is None and config.student.init == "pruned":
        check_pruned(config, teacher, shape, student_type)
    if config.student.model is None and config.student.init == "teacher":
        if student_type != teacher.model_type:
            fixed = "" if config.student.preset not in RELATIVE_PRESETS else (
                " with a fixed shape, e.g. --set student.preset=tinybert-4l-312")
            raise ConfigError(f"student.init: 'teacher' copies layers between models of one family; the student is "
                              f"{student_type}, the teacher {teacher.model_type}; use --set "
                              f"student.init=teacher_embeddings (or random){fixed}")
        if hidden != teacher.hidden_size:
            raise ConfigError(f"student.init: 'teacher' copies teacher layers and needs the teacher's hidden_size "
                              f"({teacher.hidden_size}), the student has {hidden}; use init teacher_embeddings or "
                              "random")
        if heads != teacher.num_attention_heads:
            raise ConfigError(f"student.init: 'teacher' copies teacher layers and needs the teacher's "
                              f"num_attention_heads ({teacher.num_attention_heads}), the student has {heads} (the same "
                              "weights split into other heads compute another function); use init teacher_embeddings "
                              "or random")
        try:  # distill.layer_map picks the layers copied, also for logit-only distillation
            build_layer_map(config.distill.layer_map, teacher.num_hidden_layers, layers)
        except ValueError as error:
            raise ConfigError(f"distill.layer_map / student.num_hidden_layers: {error}") from None


def check_layer_wise(config: PipelineConfig, teacher, student_type: str, layers: int, heads: int, hidden: int) -> None:
    """Checks for distillation with intermediate (layer-wise) losses: both families can be captured, the layer map
    can be built, the heads divide and the relation heads divide both widths.

    Raises:
        CaptureError: a family whose attention scores cannot be captured. ConfigError: the field to change.
    """
    for role, model_config in (("teacher", teacher), ("student", AutoConfig.for_model(student_type))):
        if (reason := capture_support(model_config)) is not None:
            raise CaptureError(f"{role}: {reason}")
    try:
        build_layer_map(config.distill.layer_map, teacher.num_hidden_layers, layers)
    except ValueError as error:
        raise ConfigError(f"distill.layer_map / student.num_hidden_layers: {error}") from None
    if config.distill.weights.get("attention", 1.0) > 0 and teacher.num_attention_heads % heads:
        raise ConfigError(
            f"student.num_attention_heads: the teacher has {teacher.num_attention_heads} heads and the student {heads}; "
            "the attention loss averages teacher heads in equal groups, so the student's count must divide the "
            f"teacher's (e.g. {', '.join(str(d) for d in range(1, teacher.num_attention_heads + 1) if not teacher.num_attention_heads % d)}), "
            "or set distill.weights.attention: 0"
        )
    if intermediate_terms(config.distill.weights).get("relation"):
        heads = config.distill.relation_heads
        if hidden % heads or teacher.hidden_size % heads:
            raise ConfigError(f"distill.relation_heads: {heads} relation heads must divide the student's width "
                              f"({hidden}) and the teacher's ({teacher.hidden_size})")


def check_pruned(config: PipelineConfig, teacher: PretrainedConfig, shape: dict, student_type: str) -> None:
    """``init: pruned`` can run: a student of the teacher's family, a shape pruning reaches, no general stage.

    Raises:
        ConfigError: naming the field to change (and the nearest reachable shape, :func:`students.pruning.check_reachable`).
    """
    from students.pruning import PruningError, check_reachable

    if student_type != teacher.model_type:
        raise ConfigError(f"student.init: 'pruned' cuts the student from the teacher and keeps its family "
                          f"({teacher.model_type}); the student is {student_type}: drop student.model_type")
    if config.general.enabled:
        raise ConfigError("student.init: 'pruned' starts the student from the pruned teacher, and general.enabled "
                          "would start it from a general-distilled one; set general.enabled: false")
    from distill.job.pruned import stage_shapes
    from students.build import student_config

    try:
        stages = stage_shapes(config.student, teacher)
    except ValueError as error:
        raise ConfigError(f"student.pruning.stages: {error}") from None
    if stages and not isinstance(config.distill.layer_map, str) and config.student.pruning.layers == "layer_map":
        raise ConfigError("student.pruning.stages: each stage keeps layers of the stage before it, so a layer map "
                          "that lists teacher layers cannot be followed; set distill.layer_map to a rule (uniform) "
                          "or student.pruning.layers: importance")
    pruned_from = teacher
    for number, stage in enumerate([*stages, shape], 1):
        field = f"student.pruning.stages[{number - 1}]." if number <= len(stages) else "student."
        source = "the teacher's" if number == 1 else ("the last stage's" if number > len(stages) else
                                                      "the stage before's")
        try:
            check_reachable(stage, pruned_from)
        except PruningError as error:  # the message names the fields of the shape pruned and what it is pruned from
            raise ConfigError(str(error).replace("student.", field).replace("the teacher's", source)) from None
        if number <= len(stages) and intermediate_terms(config.distill.weights):  # each stage learns from the teacher
            try:
                check_layer_wise(config, teacher, teacher.model_type, stage["num_hidden_layers"],
                                 stage["num_attention_heads"], stage["hidden_size"])
            except ConfigError as error:
                raise ConfigError(f"student.pruning.stages[{number - 1}]: {error}") from None
        pruned_from = student_config(teacher, stage, init="teacher")
