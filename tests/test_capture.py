"""Attention-score capture through the transformers attention interface."""

import torch

import pytest

from distill.method.capture import ScoresAttention, enable_score_capture, run_model
from tests.conftest import padded_batch, tiny_bert, tiny_roberta


def test_logits_equal_eager_with_padding():
    model = tiny_bert()
    batch = padded_batch()
    model.set_attn_implementation("eager")
    eager = model(**batch, output_attentions=True)
    enable_score_capture(model)
    captured = run_model(model, batch)
    torch.testing.assert_close(captured.logits, eager.logits, rtol=0, atol=1e-6)
    assert len(captured.hidden_states) == 3 and len(captured.attentions) == 2
    assert captured.attentions[0].shape == (3, 4, 7, 7)


def test_scores_are_qk_over_sqrt_d_from_the_model_weights_and_softmax_to_hf_probabilities():
    model = tiny_bert()
    batch = padded_batch()
    model.set_attn_implementation("eager")
    probabilities = model(**batch, output_attentions=True).attentions
    enable_score_capture(model)
    captured = run_model(model, batch)
    for layer in range(2):
        attention = model.bert.encoder.layer[layer].attention.self
        hidden = captured.hidden_states[layer]  # input of this layer

        def heads(x):
            return x.view(3, 7, 4, 8).transpose(1, 2)

        expected = heads(attention.query(hidden)) @ heads(attention.key(hidden)).transpose(-1, -2) / 8**0.5
        torch.testing.assert_close(captured.attentions[layer], expected, rtol=1e-5, atol=1e-6)
        additive = (1 - batch["attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
        torch.testing.assert_close(torch.softmax(captured.attentions[layer] + additive, -1), probabilities[layer])


def test_roberta_capture_matches_eager():
    model = tiny_roberta()
    batch = padded_batch(vocab=60)
    batch["input_ids"][batch["attention_mask"] == 0] = 1  # RoBERTa's pad id
    model.set_attn_implementation("eager")
    eager = model(**batch).logits
    enable_score_capture(model)
    captured = run_model(model, {**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])})
    torch.testing.assert_close(captured.logits, eager, rtol=0, atol=1e-6)
    assert len(captured.attentions) == 2


def test_saved_model_does_not_keep_the_capture_attention(tmp_path):
    model = enable_score_capture(tiny_bert())
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForSequenceClassification

    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert reloaded.config._attn_implementation != "tinydistill_scores"
    batch = padded_batch()
    torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)


def test_capture_of_chosen_layers_only_keeps_layer_positions():
    full = enable_score_capture(tiny_bert(num_hidden_layers=3))
    partial = enable_score_capture(tiny_bert(num_hidden_layers=3), layers=[1])  # layers 0 and 2 run SDPA
    batch = padded_batch()
    expected, got = run_model(full, batch), run_model(partial, batch)
    assert got.attentions[0] is None and got.attentions[2] is None and got.attentions[1].shape == (3, 4, 7, 7)
    # Layer 1's input came from SDPA in layer 0: equal to eager up to float rounding.
    torch.testing.assert_close(got.attentions[1], expected.attentions[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-6)
    assert len(got.hidden_states) == 4


def test_fused_capture_for_a_frozen_teacher_gives_the_same_scores():
    eager = enable_score_capture(tiny_bert())
    fused = enable_score_capture(tiny_bert(), fused=True)
    batch = padded_batch()
    with torch.no_grad():
        expected, got = run_model(eager, batch), run_model(fused, batch)
    for layer in range(2):
        torch.testing.assert_close(got.attentions[layer], expected.attentions[layer], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-6)


def plain_attention(query, key, value, mask, scaling, keep=None, dropout=0.0):
    """The same maths through generic autograd: the reference for ScoresAttention's hand-written backward."""
    scores = query @ key.transpose(2, 3) * scaling
    probs = torch.softmax(scores + mask, dim=-1)
    if keep is not None:
        probs = probs * keep / (1 - dropout)
    return probs @ value, scores


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_scores_attention_backward_equals_autograd_for_both_outputs(dropout):
    torch.manual_seed(0)
    shape = (2, 3, 5, 4)  # (B, A, T, d)
    query, key, value = (torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    mask[1, ..., 3:] = torch.finfo(torch.float64).min  # the second example has two padding keys
    grad_output, grad_scores = torch.randn(shape, dtype=torch.float64), torch.randn(2, 3, 5, 5, dtype=torch.float64)

    torch.manual_seed(1)
    output, scores = ScoresAttention.apply(query, key, value, mask, 0.5, dropout)
    got = torch.autograd.grad((output, scores), (query, key, value), (grad_output, grad_scores))
    keep = None
    if dropout:  # the same draw the function made
        torch.manual_seed(1)
        keep = torch.rand(2, 3, 5, 5, dtype=torch.float32) < 1 - dropout
        assert 0 < int(keep.sum()) < keep.numel()
    ref_output, ref_scores = plain_attention(query, key, value, mask, 0.5, keep, dropout)
    expected = torch.autograd.grad((ref_output, ref_scores), (query, key, value), (grad_output, grad_scores))
    torch.testing.assert_close(output, ref_output)
    torch.testing.assert_close(scores, ref_scores)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    # Only one of the two outputs used: the other gradient is None, and the backward still matches.
    (only_scores,) = torch.autograd.grad(ScoresAttention.apply(query, key, value, mask, 0.5, 0.0)[1].sum(), (query,))
    (ref_only,) = torch.autograd.grad(plain_attention(query, key, value, mask, 0.5)[1].sum(), (query,))
    torch.testing.assert_close(only_scores, ref_only)


def test_student_gradients_with_capture_equal_eager_autograd():
    """Through a whole model, the captured student gets the gradients `transformers`' eager attention gives."""
    torch.manual_seed(0)
    reference = tiny_bert().eval()  # eval: no dropout, so both runs are deterministic
    reference.set_attn_implementation("eager")
    captured = tiny_bert().eval()
    captured.load_state_dict(reference.state_dict())
    enable_score_capture(captured)
    batch = padded_batch()
    ref_out = reference(**batch, output_hidden_states=True)
    run = run_model(captured, batch)  # logits and hidden states: every attention parameter reaches them
    (ref_out.logits.square().sum() + ref_out.hidden_states[-1].sum()).backward()
    (run.logits.square().sum() + run.hidden_states[-1].sum()).backward()
    for (name, p), (_, q) in zip(reference.named_parameters(), captured.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", ["albert", "distilbert"])
def test_query_key_value_are_captured_in_families_whose_attention_has_no_layer_index(family):
    """The MiniLMv2 relation term reads each mapped layer's query, key and value. ALBERT's one shared attention
    module and DistilBERT's carry no layer index; the projections must still be those the layer computed, in layer
    order (checked against forward hooks on the projection layers themselves)."""
    from transformers import AlbertConfig, AlbertModel, DistilBertConfig, DistilBertModel

    from distill.method.capture import enable_score_capture, run_model

    torch.manual_seed(0)
    if family == "albert":
        model = AlbertModel(AlbertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                         intermediate_size=64, embedding_size=16)).eval()
        layers = [model.encoder.albert_layer_groups[0].albert_layers[0].attention] * 3
        names = ("query", "key", "value")
    else:
        model = DistilBertModel(DistilBertConfig(vocab_size=60, dim=32, n_layers=3, n_heads=4, hidden_dim=64)).eval()
        layers = [block.attention for block in model.transformer.layer]
        names = ("q_lin", "k_lin", "v_lin")
    seen = []
    handles = [getattr(module, name).register_forward_hook(lambda m, i, out: seen.append(out.detach()))
               for module in dict.fromkeys(layers) for name in names]
    enable_score_capture(model, qkv_layers=[0, 2])
    batch = {"input_ids": torch.randint(5, 60, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    qkv = run_model(model, batch).qkv
    for handle in handles:
        handle.remove()
    assert sorted(qkv) == [0, 2]
    for layer in (0, 2):  # the hooks saw q, k, v of layer 0, then of layer 1, then of layer 2
        for position in range(3):
            torch.testing.assert_close(qkv[layer][position], seen[3 * layer + position])
