"""The distillation losses, with numbers."""

import math

import pytest
import torch

from distill.method.losses import (
    attention_loss,
    hidden_loss,
    match_heads,
    prediction_loss,
    score_loss,
    soft_cross_entropy,
    squared_error_sum,
)
from distill.method.objective import DistillationObjective
from tests.conftest import padded_batch, tiny_bert


def test_attention_loss_zero_when_equal():
    scores = torch.randn(2, 4, 5, 5)
    assert attention_loss(scores, scores.clone(), torch.ones(2, 5)).item() == 0.0


def test_attention_loss_hand_computed_2x2():
    # One example, one head, two tokens: squared differences 1, 4, 0, 9 -> mean 14/4.
    student = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    teacher = torch.tensor([[[[0.0, 0.0], [3.0, 1.0]]]])
    loss = attention_loss(student, teacher, torch.ones(1, 2))
    assert loss.item() == pytest.approx(14 / 4)


def test_attention_loss_averages_over_heads_and_valid_pairs():
    # Two heads, second token is padding: only the (0, 0) pair counts; head errors 2^2 and 4^2 -> (4 + 16) / 2.
    student = torch.zeros(1, 2, 2, 2)
    teacher = torch.zeros(1, 2, 2, 2)
    teacher[0, 0, 0, 0], teacher[0, 1, 0, 0] = 2.0, 4.0
    teacher[0, :, 1, :] = 100.0  # padding rows/columns must not count
    teacher[0, :, :, 1] = 100.0
    loss = attention_loss(student, teacher, torch.tensor([[1, 0]]))
    assert loss.item() == pytest.approx(10.0)


def test_attention_loss_ignores_padding():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    mask = torch.ones(2, 4)
    base = attention_loss(student, teacher, mask)
    # Pad every example with 3 more positions holding arbitrary values: the loss must not move.
    big_s, big_t = torch.randn(2, 3, 7, 7) * 50, torch.randn(2, 3, 7, 7) * 50
    big_s[:, :, :4, :4], big_t[:, :, :4, :4] = student, teacher
    padded = attention_loss(big_s, big_t, torch.cat([mask, torch.zeros(2, 3)], dim=1))
    assert padded.item() == pytest.approx(base.item(), rel=1e-6)


def test_hidden_loss_hand_computed_and_padding_free():
    student = torch.tensor([[[1.0, 2.0], [9.0, 9.0]]])
    teacher = torch.tensor([[[0.0, 4.0], [0.0, 0.0]]])
    # Only token 0 is real: squared errors 1 and 4 over 1 token x 2 dims.
    assert hidden_loss(student, teacher, torch.tensor([[1, 0]])).item() == pytest.approx(2.5)
    assert hidden_loss(student, student, torch.ones(1, 2)).item() == 0.0


def test_hidden_loss_uses_projection():
    projection = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        projection.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    student = torch.tensor([[[1.0, 2.0]]])
    teacher = torch.tensor([[[1.0, 2.0, 3.0]]])
    assert hidden_loss(student, teacher, torch.ones(1, 1), projection).item() == 0.0
    with pytest.raises(ValueError, match="no projection"):
        hidden_loss(student, teacher, torch.ones(1, 1))


def test_soft_cross_entropy_hand_computed():
    teacher = torch.tensor([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    student = torch.tensor([[0.0, 0.0]])  # probabilities 1/2, 1/2
    assert soft_cross_entropy(student, teacher).item() == pytest.approx(math.log(2.0), rel=1e-6)
    # Equal logits: the loss is the teacher's entropy (its KL part is zero).
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert soft_cross_entropy(teacher, teacher).item() == pytest.approx(entropy, rel=1e-6)
    # Temperature 2 halves the logits: teacher probabilities 1/(1+sqrt 3), sqrt 3/(1+sqrt 3).
    p = 1 / (1 + math.sqrt(3))
    # A student [1, 0] at T = 2: log probabilities log(e^0.5 / (e^0.5 + 1)), log(1 / (e^0.5 + 1)).
    expected = -(p * math.log(math.exp(0.5) / (math.exp(0.5) + 1)) + (1 - p) * math.log(1 / (math.exp(0.5) + 1)))
    plain = soft_cross_entropy(torch.tensor([[1.0, 0.0]]), teacher, temperature=2.0)
    assert plain.item() == pytest.approx(expected, rel=1e-5)
    squared = prediction_loss(torch.tensor([[1.0, 0.0]]), teacher, 2.0, temperature_squared=True)
    assert squared.item() == pytest.approx(4 * expected, rel=1e-5)


def test_prediction_loss_regression_and_hard_labels():
    student, teacher = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [4.0]])
    assert score_loss(student, teacher).item() == pytest.approx((1 + 4) / 2)
    with_gold = score_loss(student, teacher, labels=torch.tensor([1.0, 0.0]), hard_label_weight=0.5)
    assert with_gold.item() == pytest.approx((1 + 4) / 2 + 0.5 * (0 + 4) / 2)
    logits = torch.tensor([[0.0, 0.0]])
    loss = prediction_loss(logits, logits, labels=torch.tensor([1]), hard_label_weight=0.5)
    assert loss.item() == pytest.approx(math.log(2) + 0.5 * math.log(2), rel=1e-6)


def test_match_heads_averages_groups_and_rejects_non_multiples():
    teacher = torch.arange(4.0).view(1, 4, 1, 1)
    assert match_heads(teacher, 2).flatten().tolist() == [0.5, 2.5]
    with pytest.raises(ValueError, match="multiple"):
        match_heads(teacher, 3)


def test_objective_zero_loss_when_student_is_teacher_and_gradients_reach_projections():
    teacher = tiny_bert(seed=0)
    same = tiny_bert(seed=0)
    objective = DistillationObjective(teacher, same, {"embedding": 1, "hidden": 1, "attention": 1}, [1, 2])
    loss, terms = objective(padded_batch())
    assert loss.item() == pytest.approx(0.0, abs=1e-10)
    assert set(terms) == {"embedding", "hidden", "attention"}

    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32)
    objective = DistillationObjective(teacher, student, {"embedding": 1, "hidden": 1, "attention": 1}, [1, 2])
    assert set(objective.trainable["projections"]) == {"embedding", "hidden"}
    loss, _ = objective(padded_batch())
    loss.backward()
    for name, parameter in objective.trainable["projections"].named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in teacher.parameters())
    assert "projections.embedding.weight" in objective.trainable.state_dict()


def test_objective_shared_projection_and_prediction_from_cached_logits():
    teacher = tiny_bert(seed=0)
    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32)
    objective = DistillationObjective(teacher, student, {"hidden": 1}, [1, 2], share_projection=True)
    assert list(objective.trainable["projections"]) == ["shared"]

    objective = DistillationObjective(teacher, tiny_bert(seed=1), {"prediction": 1}, [1, 2])
    batch = padded_batch()
    with torch.no_grad():
        live, _ = objective(batch)
        cached_logits = teacher(**batch).logits
        cached, _ = objective({**batch, "teacher_logits": cached_logits})
    assert cached.item() == pytest.approx(live.item(), rel=1e-6)


def test_masked_lm_objective_equals_the_models_own_loss():
    from transformers import BertForMaskedLM

    from distill.method.objective import MaskedLMObjective
    from tests.conftest import tiny_bert_config

    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_bert_config()).eval()
    batch = padded_batch()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 1], labels[1, 3], labels[2, 0] = 7, 9, 11
    loss, terms = MaskedLMObjective(model)({**batch, "labels": labels})
    expected = model(**batch, labels=labels).loss
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert set(terms) == {"mlm"}
    # A batch whose masking drew no token: the model's own loss is NaN; this one is 0 with no gradient.
    none = torch.full_like(labels, -100)
    assert torch.isnan(model(**batch, labels=none).loss)
    loss, _ = MaskedLMObjective(model)({**batch, "labels": none})
    assert loss.item() == 0.0
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


@pytest.mark.parametrize("consume_teacher", [False, True])
@pytest.mark.parametrize("shape, keep_shape", [((2, 3, 5, 5), (2, 1, 5, 5)), ((2, 5, 4), (2, 5, 1))])
def test_squared_error_sum_value_and_gradient_match_plain_autograd(shape, keep_shape, consume_teacher):
    torch.manual_seed(0)
    student = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(shape, dtype=torch.float64)
    keep = (torch.rand(keep_shape) > 0.3).double()
    reference = ((student - teacher) ** 2 * keep).sum()
    (expected,) = torch.autograd.grad(reference, student)
    loss = squared_error_sum(student, teacher.clone(), keep, consume_teacher=consume_teacher)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-12)
    (grad,) = torch.autograd.grad(loss, student)
    torch.testing.assert_close(grad, expected)
    assert bool((grad[(keep == 0).expand(shape)] == 0).all())  # excluded positions: exactly zero gradient
    # Its backward writes into the saved difference: a second backward through the same graph is refused, not wrong.
    loss = squared_error_sum(student, teacher.clone(), keep, consume_teacher=consume_teacher)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_each_error_says_whether_its_inputs_differ_even_when_the_sum_rounds_to_zero():
    """A difference below ~4e-23 squares to 0 in float32: the sum is 0 though student and teacher differ, which is
    what the trainer's check of a loss lost to rounding needs to see. Padded positions do not count as differing."""
    from distill.method.losses import attention_error, hidden_error, relation_error

    mask = torch.tensor([[1.0, 1.0, 0.0]])
    scores = torch.zeros(1, 2, 3, 3)
    tiny = scores.clone()
    tiny[0, 1, 0, 1] = 1e-25
    padded = scores.clone()
    padded[0, 0, 2, 2] = 5.0  # a padded pair
    for teacher, differ in ((scores.clone(), False), (tiny, True), (padded, False)):
        total, count, differs = attention_error(scores.clone(), teacher, mask)
        assert total.item() == 0.0 and count.item() == 2 * 4 and bool(differs) is differ
    states = torch.zeros(1, 3, 4)
    tiny_states = states.clone()
    tiny_states[0, 1, 2] = -1e-25
    padded_states = states.clone()
    padded_states[0, 2] = 7.0
    for teacher, differ in ((states.clone(), False), (tiny_states, True), (padded_states, False)):
        total, _, differs = hidden_error(states.clone(), teacher, mask)
        assert total.item() == 0.0 and bool(differs) is differ
    torch.manual_seed(0)
    student = torch.randn(1, 3, 4)
    total, _, differs = relation_error(student, student.clone(), mask, heads=2)
    assert total.item() == 0.0 and not differs
    total, _, differs = relation_error(student, torch.randn(1, 3, 8), mask, heads=2)
    assert total.item() > 0 and differs
    _, value = squared_error_sum(torch.zeros(3), torch.tensor([0.0, 1e-25, 0.0]), with_differ=True)
    assert bool(value) and squared_error_sum(torch.zeros(3), torch.tensor([0.0, 1e-25, 0.0])).item() == 0.0


def test_squared_error_sum_refuses_a_teacher_with_gradient():
    with pytest.raises(ValueError, match="detach"):
        squared_error_sum(torch.ones(2), torch.zeros(2, requires_grad=True))


def test_a_term_added_after_the_others_reads_the_teachers_true_outputs(monkeypatch):
    """The squared-error terms overwrite teacher buffers they read last; a term registered after them that declares
    the same reads must still see the teacher's real outputs, and nothing may read them once the terms are done."""
    from distill.method.terms import LOSS_TERMS, LossTerm, TermValue

    seen = {}

    def probe(objective, student, teacher, batch):
        for g in objective.layer_map:
            seen[("hidden_states", g)] = teacher.take("hidden_states", g)[0].clone()
            seen[("attentions", g)] = teacher.take("attentions", g)[0].clone()
        seen["outputs"] = teacher
        zero = student.hidden_states[0].sum() * 0
        return TermValue(zero, torch.tensor(False))

    reads = lambda layer_map: [(kind, g) for g in layer_map for kind in ("hidden_states", "attentions")]  # noqa: E731
    monkeypatch.setitem(LOSS_TERMS, "probe", LossTerm("probe", "intermediate", reads, True, probe, "test"))
    teacher = tiny_bert(seed=0)
    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32)
    objective = DistillationObjective(teacher, student, {"hidden": 1, "attention": 1, "probe": 1}, [1, 2])
    batch = padded_batch()
    objective(batch)
    from distill.method.capture import run_model

    with torch.no_grad():
        fresh = run_model(teacher, batch)
    for g in (1, 2):
        torch.testing.assert_close(seen[("hidden_states", g)], fresh.hidden_states[g])
        torch.testing.assert_close(seen[("attentions", g)], fresh.attentions[g - 1])
    with pytest.raises(RuntimeError, match="read after the loss terms"):
        seen["outputs"].take("hidden_states", 1)


def test_the_last_reader_consumes_and_an_undeclared_read_is_refused():
    from collections import Counter

    from distill.method.capture import ModelOutputs
    from distill.method.terms import TeacherOutputs

    hidden = tuple(torch.zeros(1, 2, 3) for _ in range(3))
    outputs = TeacherOutputs(ModelOutputs(None, hidden, (), torch.ones(1, 2)), None,
                             Counter({("hidden_states", 1): 2, ("hidden_states", 2): 1}))
    assert outputs.take("hidden_states", 1)[1] is False  # another reader follows
    assert outputs.take("hidden_states", 1)[1] is True  # the last one may overwrite it
    assert outputs.take("hidden_states", 2)[1] is True
    with pytest.raises(RuntimeError, match="not declared"):
        outputs.take("hidden_states", 0)


def test_loss_terms_come_from_one_registry():
    from distill.config import ConfigError, DistillConfig, GeneralConfig, PipelineConfig
    from distill.job.preflight import check_names
    from distill.method.objective import intermediate_terms
    from distill.method.terms import LOSS_TERMS, terms_of

    assert list(LOSS_TERMS) == ["embedding", "hidden", "attention", "relation", "prediction"]
    assert terms_of("intermediate") == ("embedding", "hidden", "attention", "relation")
    assert intermediate_terms({"attention": 0}) == {"embedding": 1.0, "hidden": 1.0}  # relation: off by default
    assert intermediate_terms({"relation": 2.0, "hidden": 0}) == {"embedding": 1.0, "attention": 1.0, "relation": 2.0}
    # the job checks the names against the registry (the config module imports nothing above it)
    with pytest.raises(ConfigError, match="distill.weights.attn: unknown loss term; use embedding, hidden, attention, "
                                          "relation, prediction"):
        check_names(PipelineConfig(distill=DistillConfig(weights={"attn": 1.0})))
    with pytest.raises(ConfigError, match="general.weights.prediction: unknown loss term; use embedding, hidden, "
                                          "attention, relation$"):
        check_names(PipelineConfig(general=GeneralConfig(weights={"prediction": 1.0})))
    with pytest.raises(ValueError, match="unknown loss terms"):
        DistillationObjective(tiny_bert(), tiny_bert(), {"attn": 1.0}, [1, 2])


def test_relation_loss_against_kl_div_by_hand_and_padding_free():
    from torch.nn import functional as F

    from distill.method.losses import relation_loss

    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 8), torch.randn(2, 5, 12)  # widths differ; 4 relation heads of 2 and 3 dims
    mask = torch.ones(2, 5)
    assert relation_loss(teacher, teacher.clone(), mask, 4).item() == pytest.approx(0.0, abs=1e-6)

    def relations(x, heads):
        b, t, h = x.shape
        x = x.view(b, t, heads, h // heads).transpose(1, 2)
        return torch.softmax(x @ x.transpose(-1, -2) / (h // heads) ** 0.5, dim=-1)

    expected = F.kl_div(relations(student, 4).log(), relations(teacher, 4), reduction="sum") / (2 * 4 * 5)
    assert relation_loss(student, teacher, mask, 4).item() == pytest.approx(expected.item(), rel=1e-5)
    # Two padding positions holding anything: same loss as the unpadded batch.
    padded_s = torch.cat([student, 50 * torch.randn(2, 2, 8)], dim=1)
    padded_t = torch.cat([teacher, 50 * torch.randn(2, 2, 12)], dim=1)
    padded = relation_loss(padded_s, padded_t, torch.cat([mask, torch.zeros(2, 2)], dim=1), 4)
    assert padded.item() == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="relation heads 5 do not divide"):
        relation_loss(student, teacher, mask, 5)


def test_the_relation_term_needs_no_projection_nor_equal_heads_and_trains_the_last_layer():
    teacher = tiny_bert(seed=0)  # width 32, 4 heads
    student = tiny_bert(seed=1, hidden_size=16, intermediate_size=32, num_attention_heads=2).train()
    objective = DistillationObjective(teacher, student, {"relation": 1.0}, [1, 2], relation_heads=4)
    assert len(objective.trainable["projections"]) == 0  # no learnt projection: relations compare T x T maps
    loss, terms = objective(padded_batch())
    assert set(terms) == {"relation"} and loss.item() > 0
    loss.backward()
    last = student.bert.encoder.layer[-1].attention.self
    for name in ("query", "key", "value"):
        assert getattr(last, name).weight.grad.abs().sum() > 0, name
    assert bool(objective.inputs_differ["relation"])


def test_the_normalized_hidden_loss_does_not_let_a_constant_match_a_layer_that_barely_varies():
    """A sentence-embedding teacher's last layer can be nearly the same vector for every token: its MSE is small for a
    student that outputs that constant; normalized by the teacher's variation, the constant scores 1 (it explains
    none of it) and a student that follows the variation scores near 0."""
    from distill.method.losses import hidden_error, teacher_variation

    torch.manual_seed(0)
    mask = torch.ones(4, 6)
    common = torch.randn(8) * 3
    teacher = common + 0.01 * torch.randn(4, 6, 8)  # every token almost the same vector
    constant = common.expand(4, 6, 8).clone()
    follower = teacher + 0.001 * torch.randn(4, 6, 8)
    mean = teacher.reshape(-1, 8).mean(0).expand(4, 6, 8)
    mse = lambda student: (hidden_error(student, teacher, mask)[0] / (24 * 8)).item()  # noqa: E731
    normalized = lambda student: (hidden_error(student, teacher, mask)[0] / teacher_variation(teacher, mask)).item()  # noqa: E731
    assert mse(constant) < 2e-4  # the plain loss barely tells the constant from the follower ...
    assert normalized(mean) == pytest.approx(1.0, rel=1e-4)  # ... the normalized one does
    assert normalized(follower) < 0.02 < 0.9 < normalized(constant)
    # Through the objective: the option reaches the hidden and embedding terms.
    teacher_model, student_model = tiny_bert(seed=0), tiny_bert(seed=1)
    plain = DistillationObjective(teacher_model, student_model, {"hidden": 1}, [1, 2])
    scaled = DistillationObjective(teacher_model, student_model, {"hidden": 1}, [1, 2], hidden_loss="normalized")
    with torch.no_grad():
        assert plain(padded_batch())[0].item() != pytest.approx(scaled(padded_batch())[0].item(), rel=1e-3)
