"""Sentence embeddings: a sentence-transformers encoder (all-MiniLM-L6-v2, all-mpnet-base-v2, ...) distilled into a
smaller one that embeds sentences as it does, for semantic search, clustering and retrieval-augmented generation.

The teacher is the encoder as the user deploys it, never fine-tuned here (``--teacher minilm``, ``mpnet``, a
sentence-transformers folder or hub name); its output is a sentence's embedding: its last hidden states pooled over
the sentence's real tokens (mean, the first token's or the maximum, ``task.options.pooling``, by default the mean, as
the all-* models pool) and, with ``task.options.normalize`` (default true), divided by their L2 norm.

Shapes: B sentences, T tokens, H hidden size. The type's outputs are the token embeddings, (B, T, H) per sentence
(:attr:`per_token`: evaluation keeps each sentence's T_i rows), pooled where they are read:

- **Prediction loss**: the student's pooled embedding against the teacher's. With the teacher's width, their mean
  squared difference (Reimers and Gurevych, 2020, "Making Monolingual Sentence Embeddings Multilingual using Knowledge
  Distillation", Eq. 1, where the student learns the teacher's embedding of each sentence); with another width, the
  mean squared difference of the two batches' cosine-similarity matrices (every pair of sentences of the batch: the
  student learns the teacher's geometry, which is what search and STS read, in its own space). Float32.
- **Metrics**: on sentence pairs with a similarity score (STS-B), the Spearman and Pearson correlation of the cosine
  similarity of the two sentences' embeddings with the gold score (Spearman first: the MTEB convention). Each pair's
  two sentences are two rows of the tokenized set (:meth:`row_examples` says whose). :func:`retrieval_metrics` scores
  queries against passages (MRR@10, recall@1).
- **Chance**: 0, embeddings unrelated to the scores.
- **What ships**: the student folder is a sentence-transformers folder too (``modules.json``, ``1_Pooling``,
  ``2_Normalize``), so ``SentenceTransformer(path)`` loads it and encodes with the teacher's pooling.
- **The teacher's space** (``task.options.teacher_space``, default false): a student narrower than the teacher gets a
  learnt linear map of its embeddings to the teacher's width (H_S -> H_T, with bias), trained in the prediction step
  by the mean squared difference to the teacher's embedding (Reimers and Gurevych 2020, Eq. 1) and shipped as the
  folder's sentence-transformers ``Dense`` module (``modules.json``: Transformer, Pooling, Dense, Normalize): the
  student's query embeddings can then be searched against an index the teacher built. The map starts as the
  intermediate step's learnt hidden-state projection W_h (TinyBERT Eq. 8), which already maps the student's last
  hidden states to the teacher's. Mean or first-token pooling only: a linear map commutes with them, so the map is
  applied to every token's embedding before the pooling (:class:`ProjectedEncoder`), the same as after it.

Named tasks: ``stsb_embedding``, STS-B's GLUE files (``--data-dir path/to/glue/STS-B``): the student learns from the
training pairs' sentences (the scores are not read) and is scored on the dev pairs; ``squad_retrieval``, SQuAD v1.1's
JSON files (``--data-dir path/to/squad-v1.1``): the student learns from the training questions and paragraphs and is
scored by retrieval, each dev question against the dev paragraphs (MRR@10, recall@1).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distill.tasks.base import (PAIRED, DataError, ModelError, TaskSpec, TaskType, pad_rows, register_task,
                                register_task_type)

logger = logging.getLogger(__name__)

EMBEDDING_METRICS = ("spearman", "pearson")  # Spearman first: the primary metric (MTEB's STS convention)
RETRIEVAL_METRICS = ("mrr@10", "recall@1")  # a question against the passages: MRR@10 first
POOLING_MODES = ("mean", "cls", "max")
DENSE_TYPE = "sentence_transformers.models.Dense"
DENSE_FOLDER = "2_Dense"  # where a student that keeps the teacher's space ships its map
IDENTITY = "torch.nn.modules.linear.Identity"  # the Dense module's activation, as sentence-transformers names it


def _retrieval(spec: TaskSpec) -> bool:
    """Whether the task scores retrieval (a question against passages) rather than scored pairs."""
    return spec.metrics[0] in RETRIEVAL_METRICS


def pooling(spec: TaskSpec) -> tuple[str, bool]:
    """The task's pooling mode and whether embeddings are L2-normalised (``task.options``: ``pooling``, default
    "mean"; ``normalize``, default true).

    Raises:
        DataError: an unknown pooling mode.
    """
    mode = spec.options.get("pooling", "mean")
    if mode not in POOLING_MODES:
        raise DataError(f"task.options.pooling: must be {', '.join(POOLING_MODES)}, got {mode!r}")
    return mode, bool(spec.options.get("normalize", True))


def teacher_space(spec: TaskSpec) -> bool:
    """Whether a student narrower than the teacher learns a map of its embeddings to the teacher's width and ships
    it (``task.options.teacher_space``, default false).

    Raises:
        DataError: ``teacher_space`` with max pooling (the map is applied before the pooling, which only the mean
            and the first token's commute with).
    """
    keep = spec.options.get("teacher_space", False)
    if not isinstance(keep, bool):
        raise DataError(f"task.options.teacher_space: true or false, got {keep!r}")
    if keep and pooling(spec)[0] == "max":
        raise DataError("task.options.teacher_space: the map to the teacher's width needs mean or cls pooling "
                        "(task.options.pooling), not max; or set task.options.teacher_space: false")
    return keep


class ProjectedEncoder(nn.Module):
    """An encoder whose token embeddings are mapped linearly to another width: ``last_hidden_state`` (B, T, H_S) ->
    (B, T, H_out); the hidden states the intermediate terms read are the encoder's own. Pooled by the mean over real
    tokens or the first token, the result is sentence-transformers' Dense module (identity activation) after the
    pooling, as the saved folder runs it.

    Args:
        encoder: a `transformers` encoder (``BertModel``, ``MPNetModel``, ...).
        projection: ``nn.Linear(H_S, H_out)``.
    """

    def __init__(self, encoder: nn.Module, projection: nn.Linear):
        super().__init__()
        self.encoder, self.projection = encoder, projection

    @property
    def config(self):
        """The encoder's config (``hidden_size`` is the encoder's width, H_S; the map's is ``projection``'s)."""
        return self.encoder.config

    def get_input_embeddings(self) -> nn.Module:
        """The encoder's token embeddings (the report counts parameters without them)."""
        return self.encoder.get_input_embeddings()

    @property
    def graph_module(self):
        """What an ONNX export writes: the encoder alone, as sentence-transformers' ONNX backend runs the folder's
        first module (the Dense map runs after its pooling)."""
        return self.encoder

    def around(self, encoder) -> "ProjectedEncoder":
        """This map after another runner of the encoder (an ONNX Runtime session), to score its outputs as this
        model's."""
        return ProjectedEncoder(encoder, self.projection)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        """The encoder's outputs with ``last_hidden_state`` mapped: (B, T, H_S) -> (B, T, H_out)."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        outputs = self.encoder(**{k: v for k, v in inputs.items() if v is not None}, **kwargs)
        outputs.last_hidden_state = self.projection(outputs.last_hidden_state)
        return outputs

    def save_pretrained(self, folder, **kwargs) -> None:
        """The encoder as `transformers` saves it, with ``config.sentence_embedding["dense"]`` naming the map's
        folder, and the map as sentence-transformers' Dense module in ``folder/2_Dense`` (``config.json``,
        ``model.safetensors``); :func:`write_sentence_transformers` lists it. ``AutoModel.from_pretrained`` of the
        folder gives the encoder alone; ``SentenceTransformer(folder)`` and this type's model class run the map."""
        config = self.encoder.config
        config.sentence_embedding = {**(getattr(config, "sentence_embedding", None) or {}), "dense": DENSE_FOLDER}
        self.encoder.save_pretrained(folder, **kwargs)
        write_dense(Path(folder) / DENSE_FOLDER, self.projection)


def write_dense(folder: Path, projection: nn.Linear) -> None:
    """``projection`` as sentence-transformers' Dense module saves itself: ``config.json`` (in_features,
    out_features, bias, identity activation) and ``model.safetensors`` (``linear.weight`` (out, in), ``linear.bias``
    (out,), float32)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "in_features": projection.in_features, "out_features": projection.out_features,
        "bias": projection.bias is not None, "activation_function": IDENTITY}, indent=2), encoding="utf-8")
    save_file({f"linear.{k}": v.detach().float().contiguous().cpu() for k, v in projection.state_dict().items()},
              folder / "model.safetensors")


def read_dense(folder) -> nn.Linear | None:
    """The Dense module of a sentence-transformers folder as an ``nn.Linear`` (None for a folder without one).

    Raises:
        ModelError: a Dense module with an activation other than the identity, or more than one (this encoder runs
            one linear map after the pooling).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dense = [m for m in modules if m.get("type", "").endswith("Dense")]
    if not dense:
        return None
    if len(dense) > 1:
        raise ModelError(f"{folder}/modules.json: {len(dense)} Dense modules; a student or teacher here may have one")
    path = folder / dense[0]["path"]
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("activation_function", IDENTITY) != IDENTITY:
        raise ModelError(f"{path}/config.json: activation_function {config['activation_function']}; only the "
                         f"identity ({IDENTITY}) is read here")
    projection = nn.Linear(config["in_features"], config["out_features"], bias=config.get("bias", True))
    weights = load_file(path / "model.safetensors")
    projection.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    return projection


class SentenceEncoder:
    """The model class of the type: ``from_pretrained`` loads a folder's encoder (``AutoModel``) and, for a student
    saved with a map to its teacher's space (``config.sentence_embedding["dense"]``, :meth:`ProjectedEncoder.
    save_pretrained`), returns it with that map (:class:`ProjectedEncoder`). A sentence-transformers folder of
    another make with a Dense module is refused: its embeddings are not its encoder's, and this type reads the
    encoder's."""

    @staticmethod
    def from_config(config, **kwargs):
        """A new encoder of ``config`` (``AutoModel.from_config``): a student as the pipeline builds it."""
        from transformers import AutoModel

        return AutoModel.from_config(config, **kwargs)

    @staticmethod
    def from_pretrained(folder, **kwargs):
        """``AutoModel.from_pretrained(folder, **kwargs)``, with the folder's map when it was saved with one.

        Raises:
            ModelError: a local sentence-transformers folder with a Dense module this project did not save (or one
                it cannot read, :func:`read_dense`).
        """
        from transformers import AutoModel

        loaded = AutoModel.from_pretrained(folder, **kwargs)
        encoder, info = loaded if kwargs.get("output_loading_info") else (loaded, None)
        dense = (getattr(encoder.config, "sentence_embedding", None) or {}).get("dense")
        projection = read_dense(folder) if Path(str(folder)).is_dir() else None
        if projection is not None and dense is None:
            raise ModelError(f"{folder}: its modules.json runs a Dense module after the pooling, so its embeddings "
                             "are not its encoder's; distilling such an encoder is not supported here: give one "
                             "whose modules are Transformer, Pooling (and Normalize)")
        model = encoder if projection is None else ProjectedEncoder(encoder, projection)
        return (model, info) if info is not None else model


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str = "mean", normalize: bool = False) -> torch.Tensor:
    """Sentence embeddings from token embeddings: (B, T, H) and a (B, T) mask (1 real, 0 padding) to (B, H) float32,
    the mean over real tokens, the first token's, or the maximum over real tokens; L2-normalised with ``normalize``."""
    hidden, weights = hidden.float(), mask.to(hidden.device).float().unsqueeze(-1)
    if mode == "cls":
        pooled = hidden[:, 0]
    elif mode == "max":
        pooled = hidden.masked_fill(weights == 0, torch.finfo(torch.float32).min).max(dim=1).values
    else:
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    return F.normalize(pooled, dim=-1) if normalize else pooled


def pool_rows(rows: list[np.ndarray], mode: str = "mean", normalize: bool = False) -> np.ndarray:
    """:func:`pool` of per-sentence (T_i, H) arrays (padding removed): (N, H) float64."""
    pooled = np.stack([row[0] if mode == "cls" else row.max(axis=0) if mode == "max" else row.mean(axis=0)
                       for row in (np.asarray(r, dtype=np.float64) for r in rows)])
    if normalize:
        pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return pooled


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (N, H) arrays: (N,)."""
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return (a * b).sum(axis=1)


def similarity_metrics(first: np.ndarray, second: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation of the pairs' cosine similarities with their gold scores (0 where either is
    constant, undefined)."""
    return correlations(cosine(first, second), scores)


def correlations(similarity: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation of (N,) similarities with (N,) gold scores (0 where either is constant)."""
    from scipy.stats import pearsonr, spearmanr

    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) < 2 or np.ptp(similarity) == 0 or np.ptp(scores) == 0:
        return {"spearman": 0.0, "pearson": 0.0}
    return {"spearman": float(spearmanr(similarity, scores)[0]), "pearson": float(pearsonr(similarity, scores)[0])}


def retrieval_metrics(queries: np.ndarray, passages: np.ndarray, gold: np.ndarray, k: int = 10) -> dict[str, float]:
    """Retrieval by cosine similarity: each query's passages ranked, scored by the rank of its gold passage.

    Args:
        queries: (Q, H) embeddings. passages: (P, H) embeddings. gold: (Q,) the index of each query's passage.
        k: the cut-off of the reciprocal rank.

    Returns:
        ``mrr@{k}`` (mean over queries of 1 / rank of the gold passage, 0 past rank k) and ``recall@1`` (the share
        of queries whose best passage is the gold one).
    """
    q = queries / np.clip(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12, None)
    p = passages / np.clip(np.linalg.norm(passages, axis=1, keepdims=True), 1e-12, None)
    similarity = q @ p.T
    gold = np.asarray(gold)
    # rank of the gold passage: 1 + the passages scoring strictly higher (ties counted in the query's favour)
    ranks = 1 + (similarity > similarity[np.arange(len(gold)), gold][:, None]).sum(axis=1)
    reciprocal = np.where(ranks <= k, 1.0 / ranks, 0.0)
    return {f"mrr@{k}": float(reciprocal.mean()), "recall@1": float((ranks == 1).mean())}


def read_pooling(folder) -> dict | None:
    """A sentence-transformers folder's pooling: {"pooling": mode, "normalize": bool}, from ``modules.json`` and its
    pooling module's ``config.json``; None for a folder that is not one."""
    folder = Path(folder)
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = {"pooling": "mean", "normalize": any(m.get("type", "").endswith("Normalize") for m in modules)}
    for module in modules:
        if module.get("type", "").endswith("Pooling"):
            config = json.loads((folder / module["path"] / "config.json").read_text(encoding="utf-8"))
            found["pooling"] = ("cls" if config.get("pooling_mode_cls_token") else
                                "max" if config.get("pooling_mode_max_tokens") else "mean")
    return found


def write_sentence_transformers(folder: Path, hidden_size: int, mode: str, normalize: bool,
                                max_seq_length: int) -> None:
    """Make a saved encoder folder a sentence-transformers one: ``modules.json`` (the encoder, its pooling, the Dense
    map to the teacher's width when ``2_Dense`` holds one (:meth:`ProjectedEncoder.save_pretrained`), and the
    normalisation), ``1_Pooling/config.json``, ``2_Normalize`` (``3_Normalize`` after a Dense) and
    ``sentence_bert_config.json``. ``hidden_size``: the encoder's width (what the pooling reads)."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if (folder / DENSE_FOLDER / "config.json").is_file():
        modules.append({"idx": 2, "name": "2", "path": DENSE_FOLDER, "type": DENSE_TYPE})
    if normalize:
        path = f"{len(modules)}_Normalize"
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": "sentence_transformers.models.Normalize"})
        (folder / path).mkdir(parents=True, exist_ok=True)
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=2), encoding="utf-8")
    (folder / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                  "do_lower_case": False}, indent=2),
                                                      encoding="utf-8")


class EmbeddingCollator:
    """Pad tokenized sentences into a batch: inputs by the tokenizer, cached ``teacher_logits`` (the teacher's token
    embeddings, (T_i, H)) with zeros past each sentence (the pooling never reads them); the rows' ``labels`` (which
    pair and score a sentence belongs to) are not batched: no loss reads them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        teacher = [f.get("teacher_logits") for f in features]
        inputs = [{k: v for k, v in f.items() if k not in ("labels", "teacher_logits")} for f in features]
        batch = dict(self.tokenizer.pad(inputs, return_tensors="pt"))
        if teacher[0] is not None:
            batch["teacher_logits"] = pad_rows(teacher, batch["input_ids"].shape[1], 0.0, torch.float32,
                                               self.tokenizer.padding_side == "left")
        return batch


class SentenceEmbedding(TaskType):
    """A sentence encoder distilled on sentences (see the module's docstring)."""

    name = "sentence_embedding"
    metric_names = EMBEDDING_METRICS + RETRIEVAL_METRICS
    # the student's embeddings read against the teacher's, where they share its space (:meth:`paired_metrics`)
    summary_metrics = tuple(f"{PAIRED}/{name}" for name in EMBEDDING_METRICS + RETRIEVAL_METRICS)
    per_token = True
    pipeline_tag = "sentence-similarity"
    library_name = "sentence-transformers"
    architecture = "Model"  # a bare encoder (BertModel, MPNetModel); a teacher saved with another head (all-mpnet-base-v2
    # is a masked LM) is read as its encoder (teacher_as_is)
    description = "sentence encoder"
    labels_are_classes = False
    teacher_as_is = True  # the teacher is the encoder users deploy: it is never fine-tuned here

    def model_class(self, spec):
        return SentenceEncoder

    def prediction_model(self, spec, student, teacher, projection=None):
        """With ``task.options.teacher_space`` and a student narrower than the teacher, the student with a map of
        its embeddings to the teacher's width (:class:`ProjectedEncoder`), starting as ``projection`` (the
        intermediate step's W_h) when it fits, else as ``nn.Linear``'s draw from seed 0."""
        width, target = student.config.hidden_size, teacher.config.hidden_size
        if not teacher_space(spec) or width == target or isinstance(student, ProjectedEncoder):
            return student
        with torch.random.fork_rng(devices=[]):  # drawn the same on every run, whatever the global RNG's state
            torch.manual_seed(0)
            linear = nn.Linear(width, target)
        if projection is not None and projection.weight.shape == linear.weight.shape:
            linear.load_state_dict(projection.state_dict())
            logger.info("the map to the teacher's space (%d -> %d) starts as the intermediate step's W_h",
                        width, target)
        else:
            logger.info("the map to the teacher's space (%d -> %d) starts as drawn", width, target)
        return ProjectedEncoder(student, linear)

    def head_config(self, spec):
        return {}

    def logits(self, outputs):
        return getattr(outputs, "last_hidden_state", None)

    def read_split(self, path, spec):
        if _retrieval(spec):  # SQuAD's JSON: a question and its paragraph, the paragraph's index as the label
            from distill.tasks.question_answering import read_squad

            rows = read_squad(path)
            passages: dict[str, int] = {}
            ids = [passages.setdefault(context, len(passages)) for context in rows["context"]]
            return datasets.Dataset.from_dict({"question": rows["question"], "context": rows["context"],
                                               "label": [float(i) for i in ids]})
        from distill.tasks.sequence_classification import read_glue_tsv

        return read_glue_tsv(Path(path), spec)

    def user_spec(self, config):
        """A task of your own files: ``task.train_file`` the sentences the student learns from (a ``.txt`` file of
        one sentence a line, or a table's text column(s)), ``task.dev_file`` a table of sentence pairs and their
        similarity score (``task.text_columns``, default [sentence1, sentence2]; ``task.label_column``, default
        score) it is scored on."""
        if not config.dev_file:
            raise DataError("task.dev_file: a sentence-embedding task of your own files needs a dev file of sentence "
                            "pairs with a similarity score to score teacher and student on")
        columns = tuple(config.text_columns or ("sentence1", "sentence2"))
        if len(columns) != 2:
            raise DataError(f"task.text_columns: the dev file's two sentence columns, got {list(columns)}")
        metrics = tuple(config.metrics or EMBEDDING_METRICS)
        if not set(metrics) <= set(EMBEDDING_METRICS):
            raise DataError(f"task.metrics: sentence embeddings score {', '.join(EMBEDDING_METRICS)}; got "
                            f"{list(metrics)}")
        label = config.label_column if config.label_column != "label" else "score"
        return TaskSpec(config.name, columns, label, (), metrics, hub=None, dev_file=config.dev_file,
                        train_file=config.train_file, task_type=self.name,
                        options={"pooling": "mean", "normalize": True, **config.options})

    def read_user_split(self, path, spec, split="train"):
        from distill.tasks.files import DEV_SPLITS, read_table, require_columns

        if split == "train" and Path(path).suffix == ".txt":  # one sentence a line
            try:
                lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
            except (OSError, UnicodeDecodeError) as error:
                raise DataError(f"{path}: cannot read it as UTF-8 text ({error}); one sentence a line") from None
            sentences = [line for line in lines if line]
            if not sentences:
                raise DataError(f"{path}: no sentence; give one sentence a line")
            return datasets.Dataset.from_dict({spec.text_columns[0]: sentences,
                                               spec.text_columns[1]: [""] * len(sentences),
                                               "label": [float("nan")] * len(sentences)})
        table = read_table(path, split="train" if split == "train" else DEV_SPLITS, text_columns=spec.text_columns)
        needed = [*spec.text_columns, *([spec.label_column] if split != "train" else [])]
        require_columns(table, needed, path)
        scores = ([float(v) for v in table[spec.label_column]] if spec.label_column in table.column_names
                  else [float("nan")] * len(table))
        return datasets.Dataset.from_dict({**{c: [str(t or "") for t in table[c]] for c in spec.text_columns},
                                           "label": scores})

    def tokenize(self, dataset, tokenizer, spec, max_seq_length):
        """One row a sentence: a pair's two sentences are two rows, each with ``labels`` {"example": the pair's
        index, "score": its gold score (NaN where it has none)}."""
        columns = [c for c in spec.text_columns if c in dataset.column_names]
        texts, labels = [], []
        scores = dataset["label"] if "label" in dataset.column_names else [float("nan")] * len(dataset)
        for index, row in enumerate(dataset.select_columns(columns)):
            for column in columns:
                if not row[column]:  # an unlabelled sentence fills the first column alone
                    continue
                texts.append(row[column])
                score = scores[index]
                labels.append({"example": index, "score": float(score) if isinstance(score, (int, float)) else
                               float("nan")})
        encoded = tokenizer(texts, truncation=True, max_length=max_seq_length)
        return datasets.Dataset.from_dict({**{k: v for k, v in encoded.items()}, "labels": labels})

    def collator(self, tokenizer):
        return EmbeddingCollator(tokenizer)

    def row_examples(self, labels):
        return [label["example"] for label in labels]

    def check_options(self, spec):
        pooling(spec)
        teacher_space(spec)

    def report_sections(self, spec, metrics):
        """The student's scores against the teacher's embeddings (``teacher_index/``), where it was scored so."""
        rows = [(name, {key.replace(f"{PAIRED}/", ""): value for key, value in found.items() if PAIRED in key})
                for name, found in metrics.items()]
        rows = [(name, found) for name, found in rows if found]
        if not rows:
            return []
        keys = list(rows[0][1])
        lines = ["Against the teacher's embeddings (the student's questions searched among the teacher's passages, "
                 "or each pair's cosine between the student's embedding of one sentence and the teacher's of the "
                 "other):", "", "| model | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        lines += [f"| {name} | " + " | ".join(f"{found[key]:.4f}" for key in keys) + " |" for name, found in rows]
        return lines

    def against_teacher(self, spec, student, teacher):
        """Where the student embeds in the teacher's width (its own, or mapped to it: ``teacher_space``)."""
        width = (student.projection.out_features if isinstance(student, ProjectedEncoder)
                 else student.config.hidden_size)
        return width == teacher.config.hidden_size

    def paired_metrics(self, spec, outputs, teacher_outputs, labels):
        """The student's embeddings against the teacher's: retrieval, the student's queries against the teacher's
        passages (a student encoding queries for an index the teacher built); scored pairs, each pair's cosine
        taken between the student's embedding of one sentence and the teacher's of the other (the mean of both
        ways)."""
        mode, normalize = pooling(spec)
        ours, theirs = pool_rows(outputs, mode, normalize), pool_rows(teacher_outputs, mode, normalize)
        queries, passages, pairs = self._pairs(spec, labels)
        if _retrieval(spec):
            metrics = retrieval_metrics(ours[queries], theirs[list(passages.values())], pairs)
        else:
            first, second = pairs
            scores = np.array([labels[row]["score"] for row in first])
            similarity = (cosine(ours[first], theirs[second]) + cosine(theirs[first], ours[second])) / 2
            metrics = correlations(similarity, scores)
        return {name: metrics[name] for name in spec.metrics}

    def _pairs(self, spec, labels):
        """The rows of the pairs both of whose sentences are in ``labels``: for retrieval, (the queries' rows,
        {passage: its first row}, each query's gold passage index among those); for scored pairs, (None, None,
        (first rows, second rows)).

        Raises:
            DataError: scored pairs with no complete pair (a dev file of one text column)."""
        pairs: dict[int, list[int]] = {}
        for row, example in enumerate(self.row_examples(labels)):
            pairs.setdefault(example, []).append(row)
        complete = [rows for rows in pairs.values() if len(rows) == 2]
        if not _retrieval(spec):
            if not complete:
                raise DataError(f"task {spec.name}: scoring embeddings needs sentence pairs with a score (two text "
                                "columns), as STS-B's dev file has")
            return None, None, ([rows[0] for rows in complete], [rows[1] for rows in complete])
        corpus: dict[float, int] = {}
        for rows in complete:
            corpus.setdefault(labels[rows[0]]["score"], rows[1])  # a passage once, its first row's embedding
        order = {passage: i for i, passage in enumerate(corpus)}
        return ([rows[0] for rows in complete], corpus,
                np.array([order[labels[rows[0]]["score"]] for rows in complete]))

    def compute_metrics(self, spec, outputs, labels, context=None):
        mode, normalize = pooling(spec)
        embeddings = pool_rows(outputs, mode, normalize)
        queries, passages, pairs = self._pairs(spec, labels)
        if _retrieval(spec):  # each question against every passage of these examples
            metrics = retrieval_metrics(embeddings[queries], embeddings[list(passages.values())], pairs)
        else:
            first, second = pairs
            scores = np.array([labels[row]["score"] for row in first])
            metrics = similarity_metrics(embeddings[first], embeddings[second], scores)
        return {name: metrics[name] for name in spec.metrics}

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        mode, normalize = pooling(spec)
        mask = batch["attention_mask"]
        student, teacher = pool(student_logits, mask, mode, normalize), pool(teacher_logits, mask, mode, normalize)
        with torch.autocast(student.device.type, enabled=False):
            if student.shape[-1] == teacher.shape[-1]:
                return F.mse_loss(student, teacher)
            # another width: the batch's cosine-similarity matrices (every pair of its sentences)
            ours = F.normalize(student, dim=-1) @ F.normalize(student, dim=-1).T
            theirs = F.normalize(teacher, dim=-1) @ F.normalize(teacher, dim=-1).T
            return F.mse_loss(ours, theirs)

    def prediction_inputs_differ(self, spec, student_logits, teacher_logits, batch):
        mask = batch["attention_mask"].bool()
        if student_logits.shape[-1] != teacher_logits.shape[-1]:
            return torch.ones((), dtype=torch.bool, device=student_logits.device)
        return (student_logits.float() != teacher_logits.float())[mask].any()

    def uses_temperature(self, spec):
        return False

    def chance(self, spec, dev_labels=None):
        return {"metric": spec.metrics[0], "value": 0.0, "basis": "embeddings unrelated to the scores"}

    def same_prediction(self, outputs, reference, spec, labels=None):
        """The same sentence embedding to a cosine of 0.999 for each sentence."""
        mode, normalize = pooling(spec)
        return cosine(pool_rows(outputs, mode, normalize), pool_rows(reference, mode, normalize)) >= 0.999

    def describe_labels(self, spec):
        return "a similarity score per pair (not read in training: the teacher's embeddings are the targets)"

    def serving_config(self, spec, max_seq_length):
        mode, normalize = pooling(spec)
        return {"sentence_embedding": {"pooling": mode, "normalize": normalize, "max_seq_length": max_seq_length}}

    def finish_folder(self, spec, model, folder, max_seq_length):
        mode, normalize = pooling(spec)
        write_sentence_transformers(folder, model.config.hidden_size, mode, normalize, max_seq_length)

    def recipe(self, spec, teacher_layers=None):
        return "embedding_minilm.yaml", "the recipe for sentence embeddings"

    def usage(self, model, spec=None):
        return ('from sentence_transformers import SentenceTransformer\n\n'
                f'encoder = SentenceTransformer("{model}")  # a sentence-transformers folder: the teacher\'s pooling\n'
                'embeddings = encoder.encode(["A man is playing a guitar.", "A person plays an instrument."])\n'
                'print(encoder.similarity(embeddings[0], embeddings[1]))')

    def unlabelled_rows(self, spec, texts):
        return {spec.text_columns[0]: list(texts), **({spec.text_columns[1]: [""] * len(texts)}
                                                      if len(spec.text_columns) > 1 else {}),
                "label": [float("nan")] * len(texts)}


SQUAD_RETRIEVAL = TaskSpec("squad_retrieval", ("question", "context"), "answers", (), RETRIEVAL_METRICS, hub=("squad",),
                           train_file="train.json", dev_file="dev.json", task_type="sentence_embedding",
                           options={"pooling": "mean", "normalize": True})
STSB_EMBEDDING = TaskSpec("stsb_embedding", ("sentence1", "sentence2"), "score", (), EMBEDDING_METRICS, hub=("glue", "stsb"),
                          task_type=SentenceEmbedding.name, options={"pooling": "mean", "normalize": True})

SENTENCE_EMBEDDING = register_task_type(SentenceEmbedding())
register_task(STSB_EMBEDDING)
register_task(SQUAD_RETRIEVAL)
