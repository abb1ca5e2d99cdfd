"""What distillation adds to a pruned student, and what our importance adds to the pruning: side by side in one run.

Reads a finished pipeline run with a pruned student (``student.init: pruned``: its ``teacher/``, ``augmented/``,
``pruned/`` and ``student/`` folders) and trains, on the same distillation set (the augmented rows with their
labels) for the same number of passes as the run's two steps together, with plain fine-tuning (the model's own
cross-entropy on the gold labels, or MSE for regression; AdamW, linear schedule with warm-up):

- ``peer``: the teacher pruned to the same shape and layers with a pruning tool's own criterion, torch-pruning's
  group L2-magnitude importance (``GroupMagnitudeImportance``, Fang et al., 2023) of each coupled group (the residual
  stream, each layer's FFN, each layer's attention dimensions), then fine-tuned;
- ``ours_finetuned``: the run's pruned student (activation importance, students/pruning.py), then fine-tuned;
- ``ours_distilled``: the run's shipped student (the same pruned start, then the intermediate and prediction steps),
  read from its ``stage.json``.

Prints each row's dev metrics and share of the teacher's, and the pruned starts' scores before training.

Usage: python bench/pruning_peer.py --run runs/sst2_pruned/seed-42 [--learning-rate 1e-4] [--output-dir DIR]
The last line printed is a JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from augment import load_shards  # noqa: E402
from distill.config import TrainConfig, load_config  # noqa: E402
from distill.tasks.data import collator, load_task_data, task_spec, tokenize  # noqa: E402
from distill.tasks.evaluate import evaluate_task  # noqa: E402
from distill.method.objective import ModelLossObjective  # noqa: E402
from distill.method.trainer import train  # noqa: E402
from students.build import student_config, student_shape  # noqa: E402
from students.pruning import PruningPlan, encoder_layers, layer_modules, probe_inputs, prune_model  # noqa: E402
from teachers import load_teacher, load_tokenizer  # noqa: E402


def _top(scores: torch.Tensor, count: int) -> list[int]:
    return sorted(scores.argsort(descending=True)[:count].tolist())


def magnitude_plan(teacher, shape: dict, layers: list[int]) -> PruningPlan:
    """The plan torch-pruning's group L2-magnitude criterion gives for ``shape``: its score per channel of each
    coupled group (the graph's own coupling), the top ones kept; per head the top dimensions of the attention group
    (torch-pruning couples query, key, value and output in one group, so one set serves both)."""
    import copy

    import torch_pruning as tp

    model = copy.deepcopy(teacher).cpu().float().eval().requires_grad_(True)
    kept_layers = torch.nn.ModuleList([encoder_layers(model)[g - 1] for g in layers])
    parent_name = next(name for name, module in model.named_modules() if module is encoder_layers(model))
    setattr(model.get_submodule(parent_name.rsplit(".", 1)[0]), parent_name.rsplit(".", 1)[1], kept_layers)
    model.config.num_hidden_layers = len(layers)
    graph = tp.DependencyGraph().build_dependency(model, example_inputs=probe_inputs(model.config),
                                                  output_transform=lambda out: out.logits.sum())
    importance = tp.importance.GroupMagnitudeImportance(p=2)
    hidden, heads = teacher.config.hidden_size, teacher.config.num_attention_heads
    head_size, kept_size = hidden // heads, shape["hidden_size"] // shape["num_attention_heads"]
    norm = next(m for m in kept_layers[0].modules() if isinstance(m, torch.nn.LayerNorm))
    residual = importance(graph.get_pruning_group(norm, tp.prune_layernorm_out_channels, idxs=list(range(hidden))))
    plan = PruningPlan(layers=list(layers), residual=_top(residual, shape["hidden_size"]), query_key=[], value=[],
                       ffn=[], outputs={}, heads=[])
    for index in range(len(layers)):
        modules = layer_modules(model, index)
        ffn = importance(graph.get_pruning_group(modules["ffn_in"], tp.prune_linear_out_channels,
                                                 idxs=list(range(modules["ffn_in"].out_features))))
        plan.ffn.append(_top(ffn, shape["intermediate_size"]))
        attention = importance(graph.get_pruning_group(modules["query"], tp.prune_linear_out_channels,
                                                       idxs=list(range(modules["query"].out_features))))
        dims = [head * head_size + d for head in range(heads)
                for d in _top(attention[head * head_size:(head + 1) * head_size], kept_size)]
        plan.query_key.append(dims)
        plan.value.append(dims)
        plan.heads.append(list(range(heads)))
    for name, module in model.named_modules():  # head-side hidden-width outputs (a pooler): their own groups
        if isinstance(module, torch.nn.Linear) and module.in_features == module.out_features == hidden and \
                not any(module is m for m in kept_layers.modules()):
            scores = importance(graph.get_pruning_group(module, tp.prune_linear_out_channels,
                                                        idxs=list(range(hidden))))
            plan.outputs[name] = _top(scores, shape["hidden_size"])
    return plan


def fine_tune(model, train_set, tokenizer, spec, config: TrainConfig, folder: Path, device) -> float:
    objective = ModelLossObjective(model)
    start = time.perf_counter()
    train(objective, train_set, collator(tokenizer, spec), config, folder, run_id="peer", description=folder.name,
          device=device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished pipeline folder with a pruned student")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--output-dir", default=None, help="where the fine-tuned models go (default RUN/peer)")
    args = parser.parse_args()
    run = Path(args.run)
    config = load_config(str(run / "config.json"))
    spec = task_spec(config.task)
    data = load_task_data(config.task)
    device = torch.device("cpu")
    tokenizer = load_tokenizer(str(run / "teacher"))
    teacher = load_teacher(str(run / "teacher"), spec)
    record = {name: json.loads((run / name / "stage.json").read_text()) for name in
              ("teacher", "pruned", "student_intermediate", "student")}
    shape = student_shape(config.student, teacher.config)
    passes = config.distill.intermediate.num_epochs + config.distill.prediction.num_epochs
    budget = TrainConfig(num_epochs=passes, batch_size=config.distill.prediction.batch_size,
                         learning_rate=args.learning_rate, warmup_ratio=0.1, save_steps=10_000,
                         group_by_length=True)
    columns = [*spec.text_columns, "label"]
    train_set = tokenize(load_shards(run / "augmented").select_columns(columns), tokenizer, spec,
                         config.task.max_seq_length)
    out = Path(args.output_dir or run / "peer")
    metric = spec.metrics[0]
    teacher_score = record["teacher"]["dev"][metric]
    rows = {}
    plan = magnitude_plan(teacher, shape, record["pruned"]["layer_map"])
    peer = prune_model(teacher, plan, student_config(teacher.config, shape, init="pruned"))
    peer_before = evaluate_task(peer, data, tokenizer, spec, config.task.max_seq_length, device=device)
    seconds = fine_tune(peer, train_set, tokenizer, spec, budget, out / "peer", device)
    rows["peer"] = {"before": peer_before, "dev": evaluate_task(peer, data, tokenizer, spec,
                                                                config.task.max_seq_length, device=device),
                    "seconds": round(seconds, 1)}
    ours = spec.type.model_class(spec).from_pretrained(run / "pruned")
    seconds = fine_tune(ours, train_set, tokenizer, spec, budget, out / "ours_finetuned", device)
    rows["ours_finetuned"] = {"before": record["pruned"]["dev"], "dev": evaluate_task(
        ours, data, tokenizer, spec, config.task.max_seq_length, device=device), "seconds": round(seconds, 1)}
    rows["ours_distilled"] = {"before": record["pruned"]["dev"], "dev": record["student"]["dev"],
                              "seconds": record["student_intermediate"]["seconds"] + record["student"]["seconds"]}
    for name, row in rows.items():
        row["retained"] = row["dev"][metric] / teacher_score
        print(f"{name:16s} before {row['before'][metric]:.4f}  after {row['dev'][metric]:.4f}  "
              f"retained {100 * row['retained']:.1f}%  {row['seconds'] / 60:.1f} min")
    print(json.dumps({"run": str(run), "metric": metric, "teacher": teacher_score, "passes": passes,
                      "learning_rate": args.learning_rate, "rows": rows}))


if __name__ == "__main__":
    main()
