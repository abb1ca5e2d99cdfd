"""Students pruned from their teacher: importance, the plan, the surgery and the pruning stage of the pipeline."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import (AutoConfig, AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, pipeline as hf_pipeline)

import run_distill
from conftest import padded_batch, tiny_bert, tiny_job
from distill.config import ConfigError, load_config
from distill.job.pruned import IMPORTANCE_FILE, init_projections, kept_channels
from glue_fixtures import write_glue_folder
from students.build import student_config
from students.pruning import (Importance, PruningError, check_reachable, compute_importance, layer_modules,
                              plan_pruning, prune_model, select_layers)

SIZES = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=40)
FAMILY_SIZES = {"distilbert": dict(vocab_size=40, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                                   max_position_embeddings=40),
                "roberta": dict(SIZES, type_vocab_size=1, pad_token_id=1, max_position_embeddings=44)}
HEADS = {"sequence": AutoModelForSequenceClassification, "token": AutoModelForTokenClassification,
         "question_answering": AutoModelForQuestionAnswering}
SAME = dict(num_hidden_layers=3, hidden_size=32, intermediate_size=64, num_attention_heads=4)


def _teacher(family: str = "bert", head: str = "sequence", seed: int = 0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(family, num_labels=2 if head == "question_answering" else 3,
                                  **FAMILY_SIZES.get(family, SIZES))
    return HEADS[head].from_config(config).eval()


def _batches(count: int = 3) -> list[dict]:
    return [padded_batch(seed=i, batch=4, length=9, vocab=40) for i in range(count)]


def _logits(model, batch):
    outputs = model(**batch)
    return outputs.logits if getattr(outputs, "logits", None) is not None else torch.stack(
        (outputs.start_logits, outputs.end_logits), dim=-1)


def _prune(teacher, shape: dict, layers: list[int]):
    importance = compute_importance(teacher, _batches())
    plan = plan_pruning(importance, teacher.config, shape, layers)
    return plan, prune_model(teacher, plan, student_config(teacher.config, shape, init="pruned"))


@pytest.mark.parametrize("family, head", [("bert", "sequence"), ("roberta", "sequence"), ("electra", "sequence"),
                                          ("distilbert", "sequence"), ("mpnet", "sequence"), ("bert", "token"),
                                          ("bert", "question_answering"), ("roberta", "token")])
def test_pruning_nothing_gives_the_teachers_outputs_and_a_plain_checkpoint(family, head, tmp_path):
    teacher = _teacher(family, head)
    _, student = _prune(teacher, SAME, [1, 2, 3])
    batch = padded_batch(seed=9, batch=2, length=8, vocab=40)
    torch.testing.assert_close(_logits(student, batch), _logits(teacher, batch))
    # A smaller shape saves and loads back with transformers alone, to the same outputs.
    plan, small = _prune(teacher, dict(num_hidden_layers=2, hidden_size=24, intermediate_size=40,
                                       num_attention_heads=4), [1, 3])
    small.save_pretrained(tmp_path / "pruned")
    reloaded = HEADS[head].from_pretrained(tmp_path / "pruned").eval()
    assert reloaded.config.hidden_size == 24 and reloaded.config.num_hidden_layers == 2
    torch.testing.assert_close(_logits(reloaded, batch), _logits(small, batch))
    assert sum(p.numel() for p in reloaded.parameters()) < sum(p.numel() for p in teacher.parameters())


def _planted_teacher():
    """A tiny BERT whose units have planted importances: residual channels 3, 7, 11, ... are scaled up in every
    LayerNorm; in layer 2 FFN neurons 5 and 9 by their input weights, and head 2's values by 20."""
    teacher = _teacher("bert")
    with torch.no_grad():
        big = torch.arange(3, 32, 4)
        for module in teacher.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight[big] *= 30
        layer = layer_modules(teacher, 1)
        layer["ffn_in"].weight[[5, 9]] *= 40
        layer["ffn_in"].bias[[5, 9]] += 5
        layer["value"].weight[16:24] *= 20
    return teacher, big.tolist()


def test_the_planted_units_rank_first_and_the_student_holds_exactly_their_weights():
    teacher, big = _planted_teacher()
    importance = compute_importance(teacher, _batches())
    assert set(big) <= set(importance.residual[[0, 2]].sum(0).argsort(descending=True)[:len(big)].tolist())
    assert set(importance.ffn[1].argsort(descending=True)[:2].tolist()) == {5, 9}
    assert int(importance.heads[1].argmax()) == 2
    shape = dict(num_hidden_layers=2, hidden_size=16, intermediate_size=8, num_attention_heads=2)
    plan = plan_pruning(importance, teacher.config, shape, [1, 2])
    assert set(big) <= set(plan.residual) and len(plan.residual) == 16
    assert {5, 9} <= set(plan.ffn[1]) and 2 in plan.heads[1]
    student = prune_model(teacher, plan, student_config(teacher.config, shape, init="pruned"))
    rows, channels = torch.as_tensor(plan.ffn[1]), torch.as_tensor(plan.residual)
    kept, own = layer_modules(teacher, 1), layer_modules(student, 1)
    torch.testing.assert_close(own["ffn_in"].weight, kept["ffn_in"].weight[rows][:, channels])
    torch.testing.assert_close(own["query"].weight, kept["query"].weight[torch.as_tensor(plan.query_key[1])][:, channels])
    torch.testing.assert_close(own["output"].weight, kept["output"].weight[channels][:, torch.as_tensor(plan.value[1])])
    torch.testing.assert_close(student.bert.embeddings.word_embeddings.weight,
                               teacher.bert.embeddings.word_embeddings.weight[:, channels])
    torch.testing.assert_close(student.classifier.weight, teacher.classifier.weight[:, torch.as_tensor(
        plan.outputs["bert.pooler.dense"])])
    # Within a kept head the top query/key dimensions by mean|q|·mean|k| are kept, 8 of the head's 8 -> 8 of 8 here.
    assert all(len(dims) == 16 for dims in plan.query_key) and plan.heads[1] == sorted(plan.heads[1])


def test_importance_is_deterministic_and_round_trips_through_safetensors():
    teacher = _teacher()
    first, second = compute_importance(teacher, _batches()), compute_importance(teacher, _batches())
    again = Importance.from_tensors(first.to_tensors())
    for name in Importance.TENSORS:
        torch.testing.assert_close(getattr(first, name), getattr(second, name))
        torch.testing.assert_close(getattr(again, name), getattr(first, name))
    assert again.num_examples == 12 and again.outputs.keys() == first.outputs.keys()


def test_layers_by_importance_are_those_that_change_their_input_most():
    importance = compute_importance(_teacher(), _batches())
    importance.layer_change = torch.tensor([0.5, 0.1, 0.3])
    assert select_layers(importance, 2) == [1, 3]


@pytest.mark.parametrize("shape, message", [
    (dict(num_hidden_layers=2, hidden_size=30, intermediate_size=40, num_attention_heads=3),
     "hidden_size 30 with 3 heads needs a head size of 10; .* nearest reachable hidden_size 28 with "
     "num_attention_heads 4"),
    (dict(num_hidden_layers=2, hidden_size=24, intermediate_size=80, num_attention_heads=4),
     "intermediate_size 80 is larger than the teacher's \\(64\\)"),
    (dict(num_hidden_layers=4, hidden_size=24, intermediate_size=40, num_attention_heads=4),
     "num_hidden_layers 4 is larger"),
])
def test_shapes_pruning_cannot_reach_are_refused_with_the_nearest_reachable(shape, message):
    with pytest.raises(PruningError, match=message):
        check_reachable(shape, _teacher().config)


def test_an_mpnet_teacher_keeps_its_heads_and_albert_is_refused():
    with pytest.raises(PruningError, match="relative position bias"):
        check_reachable(dict(num_hidden_layers=2, hidden_size=16, intermediate_size=40, num_attention_heads=2),
                        _teacher("mpnet").config)
    albert = AutoConfig.for_model("albert", **SIZES, embedding_size=16)
    with pytest.raises(PruningError, match="share one set of weights"):
        check_reachable(SAME, albert)


def test_projections_start_as_the_selection_of_the_kept_channels():
    projections = torch.nn.ModuleDict({"hidden": torch.nn.Linear(3, 6), "embedding": torch.nn.Linear(3, 6)})
    init_projections(projections, [1, 4, 5])
    states = torch.randn(2, 3)
    for projection in projections.values():
        mapped = projection(states)
        torch.testing.assert_close(mapped[:, [1, 4, 5]], states)
        assert mapped[:, [0, 2, 3]].abs().max() == 0


def test_the_pipeline_prunes_the_teacher_then_distils_and_ships_a_pipeline_model(tmp_path, tiny_tokenizer):
    """student.init pruned through the real pipeline: the pruning stage's folder holds a plain checkpoint, its
    importance and what it kept; the intermediate step starts from it with W the selection of the kept channels (its
    first hidden loss is that of the pruned student); the shipped student runs in pipeline(); a rerun reuses every
    stage, and a new shape prunes again."""
    teacher = tiny_bert(seed=0, num_hidden_layers=3)
    data = write_glue_folder(tmp_path, "sst2")
    student = {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 4,
               "init": "pruned", "pruning": {"num_examples": 6}}
    config = tiny_job(tmp_path, teacher, tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student=student, distill={"layer_map": "last"})
    assert run_distill.main(["pipeline", "--config", config]) == 0
    out = tmp_path / "run"
    record = json.loads((out / "pruned" / "stage.json").read_text())
    assert record["layer_map"] == [2, 3] and record["num_examples"] == 6 and "accuracy" in record["dev"]
    assert set(load_file(out / "pruned" / IMPORTANCE_FILE)) >= {"residual", "ffn", "query_key", "value"}
    pruned = AutoModelForSequenceClassification.from_pretrained(out / "pruned")
    assert pruned.config.hidden_size == 16 and len(kept_channels(out / "pruned")) == 16
    step1 = json.loads((out / "student_intermediate" / "stage.json").read_text())
    assert step1["layer_map"] == [0, 2, 3] and step1["pruned"]["layer_map"] == [2, 3]
    served = hf_pipeline("text-classification", model=str(out / "student"))
    assert served("the movie was good")[0]["label"] in set(pruned.config.id2label.values())
    assert "pruned to the student's shape" in (out / "student" / "README.md").read_text()
    stamp = (out / "pruned" / "stage.json").stat().st_mtime_ns
    assert run_distill.main(["pipeline", "--config", config]) == 0
    assert (out / "pruned" / "stage.json").stat().st_mtime_ns == stamp
    assert run_distill.main(["pipeline", "--config", config, "--set", "student.pruning.importance=taylor"]) == 0
    record = json.loads((out / "pruned" / "stage.json").read_text())
    assert record["importance"] == "taylor" and record["run_id"] != json.loads(
        (out / "superseded").glob("pruned-*").__next__().joinpath("stage.json").read_text())["run_id"]
    assert "Taylor importance" in (out / "student" / "README.md").read_text()


def test_the_first_hidden_loss_of_a_pruned_student_is_that_of_its_selected_channels():
    """A student pruned to the teacher's own shape computes the teacher's states: hidden loss 0. A narrower one with
    W the selection of its kept channels starts far below the loss it has with W drawn at random."""
    from distill.method.objective import DistillationObjective

    teacher = _teacher()
    _, same = _prune(teacher, SAME, [1, 2, 3])
    objective = DistillationObjective(teacher, same, {"hidden": 1.0, "embedding": 1.0}, [1, 2, 3])
    assert len(objective.trainable["projections"]) == 0  # same width: the states are compared as they are
    batch = padded_batch(seed=1, vocab=40)
    assert float(objective(batch)[0]) < 1e-10
    plan, narrow = _prune(teacher, dict(SAME, hidden_size=28), [1, 2, 3])
    objective = DistillationObjective(teacher, narrow, {"hidden": 1.0, "embedding": 1.0}, [1, 2, 3])
    with torch.no_grad():
        random_start = float(objective(batch)[0])
        init_projections(objective.trainable["projections"], plan.residual)
        selected = float(objective(batch)[0])
    assert selected < random_start / 3


def test_preflight_refuses_pruning_with_a_general_stage_or_an_unreachable_shape(tmp_path, tiny_tokenizer):
    data = write_glue_folder(tmp_path, "sst2")
    config = tiny_job(tmp_path, tiny_bert(seed=0), tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student={"init": "pruned", "hidden_size": 18, "num_attention_heads": 2})
    from distill.job.preflight import preflight

    with pytest.raises(ConfigError, match="nearest reachable hidden_size 18 with num_attention_heads 3"):
        preflight(load_config(config))
    with pytest.raises(ConfigError, match="set general.enabled: false"):
        preflight(load_config(config, {"general.enabled": True, "student.hidden_size": 16}))


def test_taylor_scores_follow_the_loss_where_magnitudes_do_not():
    """A neuron whose output weights are zero changes nothing downstream: its Taylor score is 0 although it fires,
    and a neuron whose output weights are scaled up ranks first by Taylor, not by activation (its activations are
    unchanged). Without labels the Taylor pass is refused."""
    teacher = _teacher().requires_grad_(False)  # frozen, as the pipeline loads a teacher
    with torch.no_grad():
        modules = layer_modules(teacher, 0)
        modules["ffn_out"].weight[:, 3] = 0
        modules["ffn_out"].weight[:, 7] *= 50
    batches = [dict(batch, labels=torch.tensor([0, 1, 2, 1])) for batch in _batches()]
    taylor = compute_importance(teacher, batches, criterion="taylor")
    activation = compute_importance(teacher, batches)
    assert float(taylor.ffn[0, 3]) == 0 and float(activation.ffn[0, 3]) > 0
    assert int(taylor.ffn[0].argmax()) == 7 and int(activation.ffn[0].argmax()) != 7
    assert not any(p.requires_grad for p in teacher.parameters())  # left frozen
    with pytest.raises(ValueError, match="needs the batches' labels"):
        compute_importance(teacher, _batches(), criterion="taylor")


def test_pruning_in_stages_distils_each_stage_and_follows_the_teacher_through_them(tmp_path, tiny_tokenizer, caplog):
    """student.pruning.stages: the teacher pruned to the first stage's shape and distilled, that student pruned to
    the second's and distilled, that one pruned to the student's shape and distilled again. Each plan's layers and
    channels are the teacher's, composed through the stages before; W starts as the stage before's learnt W
    restricted to the kept channels (loaded by the intermediate step); the report times the stages, the card names
    them; the dry run's run ids are the run's (the teacher-output cache's too), every stage reused."""
    import logging

    from distill.job.pipeline import plan_pipeline

    teacher = tiny_bert(seed=0, num_hidden_layers=4)
    data = write_glue_folder(tmp_path, "sst2")
    stages = [{"num_hidden_layers": 3, "hidden_size": 28, "intermediate_size": 56, "num_attention_heads": 4},
              {"num_hidden_layers": 3, "hidden_size": 24, "intermediate_size": 48, "num_attention_heads": 4}]
    student = {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 4,
               "init": "pruned", "pruning": {"num_examples": 6, "layers": "importance", "stages": stages}}
    config = tiny_job(tmp_path, teacher, tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student=student, distill={"layer_map": "uniform", "teacher_cache": "float16"})
    with caplog.at_level(logging.INFO):
        assert run_distill.main(["pipeline", "--config", config]) == 0
    out = tmp_path / "run"
    plans = [json.loads((folder / "pruning.json").read_text()) for folder in (
        out / "pruning" / "stage-1" / "pruned", out / "pruning" / "stage-2" / "pruned", out / "pruned")]
    assert "teacher_layers" not in plans[0] and len(plans[0]["residual"]) == 28  # pruned from the teacher itself
    assert AutoConfig.from_pretrained(out / "pruning" / "stage-2" / "student").hidden_size == 24
    for before, plan in zip(plans, plans[1:]):
        layers, residual = before.get("teacher_layers", before["layers"]), before.get("teacher_residual",
                                                                                       before["residual"])
        assert plan["teacher_layers"] == [layers[layer - 1] for layer in plan["layers"]]
        assert plan["teacher_residual"] == [residual[channel] for channel in plan["residual"]]
    for number, folder in ((1, out / "pruning" / "stage-2" / "pruned"), (2, out / "pruned")):
        learnt = load_file(out / "pruning" / f"stage-{number}" / "student_intermediate" / "projections.safetensors")
        started = load_file(folder / "projections.safetensors")
        kept = json.loads((folder / "pruning.json").read_text())["residual"]
        for name in ("hidden.weight", "embedding.weight"):
            torch.testing.assert_close(started[name], learnt[name][:, kept], rtol=0, atol=0)
        torch.testing.assert_close(started["hidden.bias"], learnt["hidden.bias"], rtol=0, atol=0)
        assert f"projections loaded from {folder / 'projections.safetensors'}" in caplog.text
    assert kept_channels(out / "pruned") == plans[2]["teacher_residual"]
    assert json.loads((out / "pruned" / "stage.json").read_text())["layer_map"] == plans[2]["teacher_layers"]
    assert json.loads((out / "student_intermediate" / "stage.json").read_text())["layer_map"] == [
        0, *plans[2]["teacher_layers"]]
    assert "pruning in stages (each pruned and distilled)" in (out / "report.md").read_text()
    assert ("pruned in stages (first to layers 3, hidden 28, FFN 56, heads 4; layers 3, hidden 24, FFN 48, heads 4, "
            "each stage pruned from the one before" in (out / "student" / "README.md").read_text())
    rows = {row["stage"]: row for row in plan_pipeline(load_config(config))}
    assert {rows[f"pruning stage {number}: {name}"]["action"] for number in (1, 2)
            for name in ("pruned", "student_intermediate", "student")} == {"reuse"}
    for stage in ("pruned", "teacher_outputs", "student_intermediate", "student"):
        assert rows[stage]["action"] == "reuse", stage


def test_a_changed_stage_prunes_again_and_an_interrupted_pruning_of_another_run_is_set_aside(tmp_path, tiny_tokenizer):
    """A stage given as a relative preset (teacher-half) is read against the teacher, and so is the student's
    shape; an interrupted pruning folder (importance measured, no stage.json) of another run is moved aside, not
    read, when the stage changes."""
    teacher = tiny_bert(seed=0, num_hidden_layers=4)
    data = write_glue_folder(tmp_path, "sst2")
    student = {"preset": "teacher-half", "num_hidden_layers": None, "hidden_size": 16, "intermediate_size": 32,
               "num_attention_heads": 4, "init": "pruned",
               "pruning": {"num_examples": 6, "stages": ["teacher-half"]}}
    config = tiny_job(tmp_path, teacher, tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student=student)
    assert run_distill.main(["pipeline", "--config", config]) == 0
    out = tmp_path / "run"
    assert AutoConfig.from_pretrained(out / "pruning" / "stage-1" / "student").num_hidden_layers == 2
    assert AutoConfig.from_pretrained(out / "student").num_hidden_layers == 2  # the teacher's half, not the stage's
    (out / "pruned" / "stage.json").unlink()  # as if killed after measuring the importance
    stage = {"num_hidden_layers": 3, "hidden_size": 24, "intermediate_size": 48, "num_attention_heads": 4}
    assert run_distill.main(["pipeline", "--config", config, "--set",
                             f"student.pruning.stages=[{json.dumps(stage)}]"]) == 0
    assert AutoConfig.from_pretrained(out / "pruning" / "stage-1" / "student").hidden_size == 24
    assert len(load_file(out / "pruned" / IMPORTANCE_FILE)["residual"][0]) == 24  # measured on the new stage
    assert list((out / "superseded").glob("pruned-*"))


def test_preflight_refuses_a_pruning_stage_the_stage_before_cannot_reach(tmp_path, tiny_tokenizer):
    from distill.job.preflight import preflight

    data = write_glue_folder(tmp_path, "sst2")
    stage = {"num_hidden_layers": 2, "hidden_size": 24, "intermediate_size": 48, "num_attention_heads": 4}
    config = tiny_job(tmp_path, tiny_bert(seed=0), tiny_tokenizer, task={"name": "sst2", "data_dir": str(data)},
                      student={"init": "pruned", "hidden_size": 16, "num_attention_heads": 4,
                               "pruning": {"stages": [stage]}})
    preflight(load_config(config))  # 32 -> 24 -> 16 wide
    with pytest.raises(ConfigError, match=r"^student.intermediate_size 64 is larger than the last stage's \(48\)"):
        preflight(load_config(config, {"student.intermediate_size": 64}))
    with pytest.raises(ConfigError, match=r"^student.pruning.stages\[0\].num_hidden_layers 3 is larger than the "
                                          r"teacher's \(2\)"):
        preflight(load_config(config, {"student.pruning.stages": [dict(stage, num_hidden_layers=3)]}))
    with pytest.raises(ConfigError, match=r"^student.pruning.stages\[0\]: .*heads"):  # distilled from 4 heads
        preflight(load_config(config, {"student.pruning.stages": [dict(stage, num_attention_heads=3)]}))
    with pytest.raises(ConfigError, match="a layer map that lists teacher layers cannot be followed"):
        preflight(load_config(config, {"distill.layer_map": [1, 2]}))
    preflight(load_config(config, {"distill.layer_map": [1, 2], "student.pruning.layers": "importance"}))
    with pytest.raises(ConfigError, match="student.pruning.stages: stage 'albert-4l-312' is a albert shape"):
        preflight(load_config(config, {"student.pruning.stages": ["albert-4l-312"]}))
    with pytest.raises(ConfigError, match="student.pruning.stages: each stage is a preset name or a mapping of all"):
        load_config(config, {"student.pruning.stages": [{"hidden_size": 24}]})
