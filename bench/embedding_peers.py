"""Our distilled sentence encoder against two public ways of shrinking the same teacher, side by side in one run.

On STS-B dev (the GLUE copy, 1,500 pairs, read with the project's loader), each model embeds every dev sentence; the
score is the Spearman (and Pearson) correlation of each pair's cosine similarity with its gold score, on the whole dev
set and on the project's report half (:mod:`distill.tasks.split`, scored with
:func:`distill.tasks.sentence_embedding.similarity_metrics`, as the pipeline scores). Rows:

- ``teacher``: all-MiniLM-L6-v2 (the bundled ``minilm`` folder; mean pooling, normalized), loaded by
  sentence-transformers;
- ``ours``: the pipeline's distilled student folder (``--student``), loaded by sentence-transformers; its scores are
  checked against the ``stage.json`` the run recorded (and the teacher's against ``../teacher/stage.json``);
- ``st_layerdrop_before``: sentence-transformers' layer-reduction student (its example
  ``examples/sentence_transformer/training/distillation/model_distillation_layer_reduction.py``): the teacher with only
  its layers ``--layers`` (default 0, 2, 4) kept, untrained;
- ``st_layerdrop_b<B>``: the same start trained as that example trains it: ``MSELoss`` of the student's sentence
  embedding to the teacher's (precomputed with ``teacher.encode``), ``SentenceTransformerTrainer``, 1 epoch, learning
  rate 1e-4, warm-up 10% of the steps, linear decay, seed 42, on the deduplicated sentences of STS-B train (its
  ``sentence1`` and ``sentence2``, 10,536 distinct); one row per ``--train-batch-sizes`` (the example's 64 and 32).
  The example picks the best checkpoint on STS-B dev; here the last is kept (dev holds the report half);
- ``model2vec``: Model2Vec's static distillation of the teacher (``model2vec.distill.distill(teacher folder,
  pca_dims=256)``, its defaults otherwise: SIF weighting 1e-4, float16), run in its own virtual environment
  (``--model2vec-python``; model2vec[distill] wants another transformers) by this file as a worker
  (``--model2vec-worker``), which distils, saves to ``OUTPUT/m2v_minilm``, embeds the dev sentences and times itself.

Latency: ``model.encode`` of the first ``--latency-sentences`` (32) dev first sentences, all in one batch and one at a
time (per-sentence time of the 32 calls), padded only to each batch's longest (the mean and longest token length are
printed); ``--warmup`` untimed and ``--repeats`` timed rounds, the torch models interleaved round-robin in this process
(the starting model rotating each round), ``--threads`` torch threads and tokenizers without parallelism; median,
p10 and p90 per model, and the teacher's median over each model's ("faster by"). Model2Vec is timed the same way in
its worker process, so not interleaved with the others. Sizes: the folder each library saves (weights, tokenizer,
configs), under ``OUTPUT``.

Usage: nice -n 10 python bench/embedding_peers.py --student runs/stsb_embedding/student [--teacher minilm]
       [--data-dir ../shared/data/glue/STS-B] [--output-dir runs/embedding_peers] [--train-batch-sizes 64 32]
       [--model2vec-python .venv-model2vec/bin/python] [--threads 2] [--repeats 20] [--warmup 3]
It writes OUTPUT/embedding_peers.md (the table) and OUTPUT/embedding_peers.json; the last line printed is the JSON.
Model2Vec's own environment (its distillation pins another transformers than this project's):
    python3 -m venv .venv-model2vec && .venv-model2vec/bin/pip install torch==2.13.0 \
        "model2vec[distill,quantization]==0.10.0"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Top-level imports stay in the standard library: the Model2Vec worker runs this file in a venv without the project's
# dependencies.


def time_encoders(encoders: dict, sentences: list[str], warmup: int, repeats: int) -> dict:
    """{name: {"batch_<N>": {median_ms, p10_ms, p90_ms}, "batch_1": ...}}: per round, each encoder (its ``encode(texts,
    batch_size)``) in turn, the first one rotating, encodes ``sentences`` in one batch, then one at a time (the time per
    sentence); the first ``warmup`` rounds are not kept."""
    names = list(encoders)
    times = {name: {"batch": [], "single": []} for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            encode = encoders[name]
            start = time.perf_counter()
            encode(sentences, len(sentences))
            middle = time.perf_counter()
            for sentence in sentences:
                encode([sentence], 1)
            end = time.perf_counter()
            if round_ >= warmup:
                times[name]["batch"].append((middle - start) * 1000)
                times[name]["single"].append((end - middle) * 1000 / len(sentences))

    def summary(values: list[float]) -> dict:
        deciles = statistics.quantiles(values, n=10)
        return {"median_ms": round(statistics.median(values), 2), "p10_ms": round(deciles[0], 2),
                "p90_ms": round(deciles[-1], 2)}

    return {name: {f"batch_{len(sentences)}": summary(found["batch"]), "batch_1": summary(found["single"])}
            for name, found in times.items()}


def folder_size(folder: Path) -> dict:
    files = [path for path in Path(folder).rglob("*") if path.is_file()]
    return {"size_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
            "weights_mb": round(sum(p.stat().st_size for p in files if p.suffix == ".safetensors") / 1e6, 1)}


def model2vec_worker(job_file: str) -> None:
    """Run in the Model2Vec venv: distil, save, embed the dev sentences into ``job["embeddings"]`` (.npy), time; print
    one JSON line."""
    job = json.loads(Path(job_file).read_text())
    import numpy as np
    import torch

    torch.set_num_threads(job["threads"])
    import model2vec
    from model2vec import StaticModel
    from model2vec.distill import distill

    start = time.perf_counter()
    model = distill(model_name=job["teacher"], pca_dims=job["pca_dims"])
    distill_s = time.perf_counter() - start
    model.save_pretrained(job["output"])
    model = StaticModel.from_pretrained(job["output"])  # the saved model, as a user loads it
    np.save(job["embeddings"], np.asarray(model.encode(job["sentences"], batch_size=1024), dtype=np.float32))
    latency = time_encoders({"model2vec": lambda texts, size: model.encode(texts, batch_size=size)},
                            job["latency_sentences"], job["warmup"], job["repeats"])["model2vec"]
    print(json.dumps({"version": model2vec.__version__, "distill_s": round(distill_s, 1),
                      "params": int(np.prod(model.embedding.shape)), "shape": list(model.embedding.shape),
                      "dtype": str(model.embedding.dtype), "latency": latency,
                      "torch": torch.__version__}))


def run_model2vec(args, teacher_folder: str, sentences: list[str], latency_sentences: list[str], out: Path):
    """The worker's JSON and the dev sentences' embeddings, or None (with the reason printed) where it failed."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        job = {"teacher": teacher_folder, "pca_dims": args.pca_dims, "output": str(out / "m2v_minilm"),
               "embeddings": str(Path(tmp) / "dev.npy"), "sentences": sentences,
               "latency_sentences": latency_sentences, "threads": args.threads, "warmup": args.warmup,
               "repeats": args.repeats}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        start = time.perf_counter()
        done = subprocess.run([args.model2vec_python, str(Path(__file__).resolve()), "--model2vec-worker",
                               str(Path(tmp) / "job.json")], capture_output=True, text=True, env=os.environ.copy())
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"model2vec worker failed ({done.returncode}):\n{done.stderr[-3000:]}", flush=True)
            return None, None
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["worker_s"] = round(seconds, 1)
        return result, np.load(job["embeddings"])


def layer_dropped(teacher_folder: str, layers: list[int]):
    """The teacher with only ``layers`` of its encoder kept, as the sentence-transformers example builds it."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(teacher_folder, device="cpu")
    auto_model = model[0].auto_model
    auto_model.encoder.layer = torch.nn.ModuleList([auto_model.encoder.layer[i] for i in layers])
    auto_model.config.num_hidden_layers = len(layers)
    return model


def st_distil(model, sentences: list[str], targets, batch_size: int, args) -> dict:
    """Train ``model`` in place with sentence-transformers' own trainer and MSELoss, as its layer-reduction example
    does (CPU, fp32, no evaluation during training)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MSELoss

    dataset = Dataset.from_dict({"sentence": sentences, "label": targets.tolist()})
    with tempfile.TemporaryDirectory() as tmp:
        training = SentenceTransformerTrainingArguments(
            output_dir=tmp, num_train_epochs=args.epochs, per_device_train_batch_size=batch_size,
            learning_rate=args.learning_rate, warmup_steps=0.1, seed=args.seed, data_seed=args.seed, use_cpu=True,
            save_strategy="no", report_to="none", logging_steps=50, disable_tqdm=True, dataloader_num_workers=0)
        trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=dataset, loss=MSELoss(model))
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"seconds": round(seconds, 1), "steps": trainer.state.global_step, "batch_size": batch_size,
            "learning_rate": args.learning_rate, "epochs": args.epochs, "warmup": "10% of steps",
            "scheduler": training.lr_scheduler_type.value if hasattr(training.lr_scheduler_type, "value")
            else str(training.lr_scheduler_type), "optimizer": getattr(training.optim, "value", str(training.optim)),
            "weight_decay": training.weight_decay, "seed": args.seed, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None}


def table(rows: dict, teacher: str, batch: int) -> str:
    lines = ["| model | params (M) | size MB | report Spearman | whole Spearman | report Pearson | retained "
             f"(report) | batch 1 ms (p10-p90) | batch {batch} ms (p10-p90) | faster by, batch 1 | faster by, "
             f"batch {batch} |", "|" + "---|" * 11]
    base = rows[teacher]

    def cell(row, key):
        found = row.get("latency", {}).get(key)
        return f"{found['median_ms']:.1f} ({found['p10_ms']:.1f}-{found['p90_ms']:.1f})" if found else "-"

    def faster(row, key):
        found = row.get("latency", {}).get(key)
        return f"{base['latency'][key]['median_ms'] / found['median_ms']:.2f}x" if found else "-"

    for name, row in rows.items():
        dev = row["dev"]
        lines.append(f"| {row['label']} | {row['params'] / 1e6:.2f} | {row.get('size_mb', '-')} | "
                     f"{dev['report/spearman']:.4f} | {dev['spearman']:.4f} | {dev['report/pearson']:.4f} | "
                     f"{100 * dev['report/spearman'] / base['dev']['report/spearman']:.1f}% | "
                     f"{cell(row, 'batch_1')} | {cell(row, f'batch_{batch}')} | {faster(row, 'batch_1')} | "
                     f"{faster(row, f'batch_{batch}')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--student", help="our distilled student (a sentence-transformers folder)")
    parser.add_argument("--teacher", default="minilm", help="the teacher: an asset name or a folder")
    parser.add_argument("--data-dir", default="../shared/data/glue/STS-B", help="the GLUE STS-B folder")
    parser.add_argument("--output-dir", default="runs/embedding_peers")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 2, 4], help="teacher layers the ST peer keeps")
    parser.add_argument("--train-batch-sizes", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--pca-dims", type=int, default=256)
    parser.add_argument("--model2vec-python", default=".venv-model2vec/bin/python",
                        help="python of a venv with model2vec[distill]; '' leaves the row out")
    parser.add_argument("--latency-sentences", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--model2vec-worker", metavar="JOB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.model2vec_worker:
        model2vec_worker(args.model2vec_worker)
        return
    if not args.student:
        parser.error("--student is required")
    started = time.perf_counter()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer
    from transformers import set_seed

    from distill.config import TaskConfig
    from distill.tasks import get_task
    from distill.tasks.data import load_task_data
    from distill.tasks.sentence_embedding import similarity_metrics
    from distill.tasks.split import HALVES, example_halves
    from teachers.models import resolve_model

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = get_task("stsb_embedding")
    data = load_task_data(TaskConfig(name="stsb_embedding", data_dir=args.data_dir), spec)
    dev = data["dev"]
    column = {name: list(dev[name]) for name in ("sentence1", "sentence2", "label")}
    sentences = list(dict.fromkeys(column["sentence1"] + column["sentence2"]))
    position = {sentence: i for i, sentence in enumerate(sentences)}
    first = np.array([position[s] for s in column["sentence1"]])
    second = np.array([position[s] for s in column["sentence2"]])
    gold = np.array(column["label"], dtype=np.float64)
    halves = np.array(example_halves(spec, dev))
    latency_sentences = column["sentence1"][:args.latency_sentences]

    def score(embeddings) -> dict:
        embeddings = np.asarray(embeddings, dtype=np.float64)
        found = similarity_metrics(embeddings[first], embeddings[second], gold)
        for half in HALVES:
            keep = halves == half
            for name, value in similarity_metrics(embeddings[first[keep]], embeddings[second[keep]],
                                                  gold[keep]).items():
                found[f"{half}/{name}"] = value
        return found

    def encode(model):
        return lambda texts, size: model.encode(texts, batch_size=size, show_progress_bar=False,
                                                convert_to_numpy=True)

    parts: dict[str, float] = {}
    rows: dict[str, dict] = {}
    models = {}

    def add(name: str, label: str, model, folder: Path | None = None) -> None:
        start = time.perf_counter()
        rows[name] = {"label": label, "params": sum(p.numel() for p in model.parameters()),
                      "dev": score(model.encode(sentences, batch_size=32, show_progress_bar=False))}
        if folder is not None:
            model.save(str(folder))
            rows[name].update(folder_size(folder))
        models[name] = model
        print(f"{name}: report spearman {rows[name]['dev']['report/spearman']:.4f}, whole "
              f"{rows[name]['dev']['spearman']:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)

    start = time.perf_counter()
    teacher_folder = resolve_model(args.teacher)
    teacher = SentenceTransformer(teacher_folder, device="cpu")
    add("teacher", "teacher all-MiniLM-L6-v2", teacher, out / "teacher")
    student = Path(args.student)
    add("ours", "ours (distilled student)", SentenceTransformer(str(student), device="cpu"), out / "ours")
    checks = {}
    for name, stage in (("teacher", student.parent / "teacher" / "stage.json"), ("ours", student / "stage.json")):
        if stage.is_file():
            recorded = json.loads(stage.read_text())["dev"]
            checks[name] = {key: round(rows[name]["dev"][key] - recorded[key], 5)
                            for key in ("spearman", "report/spearman", "pearson", "report/pearson")}
            worst = max(abs(v) for v in checks[name].values())
            print(f"check {name} against {stage}: largest difference {worst:.1e}"
                  + ("" if worst <= 1e-3 else "  ** MISMATCH above 1e-3 **"), flush=True)
    parts["teacher_and_ours_s"] = round(time.perf_counter() - start, 1)

    start = time.perf_counter()
    tokens = [len(ids) for ids in teacher.tokenizer(latency_sentences)["input_ids"]]
    train_sentences = list(dict.fromkeys(list(data["train"]["sentence1"]) + list(data["train"]["sentence2"])))
    targets = teacher.encode(train_sentences, batch_size=128, show_progress_bar=False, convert_to_numpy=True)
    parts["teacher_targets_s"] = round(time.perf_counter() - start, 1)
    layers = ",".join(map(str, args.layers))
    add("st_layerdrop_before", f"ST layer-drop [{layers}], untrained", layer_dropped(teacher_folder, args.layers))
    training = {}
    for batch_size in args.train_batch_sizes:
        name = f"st_layerdrop_b{batch_size}"
        set_seed(args.seed)
        model = layer_dropped(teacher_folder, args.layers)
        training[name] = st_distil(model, train_sentences, targets, batch_size, args)
        parts[f"{name}_train_s"] = training[name]["seconds"]
        print(f"{name}: trained {training[name]}", flush=True)
        add(name, f"ST layer-drop [{layers}] + MSELoss, batch {batch_size}", model.eval(), out / name)
        rows[name]["training"] = training[name]
    rows["st_layerdrop_before"].update({k: v for k, v in rows[f"st_layerdrop_b{args.train_batch_sizes[0]}"].items()
                                        if k.endswith("_mb")})

    model2vec = None
    if args.model2vec_python:
        model2vec, embeddings = run_model2vec(args, teacher_folder, sentences, latency_sentences, out)
        if model2vec is not None:
            parts["model2vec_worker_s"] = model2vec["worker_s"]
            rows["model2vec"] = {"label": f"Model2Vec distill (PCA {args.pca_dims})", "params": model2vec["params"],
                                 "dev": score(embeddings), "latency": model2vec["latency"], "model2vec": model2vec,
                                 **folder_size(out / "m2v_minilm")}
            print(f"model2vec: report spearman {rows['model2vec']['dev']['report/spearman']:.4f}, distilled in "
                  f"{model2vec['distill_s']} s", flush=True)

    start = time.perf_counter()
    latency = time_encoders({name: encode(model) for name, model in models.items()}, latency_sentences,
                            args.warmup, args.repeats)
    parts["latency_s"] = round(time.perf_counter() - start, 1)
    for name, found in latency.items():
        rows[name]["latency"] = found
    parts["total_s"] = round(time.perf_counter() - started, 1)

    text = table(rows, "teacher", len(latency_sentences))
    setting = (f"STS-B dev ({len(gold)} pairs, report half {int((halves == 'report').sum())}); latency: "
               f"{len(latency_sentences)} dev sentences, {statistics.mean(tokens):.1f} tokens on average (longest "
               f"{max(tokens)}), {args.threads} threads, {args.warmup} warm-up + {args.repeats} rounds, torch models "
               f"interleaved, Model2Vec in its own process; ST peer: SentenceTransformerTrainer + MSELoss on "
               f"{len(train_sentences):,} distinct STS-B train sentences, {args.epochs:g} epoch, learning rate "
               f"{args.learning_rate:g}, warm-up 10%, linear decay, AdamW, seed {args.seed}, batch sizes "
               f"{args.train_batch_sizes}")
    print(text)
    result = {"setting": setting, "teacher": teacher_folder, "student": str(student), "layers": args.layers,
              "threads": args.threads, "torch": torch.__version__, "latency_tokens": tokens,
              "checks": checks, "parts_s": parts, "rows": {name: {k: v for k, v in row.items()}
                                                             for name, row in rows.items()}}
    (out / "embedding_peers.md").write_text(f"# Sentence-embedding peers\n\n{setting}\n\n{text}\n\nCommand: python "
                                            f"{' '.join(sys.argv)}\n")
    (out / "embedding_peers.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
