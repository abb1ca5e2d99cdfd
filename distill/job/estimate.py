"""The dry run's cost: how many minutes each stage of a job will take on this machine.

Each stage's work is counted from the config and the data as the run will read them (training steps, rows through the
teacher, masked-LM word positions), and priced by timing the models' real shapes here: a training step (forward,
backward, AdamW) and a forward pass of the teacher, the student and the masked LM at the batch size and the padded
length the run's batches will have, on random weights of each config (nothing is downloaded or fine-tuned). A timing
is kept in ``$TINYDISTILL_CACHE/timings.json`` per machine, torch version, thread count and shape, so a second dry run
of the same shapes costs nothing; one made while the machine is busy with other work (a load average above
:data:`BUSY_LOAD` of the cores) is used but not kept, and the dry run says the estimate is high. The environment
variable ``TINYDISTILL_ESTIMATE=off`` turns the estimate off (a dry run in seconds, no model timed). The loop's own cost beyond the model's (collation, logging, checkpoints) is priced as
:data:`LOOP_OVERHEAD` of the model's time.

Padded length: the training examples' token counts (the run's own tokenizer, up to the first :data:`LENGTH_SAMPLE`
examples); a batch grouped by length pads to about its mean, a random batch to the expected longest of ``batch_size``
examples drawn from them (sampled with a fixed seed).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

LENGTH_SAMPLE = 2000  # training examples tokenized to learn the lengths
LOOP_OVERHEAD = 0.15  # the loop beyond the model: batches collated, logs, checkpoints (a share of the model's time)
EVAL_BATCH = 64  # examples per dev-evaluation batch (distill.tasks.evaluate)
CLOCK_VERSION = 2  # what a kind of timing measures; a timing kept under another version is made again
BUSY_LOAD = 0.5  # a load average above this share of the cores: the machine is busy, its timings are not kept


def timings_file() -> Path:
    """Where measured step and forward times are kept: ``$TINYDISTILL_CACHE/timings.json``."""
    from teachers.assets import cache_dir

    return cache_dir() / "timings.json"


def _shape_key(config) -> str:
    """A model config's shape in a string: family, depth, width, heads, FFN, vocabulary."""
    return (f"{config.model_type}-L{config.num_hidden_layers}-H{config.hidden_size}-A{config.num_attention_heads}"
            f"-I{config.intermediate_size}-V{config.vocab_size}")


class Clock:
    """Times training steps and forward passes of model shapes on this machine, once each (kept in
    :func:`timings_file`)."""

    def __init__(self, path: Path | None = None):
        self.path = path or timings_file()
        self.machine = (f"{platform.node()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}"
                        f"|v{CLOCK_VERSION}")
        try:
            self.known = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.known = {}
        self.measured = 0  # timings made by this clock (not read from the file)
        # Another job on the cores slows every timing: those made then are used for this estimate but not kept.
        self.busy = _load() > BUSY_LOAD * (os.cpu_count() or 1)
        self.unkept: set[str] = set()

    @staticmethod
    def _length(length: float, kind: str) -> int:
        """The length a timing is made and kept at: a whole number of tokens; a multiple of 8 except for kind
        "latency" (a few shapes, not one per length: the mean padded lengths the estimate asks for are fractional)."""
        if kind == "latency":
            return int(math.ceil(length))
        return max(8, int(math.ceil(length / 8) * 8))

    def _key(self, config, batch: int, length: float, kind: str) -> str:
        return f"{self.machine}|{_shape_key(config)}|{kind}|{batch}|{self._length(length, kind)}"

    def known_seconds(self, config, batch: int, length: int, kind: str) -> float | None:
        """A timing made before (kept in the file, or by this clock), None when there is none."""
        return self.known.get(self._key(config, batch, length, kind))

    def record(self, config, batch: int, length: int, kind: str, seconds: float) -> None:
        """Keep a timing measured elsewhere (compress's interleaved latencies), as :meth:`seconds` keeps its own."""
        key = self._key(config, batch, length, kind)
        self.known[key] = seconds
        self.measured += 1
        self._save(key)

    def _save(self, key: str) -> None:
        if self.busy:
            self.unkept.add(key)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = {k: v for k, v in self.known.items() if k not in self.unkept}
            self.path.write_text(json.dumps(kept, indent=0), encoding="utf-8")
        except OSError:  # a read-only cache: measure again next time
            pass

    def seconds(self, config, batch: int, length: int, kind: str) -> float:
        """Wall seconds of one ``kind`` ("step": forward, backward and AdamW of a sequence classifier; "forward": a
        forward pass without gradients; "mlm_step", "mlm_forward": the same of a masked LM) of a model of
        ``config``'s shape at (batch, length), median of 2 after one warm-up. (Kind "latency", at exactly the
        length asked, holds the interleaved timings ``compress`` records.)"""
        key = self._key(config, batch, length, kind)
        if key not in self.known:
            self.known[key] = _measure(config, batch, self._length(length, kind), kind)
            self.measured += 1
            self._save(key)
        return self.known[key]


def _load() -> float:
    """The machine's load average over the last minute (0 where the system does not say)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0


def _measure(config, batch: int, length: int, kind: str) -> float:
    """One timing (see :meth:`Clock.seconds`). A masked LM's head runs where the job runs it
    (:func:`distill.method.objective.masked_lm_logits`): at the masked 15% of the tokens in a training step
    (:class:`~distill.method.objective.MaskedLMObjective`), at one masked word a row in a forward pass (augmentation)."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    from distill.method.objective import MaskedLMObjective, masked_lm_logits

    torch.manual_seed(0)
    masked = kind.startswith("mlm_")
    model = (AutoModelForMaskedLM if masked else AutoModelForSequenceClassification).from_config(config)
    low = min(1000, config.vocab_size - 1)
    ids = torch.randint(low, config.vocab_size, (batch, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind.endswith("step"):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        if masked:
            objective = MaskedLMObjective(model)
            labels = torch.where(torch.rand(ids.shape) < 0.15, ids, torch.full_like(ids, -100))

            def loss():
                return objective({**inputs, "labels": labels})[0]
        else:
            labels = torch.zeros(batch, dtype=torch.long)

            def loss():
                return model(**inputs, labels=labels).loss

        def run():
            loss().backward()
            optimizer.step()
            optimizer.zero_grad()
    else:
        model.eval()
        one = torch.zeros_like(ids, dtype=torch.bool)
        one[:, length // 2] = True  # augmentation asks about one masked word a row

        def run():
            with torch.no_grad():
                masked_lm_logits(model, inputs, one) if masked else model(**inputs)
    run()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def masked_row_pieces(examples: list[dict], text_columns: tuple[str, ...], augment, mlm_name: str) -> int:
    """Word pieces of the masked rows augmentation sends the masked LM for ``examples``: one row for each word it
    asks about (alphabetic, not a stop word, one word piece: :meth:`augment.augmenter.CandidateGenerator.candidates`;
    longer words go to the word vectors), as long as the text in pieces (twice with ``mlm_context`` "pair"), with the
    two special tokens."""
    from augment import load_stopwords, split_words
    from teachers.models import load_tokenizer

    tokenizer, stopwords = load_tokenizer(mlm_name), load_stopwords(augment.stopwords)
    counts: dict[str, int] = {}

    def count(word: str) -> int:
        if word not in counts:
            counts[word] = len(tokenizer.tokenize(word))
        return counts[word]

    total = 0
    for example in examples:
        for column in text_columns:
            value = example[column]
            words = (list(value) if isinstance(value, (list, tuple))
                     else [value[start:end] for start, end in split_words(value or "")])
            asked = sum(1 for word in words if word.isalpha() and word.lower() not in stopwords and count(word) == 1)
            length = sum(count(word) for word in words) * (2 if augment.mlm_context == "pair" else 1) + 2
            total += asked * length
    return total


def _unlabelled_rows(augment, augmented_rows: int) -> tuple[int, int]:
    """Rows of unlabelled text the distillation set will hold (``augment.unlabelled`` in the room ``max_rows``
    leaves beside ``augmented_rows``, as :func:`distill.job.stage_augment.with_unlabelled` fills it) and the
    sentences the teacher scores to rank them (``unlabelled_ranked``; 0 without ranking). The text's lines are counted
    by drawing them as the run does; a text that cannot be read here (a hub corpus offline) counts as long enough."""
    from distill.job.corpus import sample_lines

    if not augment.unlabelled or augment.max_rows is None:
        return 0, 0
    room, ranked = max(0, augment.max_rows - augmented_rows), augment.unlabelled_ranked
    drawn = room if ranked is None else math.ceil(round(room / ranked, 6))
    try:
        available = len(sample_lines(augment.unlabelled, drawn, seed=augment.seed))
    except (OSError, ValueError):  # DataError is a ValueError
        available = drawn
    if ranked is None:
        return available, 0
    return min(room, math.ceil(round(ranked * available, 6))), available


@dataclass
class Lengths:
    """Token counts of the training examples (a sample) and of the dev examples, with the run's tokenizer."""

    train: np.ndarray
    dev: np.ndarray

    def padded(self, batch: int, grouped: bool, dev: bool = False) -> float:
        """The length a batch of ``batch`` examples pads to: about the mean when grouped by length (evaluation
        sorts by length, so it is grouped), else the expected longest of ``batch`` random examples."""
        values = self.dev if dev else self.train
        if grouped or len(values) <= 1:
            return float(values.mean())
        rng = np.random.default_rng(0)
        draws = rng.choice(values, size=(64, min(batch, len(values))))
        return float(draws.max(axis=1).mean())


def token_lengths(data, spec, tokenizer, max_seq_length: int) -> Lengths:
    """:class:`Lengths` of ``data``'s train (its first :data:`LENGTH_SAMPLE` examples) and dev splits, tokenized as
    the run tokenizes them (a QA question: one window a row)."""
    from distill.tasks.data import tokenize

    def counts(split) -> np.ndarray:
        rows = split.select(range(min(LENGTH_SAMPLE, len(split))))
        encoded = tokenize(rows, tokenizer, spec, max_seq_length)
        return np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.float64)

    return Lengths(counts(data["train"]), counts(data["dev"]))


def _steps(train, rows: int) -> int:
    """Optimizer steps of a :class:`distill.config.TrainConfig` over ``rows`` examples."""
    if train.max_steps:
        return train.max_steps
    per_epoch = math.ceil(rows / (train.batch_size * train.gradient_accumulation_steps))
    return max(math.ceil(train.num_epochs * per_epoch), train.min_steps or 0)


def estimate_minutes(config, rows: list[dict], data, spec, clock: Clock | None = None,
                     entries: dict | None = None) -> dict[str, float]:
    """Minutes each stage of the plan that will run (``run``, ``resume``, ``replace``) is expected to take here.

    Args:
        config: the pipeline config as it will run (:func:`distill.job.pipeline.for_device` applied).
        rows: the dry-run plan (:func:`distill.job.pipeline.plan_pipeline`; a stage named ``"<prefix>: <stage>"``,
            as the seeds and sweep plans name them, is priced as ``<stage>``).
        data: the task data as the run reads it (train and dev splits).
        spec: the task.
        clock: where timings come from (default: this machine's, :class:`Clock`).
        entries: {name: config} of a sweep's students: a row ``"<name>: <stage>"`` is priced with that student.

    Returns:
        {stage as the row names it: minutes} for the stages that run; a resumed training stage is priced from its
        newest checkpoint on (the steps left, and the dev evaluations among them), another resumed stage whole (an
        upper bound).
    """
    from students.build import student_config, student_shape
    from teachers.models import load_config, load_tokenizer

    clock = clock or Clock()
    teacher_name = config.teacher.model or config.teacher.base_model
    teacher_config = load_config(teacher_name)
    teacher_config.num_labels = 2
    tokenizer = load_tokenizer(teacher_name)
    lengths = token_lengths(data, spec, tokenizer, config.task.max_seq_length)

    def student_of(job):
        found = (load_config(job.student.model) if job.student.model is not None else
                 student_config(teacher_config, student_shape(job.student, teacher_config), job.student.init))
        found.num_labels = 2
        return found

    students = {name: student_of(job) for name, job in (entries or {}).items()}
    default = student_of(config) if not entries else next(iter(students.values()))
    seconds: dict[str, float] = {}
    for row in rows:
        if row["action"] not in ("run", "resume", "replace"):
            continue
        parts = row["stage"].split(": ")
        name = next((part for part in parts if part in students), None)
        job = (entries or {}).get(name, config)
        done = steps_done(row) if row["action"] == "resume" else 0
        cost = _stage_seconds(parts[-1], job, students.get(name, default), teacher_config, lengths, data, spec, clock,
                              done)
        if cost is not None:
            seconds[row["stage"]] = cost * (1 + LOOP_OVERHEAD)
    return {stage: value / 60 for stage, value in seconds.items()}


def steps_done(row: dict) -> int:
    """The optimizer steps a resumed stage's newest checkpoint holds (``<folder>/checkpoints/step-N``); 0 where it
    has none (a stage that resumes by shards, or one interrupted before its first checkpoint)."""
    from distill.method.checkpoint import latest_checkpoint

    found = latest_checkpoint(Path(row["folder"]) / "checkpoints") if row.get("folder") else None
    return int(found.name.removeprefix("step-")) if found is not None else 0


def _stage_seconds(stage: str, config, student, teacher_config, lengths: Lengths, data, spec, clock: Clock,
                   done: int = 0) -> float | None:
    """Model seconds of one stage (see :func:`estimate_minutes`); None for a stage not priced. ``done``: the
    optimizer steps a resumed stage has behind it (:func:`steps_done`), left out of its training steps."""
    import dataclasses

    from augment.dataset import examples_to_augment, masked_lm_words
    from teachers.models import load_config

    windows = len(lengths.train) / max(1, min(LENGTH_SAMPLE, len(data["train"])))  # rows an example (QA windows)

    n_train, n_dev = len(data["train"]), len(data["dev"]) * len(spec.dev_splits)
    copies = examples_to_augment(n_train, dataclasses.replace(config.augment, max_mlm_words=None))
    augmenting = config.augment.enabled not in (False, "false") and config.augment.num_copies > 0 and copies > 0
    pieces = 0  # word pieces of the masked rows the augmenter sends
    if augmenting:
        examples = [data["train"][i] for i in range(min(copies, n_train))]
        if config.augment.max_mlm_words is not None:
            work = [masked_lm_words(example, spec.text_columns, config.augment.mlm_context) for example in examples]
            copies = min(copies, int(np.searchsorted(np.cumsum(work), config.augment.max_mlm_words, side="right")))
        pieces = masked_row_pieces(examples[:copies], spec.text_columns, config.augment,
                                   config.mlm.model or config.mlm.base_model)
    augmented_rows = n_train + (copies * config.augment.num_copies if augmenting else 0)
    unlabelled, ranked = _unlabelled_rows(config.augment, augmented_rows)
    rows_trained = (augmented_rows + unlabelled) * windows

    def step(model, train, rows_in) -> float:
        length = lengths.padded(train.batch_size, train.group_by_length)
        return max(0, _steps(train, rows_in) - done) * clock.seconds(model, train.batch_size, length, "step")

    def forward(model, rows_in, batch=EVAL_BATCH, dev=False) -> float:
        length = lengths.padded(batch, True, dev)
        return math.ceil(rows_in / batch) * clock.seconds(model, batch, length, "forward")

    teacher_train = n_train if config.teacher.max_train_examples_cpu is None else min(
        n_train, config.teacher.max_train_examples_cpu)
    dev_rows = n_dev * windows
    if stage == "teacher":
        if config.teacher.model is not None:  # given: scored on dev, saved
            return forward(teacher_config, dev_rows, dev=True)
        train = config.teacher.train
        steps = _steps(train, teacher_train * windows)
        evaluations = (steps // config.teacher.eval_steps if config.teacher.eval_steps else
                       max(1, math.ceil(train.num_epochs))) if config.teacher.select_best else 1
        evaluations = max(1, math.ceil(evaluations * max(0, steps - done) / max(1, steps)))  # those still to come
        return step(teacher_config, train, teacher_train * windows) + evaluations * forward(teacher_config, dev_rows,
                                                                                             dev=True)
    if stage == "mlm":
        mlm, train = load_config(config.mlm.base_model), config.mlm.train
        return max(0, _steps(train, 10_000) - done) * clock.seconds(mlm, train.batch_size, config.mlm.max_seq_length,
                                                                     "mlm_step")
    if stage == "augmented":
        mlm = load_config(config.mlm.model or config.mlm.base_model)
        per_piece = clock.seconds(mlm, EVAL_BATCH, 64, "mlm_forward") / (EVAL_BATCH * 64)
        # and the GloVe search, the copies written; the teacher scores the unlabelled sentences drawn to rank them
        return pieces * per_piece * 1.25 + forward(teacher_config, ranked, 128)
    if stage == "pruned":
        kind = "step" if config.student.pruning.importance == "taylor" else "forward"
        batches = math.ceil(config.student.pruning.num_examples / 32)
        return batches * clock.seconds(teacher_config, 32, lengths.padded(32, False), kind) + forward(
            student, dev_rows, dev=True)
    if stage == "teacher_outputs":  # the teacher's forward pass over the set, written to disk
        return 1.3 * forward(teacher_config, rows_trained, config.distill.intermediate.batch_size)
    if stage == "student_intermediate":
        train = config.distill.intermediate
        cost = step(student, train, rows_trained)
        if config.distill.teacher_cache is None:  # the teacher runs beside the student at every step
            length = lengths.padded(train.batch_size, train.group_by_length)
            cost += max(0, _steps(train, rows_trained) - done) * clock.seconds(teacher_config, train.batch_size,
                                                                             length, "forward")
        return cost
    if stage == "teacher_logits":
        return forward(teacher_config, rows_trained)
    if stage == "student":
        return step(student, config.distill.prediction, rows_trained) + forward(student, dev_rows, dev=True)
    if stage == "general":
        general = config.general
        if not general.train.max_steps:
            return None
        batch, length = general.train.batch_size, general.max_seq_length
        return max(0, general.train.max_steps - done) * (clock.seconds(student, batch, length, "step")
                                          + clock.seconds(teacher_config, batch, length, "forward"))
    if stage == "report":  # both models scored on dev, then timed (about 20 repeats at each batch size)
        return forward(teacher_config, dev_rows, dev=True) + forward(student, dev_rows, dev=True) + 40.0
    if stage == "export":  # the graph and its int8 copy, each checked on dev
        return 3 * forward(student, dev_rows, dev=True) + 20.0
    return None
