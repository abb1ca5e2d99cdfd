"""Attention-score capture through the transformers attention interface."""

import torch

from distill.capture import enable_score_capture, run_model
from tests.conftest import padded_batch, tiny_bert, tiny_roberta


def test_logits_equal_eager_exactly_with_padding():
    model = tiny_bert()
    batch = padded_batch()
    model.set_attn_implementation("eager")
    eager = model(**batch, output_attentions=True)
    enable_score_capture(model)
    captured = run_model(model, batch)
    assert torch.equal(captured.logits, eager.logits)
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
    assert torch.equal(captured.logits, eager)
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
