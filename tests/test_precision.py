"""Mixed precision cannot silently break the losses: sums, means and counts accumulate in float32.

Sizes are those of real runs (batch 32, length 128, 12 heads, padding), where fp16 sums and counts overflow 65504:
an fp16 sum of squared score differences, or the count of valid (query, key) pairs (up to 32 · 128² · 12 = 6.3M), is
infinite there. Half-precision tensors and CPU autocast both run on the CPU, so these tests need no GPU.
"""

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from distill.method.losses import attention_loss, hidden_loss, squared_error_sum
from distill.method.objective import DistillationObjective

B, A, T = 32, 12, 128
HALF = [torch.float16, torch.bfloat16]


def _ragged_mask(batch: int = B, length: int = T, seed: int = 0) -> torch.Tensor:
    """(B, T) with between 16 and T real tokens per row, the rest padding; one row unpadded."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, length + 1, (batch,), generator=generator)
    lengths[0] = length
    return (torch.arange(length)[None, :] < lengths[:, None]).long()


@pytest.mark.parametrize("dtype", HALF)
def test_attention_loss_in_half_precision_matches_fp32(dtype):
    torch.manual_seed(0)
    mask = _ragged_mask()
    student, teacher = torch.randn(B, A, T, T) * 4, torch.randn(B, A, T, T) * 4  # scores of a real model's range
    reference = attention_loss(student, teacher, mask)
    half = attention_loss(student.to(dtype), teacher.to(dtype), mask)
    assert half.dtype == torch.float32 and torch.isfinite(half)
    # Accumulated in float32: the same value as fp32 arithmetic on the rounded inputs ...
    rounded = attention_loss(student.to(dtype).float(), teacher.to(dtype).float(), mask)
    assert half.item() == pytest.approx(rounded.item(), rel=1e-5)
    # ... and within the inputs' rounding of the full-precision loss (fp16: 2^-11 relative, bf16: 2^-8).
    assert half.item() == pytest.approx(reference.item(), rel=1e-2)
    assert reference.item() == pytest.approx(32.0, rel=0.01)  # E[(s - t)^2] = 2 · 16: not a degenerate case


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("student_width, teacher_width", [(312, 768), (384, 384)])
def test_hidden_loss_in_half_precision_matches_fp32(dtype, student_width, teacher_width):
    torch.manual_seed(0)
    mask = _ragged_mask()
    student, teacher = torch.randn(B, T, student_width), torch.randn(B, T, teacher_width)
    projection = torch.nn.Linear(student_width, teacher_width) if student_width != teacher_width else None
    reference = hidden_loss(student, teacher, mask, projection)
    with torch.autocast("cpu", dtype=dtype):  # the projection runs in half precision, as it does in training
        half = hidden_loss(student, teacher.to(dtype), mask, projection)
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(reference.item(), rel=1e-2)


@pytest.mark.parametrize("dtype", HALF)
def test_squared_error_gradient_in_half_precision(dtype):
    """The gradient is the float32 gradient of the rounded inputs, returned in the student's dtype."""
    torch.manual_seed(0)
    keep = _ragged_mask()[:, None, :, None].bool() & _ragged_mask()[:, None, None, :].bool()
    student = (torch.randn(B, A, T, T) * 4).to(dtype).requires_grad_()
    teacher = (torch.randn(B, A, T, T) * 4).to(dtype)
    squared_error_sum(student, teacher, keep).backward()
    assert student.grad.dtype == dtype
    expected = 2 * (student.detach().float() - teacher.float()) * keep
    torch.testing.assert_close(student.grad.float(), expected.to(dtype).float())


def _encoder(hidden: int, intermediate: int, seed: int) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=A,
                        intermediate_size=intermediate, max_position_embeddings=T, num_labels=2)
    return BertForSequenceClassification(config).eval()


def _terms(objective: DistillationObjective, batch: dict, dtype: torch.dtype | None) -> tuple[dict, float]:
    """Each term's value and the norm of the gradient reaching the student's query weights."""
    objective.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss, terms = objective(batch)
    loss.backward()
    query = objective.trainable["student"].bert.encoder.layer[0].attention.self.query.weight
    return {name: value.item() for name, value in terms.items()}, query.grad.norm().item()


@pytest.mark.slow
@pytest.mark.parametrize("student_width, teacher_width", [(312, 768), (384, 384)])
def test_distillation_terms_under_autocast_match_fp32(student_width, teacher_width):
    """The whole intermediate step's loss at real sizes (batch 32, length 128, 12 heads, padded batch) under CPU
    autocast in fp16 and bf16: every term within 2% of fp32, and the gradient reaching the student's query weights
    within 5% (fp16 sums made the attention term 0.0 and shrank that gradient 20-fold; NaN at these widths)."""
    teacher = _encoder(teacher_width, 4 * teacher_width, seed=0)
    student = _encoder(student_width, 4 * student_width, seed=1).train()
    for module in student.modules():  # dropout off: the runs must differ by precision only
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    objective = DistillationObjective(teacher, student, {"embedding": 1, "hidden": 1, "attention": 1}, [1])
    mask = _ragged_mask()
    ids = torch.randint(5, 1000, (B, T), generator=torch.Generator().manual_seed(1)) * mask
    batch = {"input_ids": ids, "attention_mask": mask}
    reference, reference_grad = _terms(objective, batch, None)
    assert all(value > 0.01 for value in reference.values()), reference
    for dtype in HALF:
        terms, grad = _terms(objective, batch, dtype)
        for name, value in reference.items():
            assert terms[name] == pytest.approx(value, rel=2e-2), (dtype, name)
        assert grad == pytest.approx(reference_grad, rel=5e-2), dtype
