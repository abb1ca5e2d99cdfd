"""The input layout is a seam of the task type: a type whose inputs are not (batch, sequence) distils, exports and
prunes through it. The fixture is a multiple-choice type, (batch, choice, sequence) inputs flattened to one sequence a
choice for the encoder (as ``...ForMultipleChoice`` does), defined here and never registered: not a shipped task."""

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMultipleChoice

from distill.method.losses import prediction_loss
from distill.method.objective import DistillationObjective
from distill.publish.export import OnnxClassifier, export_onnx
from distill.tasks.base import PredictionHead, TaskSpec, TaskType
from students.build import student_config
from students.pruning import compute_importance, plan_pruning, prune_model

CHOICES = 3


class MultipleChoiceFixture(TaskType):
    """(B, C, T) inputs, (B, C) logits: one score a choice, a softmax over the choices."""

    name = "multiple_choice_fixture"
    metric_names = ("accuracy",)
    architecture = "ForMultipleChoice"
    description = "multiple-choice test fixture"
    input_dims = ("batch", "choice", "sequence")

    def model_class(self, spec):
        from transformers import AutoModelForMultipleChoice

        return AutoModelForMultipleChoice

    def example_inputs(self, config, batch_size, seq_length, generator=None):
        ids = torch.randint(1, config.vocab_size, (batch_size, CHOICES, seq_length), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if getattr(config, "type_vocab_size", 0) > 1:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        return inputs

    def prediction_loss(self, spec, student_logits, teacher_logits, batch, *, temperature, temperature_squared,
                        hard_label_weight):
        return prediction_loss(student_logits, teacher_logits, temperature, temperature_squared, batch.get("labels"),
                               hard_label_weight)


FIXTURE = MultipleChoiceFixture()
SPEC = TaskSpec("mc_fixture", ("text",), "label", ("a", "b", "c"), hub=None)


def _model(layers: int, hidden: int, seed: int = 0) -> BertForMultipleChoice:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=2 * hidden, max_position_embeddings=64, attn_implementation="eager")
    return BertForMultipleChoice(config).eval()


def _batch(seed: int = 0) -> dict:
    """Two questions of three choices of 7 tokens; some choices padded, each differently."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (2, CHOICES, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 1, 4:] = 0
    mask[1, 2, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}


def test_a_choice_layout_distils_with_its_padding_masked_in_every_term():
    teacher, student = _model(4, 32), _model(2, 16, seed=1)
    objective = DistillationObjective(teacher, student, {"embedding": 1, "hidden": 1, "attention": 1,
                                                         "prediction": 1}, [2, 4], head=PredictionHead(FIXTURE, SPEC))
    batch = _batch()
    loss, terms = objective(batch)
    assert torch.isfinite(loss) and set(terms) == {"embedding", "hidden", "attention", "prediction"}
    assert all(value > 0 for value in terms.values())
    loss.backward()
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    # the tokens under padding change nothing: every term reads the choices' rows through their own masks
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][batch["attention_mask"] == 0] = 7
    again, again_terms = objective(changed)
    for name in terms:
        torch.testing.assert_close(again_terms[name], terms[name], rtol=1e-5, atol=1e-6)
    # and a real token does change them
    moved = {**batch, "input_ids": batch["input_ids"].clone()}
    moved["input_ids"][0, 0, 0] = 6 if batch["input_ids"][0, 0, 0] != 6 else 8
    assert objective(moved)[1]["hidden"] != terms["hidden"]


def test_a_choice_layout_exports_with_every_dimension_dynamic(tmp_path):
    model = _model(2, 16)
    difference = export_onnx(model, tmp_path / "model.onnx", 32, FIXTURE)
    assert difference < 1e-4
    session = OnnxClassifier(tmp_path / "model.onnx")
    for batch_size, choices, length in ((1, 2, 5), (3, 4, 11)):  # other sizes than the probe's in every dimension
        ids = torch.randint(5, 50, (batch_size, choices, length), generator=torch.Generator().manual_seed(length))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        with torch.no_grad():
            expected = model(**inputs).logits
        found = session(**inputs).logits
        assert found.shape == (batch_size, choices)
        np.testing.assert_allclose(found.numpy(), expected.numpy(), atol=1e-4)


@pytest.mark.parametrize("criterion", ["activation", "taylor"])
def test_a_choice_layout_prunes_by_importance_over_the_choices_rows(criterion):
    teacher = _model(4, 32)
    batch = _batch()
    importance = compute_importance(teacher, [batch], criterion=criterion)
    assert importance.num_tokens == int(batch["attention_mask"].sum())  # every real token of every choice
    shape = {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 4}
    plan = plan_pruning(importance, teacher.config, shape, [2, 4])

    def probe(config):
        return FIXTURE.example_inputs(config, 2, 8, torch.Generator().manual_seed(0))

    student = prune_model(teacher, plan, student_config(teacher.config, shape, init="teacher"), example_inputs=probe)
    assert isinstance(student, BertForMultipleChoice) and student.config.hidden_size == 16
    with torch.no_grad():
        logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.shape == (2, CHOICES) and torch.isfinite(logits).all()
