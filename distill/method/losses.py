"""TinyBERT's distillation losses as pure functions of tensors (Jiao et al., 2020, §3.1, Eq. 7-10).

Shapes: B batch, T tokens, A heads, h_S / h_T student / teacher hidden sizes, C classes.

Departures from the reference code, on purpose:
- Padding is excluded. The reference code zeroes masked scores with a −1e2 threshold and averages over all T×T pairs,
  so its loss depends on how much padding a batch has. Here the attention loss averages over valid (query, key) pairs
  and the hidden loss over valid tokens, so padding a batch further does not change either.
- The prediction loss is averaged over the batch only (the reference code also divides by the number of classes).

Numerics: every sum, mean and count is accumulated in float32 whatever the inputs' dtype (fp16 or bf16 under
autocast), so mixed precision changes a loss by rounding only: in fp16, Σ of squared attention-score differences
over one batch, and the count of valid (query, key) pairs (6.3M at batch 32, length 128, 12 heads), are infinite.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype loss sums are accumulated in: float32 for half inputs (float16, bfloat16), float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


class _SquaredErrorSum(torch.autograd.Function):
    """Σ keep · (student − teacher)² in float32, keeping one tensor for backward (see :func:`squared_error_sum`)."""

    @staticmethod
    def forward(ctx, student, teacher, keep, consume_teacher):
        dtype = accumulation_dtype(student.dtype)
        # Autocast off: under fp16 autocast the difference, its squares and their sum would be rounded to fp16, whose
        # largest value (65504) a sum over (B, A, T, T) scores passes at once.
        with torch.autocast(student.device.type, enabled=False):
            if consume_teacher:  # the teacher's buffer (already in the accumulation dtype) takes teacher − student
                difference = teacher.sub_(student)
                ctx.sign = -2.0
            else:
                difference = torch.sub(student, teacher) if student.dtype == dtype else student.to(dtype).sub_(teacher)
                ctx.sign = 2.0
            if keep is not None:
                difference.mul_(keep)  # a 0/1 mask: excluded positions contribute 0 and get gradient 0
            # Whether any kept pair differs, read before squaring: a float32 difference of two distinct values is
            # never 0, but differences below ~4e-23 square to 0, so a total of 0 alone cannot tell "equal" apart.
            differ = difference.ne(0).any()
            flat = difference.reshape(-1)
            total = torch.dot(flat, flat)
        ctx.save_for_backward(difference)
        ctx.mark_non_differentiable(differ)
        ctx.student_dtype = student.dtype
        return total, differ

    @staticmethod
    def backward(ctx, grad, _differ_grad):
        (difference,) = ctx.saved_tensors
        # In place: the difference is not needed again (a second backward through the same graph is refused by
        # autograd's version check on saved tensors).
        return difference.mul_(ctx.sign * grad).to(ctx.student_dtype), None, None, None


def squared_error_sum(
    student: torch.Tensor, teacher: torch.Tensor, keep: torch.Tensor | None = None, *, consume_teacher: bool = False,
    with_differ: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Σ over kept positions of (student − teacher)², accumulated in float32, with its gradient.

    The same value and gradient as ``((student.float() - teacher.float()) ** 2 * keep).sum()``, in one subtraction,
    one masking pass and one dot product forward, one in-place multiplication backward, and one saved tensor: the
    attention loss runs it over (B, A, T, T) tensors at every mapped layer, where each pass and each new buffer costs
    (bench/distill_throughput.py).

    Half-precision inputs (fp16 or bf16, e.g. under autocast) are subtracted, squared and summed in float32 with
    autocast off: in fp16 a single squared difference above 256 or a sum above 65504 is infinite, and a sum over
    one batch of attention scores passes that at once. The gradient is returned in the student's dtype.

    Args:
        student: any shape, any floating dtype; the gradient flows to it.
        teacher: the student's shape (or broadcastable to it); it gets no gradient.
        keep: 0/1 values (bool or float) broadcastable to that shape (1 keeps a position), or None to keep all.
            Values at excluded positions must be finite (0 · inf is nan).
        consume_teacher: write the difference into ``teacher``'s memory instead of a new buffer (its values are lost:
            for a teacher output read by nothing else). Ignored unless the teacher has the student's shape and is
            already in the accumulation dtype.
        with_differ: also return whether any kept position differs (for the trainer's check of a loss lost to
            rounding: a sum of 0 while they differ).

    Returns:
        Scalar in float32 (float64 for float64 inputs); with ``with_differ``, (that scalar, scalar bool tensor).

    Raises:
        ValueError: ``teacher`` requires a gradient (the target of a distillation loss is constant).
    """
    if teacher.requires_grad:
        raise ValueError("squared_error_sum: the teacher's tensor requires a gradient; pass teacher.detach()")
    consume_teacher = (consume_teacher and teacher.dtype == accumulation_dtype(student.dtype)
                       and teacher.shape == student.shape)
    total, differ = _SquaredErrorSum.apply(student, teacher, keep, consume_teacher)
    return (total, differ) if with_differ else total


def match_heads(teacher_scores: torch.Tensor, num_student_heads: int) -> torch.Tensor:
    """Reduce teacher attention heads to the student's head count.

    Rule (ours; the paper assumes equal counts): when the teacher has A_T = k·A_S heads, teacher heads are averaged
    in consecutive groups of k (heads [0..k-1] → student head 0, ...). Equal counts are returned unchanged.

    Args:
        teacher_scores: (B, A_T, T, T).
        num_student_heads: A_S.

    Returns:
        (B, A_S, T, T).

    Raises:
        ValueError: A_T is not a multiple of A_S.
    """
    batch, num_teacher_heads, queries, keys = teacher_scores.shape
    if num_teacher_heads == num_student_heads:
        return teacher_scores
    if num_teacher_heads % num_student_heads:
        raise ValueError(
            f"teacher has {num_teacher_heads} attention heads and student {num_student_heads}: the attention loss "
            "needs the teacher's count to be a multiple of the student's; change student.num_attention_heads"
        )
    group = num_teacher_heads // num_student_heads
    return teacher_scores.view(batch, num_student_heads, group, queries, keys).mean(dim=2)


def attention_error(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    consume_teacher: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sum and the count of :func:`attention_loss`: (Σ squared differences, A · number of valid pairs), and
    whether any valid pair's scores differ (scalar bool; see :func:`squared_error_sum`).

    Both are float32 (the count is exact up to 2^24 ≈ 16.8M pairs · heads per batch, and rounds by at most one part
    in 2^24 beyond): in fp16 the count alone overflows at batch 32, length 128, 12 heads (6.3M).
    """
    teacher_scores = match_heads(teacher_scores, student_scores.shape[1])
    heads = student_scores.shape[1]
    lengths = attention_mask.sum(dim=1, dtype=torch.int64)  # (B,) real tokens per example
    count = (lengths * lengths).sum().to(torch.float32) * heads  # valid (query, key) pairs per head, times heads
    if bool((lengths == attention_mask.shape[1]).all()):  # no padding: no masking pass
        total, differ = squared_error_sum(student_scores, teacher_scores, consume_teacher=consume_teacher,
                                          with_differ=True)
        return total, count, differ
    valid = attention_mask.bool()
    pair_mask = valid[:, None, :, None] & valid[:, None, None, :]  # (B, 1, T, T), True where both tokens are real
    total, differ = squared_error_sum(student_scores, teacher_scores, pair_mask, consume_teacher=consume_teacher,
                                      with_differ=True)
    return total, count, differ


def attention_loss(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    consume_teacher: bool = False,
) -> torch.Tensor:
    """L_attn for one layer pair: mean over heads of the MSE of pre-softmax scores (TinyBERT Eq. 7).

    Args:
        student_scores: (B, A, T, T) pre-softmax scores QKᵀ/√d of a student layer, any floating dtype.
        teacher_scores: (B, A_T, T, T) of the mapped teacher layer (A_T a multiple of A, see :func:`match_heads`).
        attention_mask: (B, T), 1 for real tokens, 0 for padding.
        consume_teacher: the teacher's scores may be overwritten (see :func:`squared_error_sum`).

    Returns:
        Scalar, float32: Σ over heads and valid (query, key) pairs of squared differences / (A · number of valid
        pairs). Sums and counts are float32 whatever the inputs' dtype.
    """
    total, count, _ = attention_error(student_scores, teacher_scores, attention_mask, consume_teacher=consume_teacher)
    return total / count.clamp(min=1)


def hidden_error(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    projection: nn.Module | None = None,
    *,
    consume_teacher: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sum and the count of :func:`hidden_loss`: (Σ squared differences, real tokens · h_T), both float32, and
    whether any real token's states differ (scalar bool; see :func:`squared_error_sum`)."""
    if projection is not None:
        student_hidden = projection(student_hidden)
    if student_hidden.shape[-1] != teacher_hidden.shape[-1]:
        raise ValueError(
            f"student hidden size {student_hidden.shape[-1]} differs from the teacher's {teacher_hidden.shape[-1]} "
            "and no projection was given"
        )
    count = attention_mask.sum(dtype=torch.int64).to(torch.float32) * student_hidden.shape[-1]
    valid = attention_mask.bool()[..., None]  # (B, T, 1)
    total, differ = squared_error_sum(student_hidden, teacher_hidden, valid, consume_teacher=consume_teacher,
                                      with_differ=True)
    return total, count, differ


def teacher_variation(teacher_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Σ over real tokens of ‖h_T − μ‖², μ the mean teacher state over the batch's real tokens: how much the teacher's
    states vary, the denominator of the normalized hidden loss. Float32 scalar.

    Args:
        teacher_hidden: (B, T, h_T).
        attention_mask: (B, T), 1 for real tokens.
    """
    with torch.autocast(teacher_hidden.device.type, enabled=False):
        valid = attention_mask.bool()
        states = teacher_hidden[valid].float()  # (real tokens, h_T)
        return ((states - states.mean(dim=0)) ** 2).sum()


def hidden_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    projection: nn.Module | None = None,
    *,
    consume_teacher: bool = False,
) -> torch.Tensor:
    """L_hidn / L_embd for one layer pair: MSE(h_S W, h_T) over real tokens (TinyBERT Eq. 8, 9).

    Args:
        student_hidden: (B, T, h_S), any floating dtype.
        teacher_hidden: (B, T, h_T).
        attention_mask: (B, T), 1 for real tokens.
        projection: learnable map h_S → h_T (W); None when h_S == h_T.
        consume_teacher: the teacher's hidden states may be overwritten (see :func:`squared_error_sum`).

    Returns:
        Scalar, float32: Σ over real tokens and h_T dims of squared differences / (number of real tokens · h_T).

    Raises:
        ValueError: the sizes differ and no projection was given.
    """
    total, count, _ = hidden_error(student_hidden, teacher_hidden, attention_mask, projection,
                                   consume_teacher=consume_teacher)
    return total / count.clamp(min=1)


def _log_relations(states: torch.Tensor, heads: int, keep_keys: torch.Tensor) -> torch.Tensor:
    """log softmax(X_r X_rᵀ / √d_r) of (B, T, H) states split into ``heads`` relation heads: (B, heads, T, T),
    float32, padded keys excluded."""
    batch, tokens, width = states.shape
    split = states.float().view(batch, tokens, heads, width // heads).transpose(1, 2)  # (B, A_r, T, d_r)
    products = torch.matmul(split, split.transpose(-1, -2)) * (width // heads) ** -0.5
    products = products.masked_fill(~keep_keys, torch.finfo(torch.float32).min)
    return torch.log_softmax(products, dim=-1)


def relation_error(
    student_states: torch.Tensor, teacher_states: torch.Tensor, attention_mask: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Σ over relation heads and real queries of KL(R_T ‖ R_S), and their count (MiniLMv2, Wang et al., 2021, Eq. 3-5).

    R = softmax(X_r X_rᵀ / √d_r) relates every token to every other through one of the query, key or value
    projections X (B, T, H) split into ``heads`` relation heads of H / heads dims each. Student and teacher need the
    same number of relation heads, not the same width or attention heads, and no projection is learnt. Padded keys
    are masked out of the softmax and padded queries out of the sum (our choice; MiniLMv2 does not say).

    Args:
        student_states: (B, T, H_S), any floating dtype; computed in float32.
        teacher_states: (B, T, H_T).
        attention_mask: (B, T), 1 for real tokens.
        heads: A_r; must divide H_S and H_T.

    Returns:
        (Σ KL, A_r · number of real queries), both float32 scalars, and whether the two log-relations differ at any
        real (query, key) pair (scalar bool: a KL of 0 while they differ was lost to rounding).

    Raises:
        ValueError: ``heads`` does not divide a width.
    """
    for name, states in (("student", student_states), ("teacher", teacher_states)):
        if states.shape[-1] % heads:
            raise ValueError(f"relation heads {heads} do not divide the {name}'s width {states.shape[-1]}; choose "
                             "distill.relation_heads to divide both widths")
    with torch.autocast(student_states.device.type, enabled=False):
        valid = attention_mask.bool()
        keep_keys = valid[:, None, None, :]
        student = _log_relations(student_states, heads, keep_keys)
        teacher = _log_relations(teacher_states, heads, keep_keys)
        kl = (teacher.exp() * (teacher - student)).sum(dim=-1)  # (B, A_r, T): KL per query
        total = (kl * valid[:, None, :]).sum()
        count = valid.sum(dtype=torch.int64).to(torch.float32) * heads
        differ = ((teacher != student) & keep_keys & valid[:, None, :, None]).any()
    return total, count, differ


def relation_loss(
    student_states: torch.Tensor, teacher_states: torch.Tensor, attention_mask: torch.Tensor, heads: int
) -> torch.Tensor:
    """Mean KL between teacher and student self-attention relations of one projection (MiniLMv2); see
    :func:`relation_error`. Scalar, float32."""
    total, count, _ = relation_error(student_states, teacher_states, attention_mask, heads)
    return total / count.clamp(min=1)


def soft_cross_entropy(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """L_pred: −softmax(z_T / t) · log_softmax(z_S / t), averaged over the batch (TinyBERT Eq. 10).

    Args:
        student_logits, teacher_logits: (B, C).
        temperature: t > 0.

    Returns:
        Scalar, in nats.
    """
    targets = F.softmax(teacher_logits.float() / temperature, dim=-1)
    log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return -(targets * log_probs).sum(dim=-1).mean()


def prediction_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    temperature_squared: bool = False,
    labels: torch.Tensor | None = None,
    hard_label_weight: float = 0.0,
) -> torch.Tensor:
    """The prediction-step loss on class logits: soft cross-entropy to the teacher's (TinyBERT Eq. 10) plus an
    optional cross-entropy to the gold labels.

    Args:
        student_logits, teacher_logits: (B, C).
        temperature: t of :func:`soft_cross_entropy`.
        temperature_squared: multiply the soft term by t² (Hinton et al., 2015), keeping gradient scale across t.
        labels: (B,) gold class ids, needed when ``hard_label_weight`` > 0.
        hard_label_weight: weight of the cross-entropy to the gold labels.

    Returns:
        Scalar, float32.

    Raises:
        ValueError: ``hard_label_weight`` > 0 without ``labels``.
    """
    loss = soft_cross_entropy(student_logits, teacher_logits, temperature)
    if temperature_squared:
        loss = loss * temperature**2
    if hard_label_weight > 0:
        if labels is None:
            raise ValueError("hard_label_weight > 0 needs gold labels in the batch")
        loss = loss + hard_label_weight * F.cross_entropy(student_logits.float(), labels)
    return loss


def score_loss(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    labels: torch.Tensor | None = None,
    hard_label_weight: float = 0.0,
) -> torch.Tensor:
    """The prediction-step loss on one real-valued output: MSE to the teacher's score (no temperature), plus an
    optional MSE to the gold scores.

    Args:
        student_scores, teacher_scores: (B, 1) or (B,).
        labels: (B,) gold scores, needed when ``hard_label_weight`` > 0.
        hard_label_weight: weight of the MSE to the gold scores.

    Returns:
        Scalar, float32.

    Raises:
        ValueError: ``hard_label_weight`` > 0 without ``labels``.
    """
    student = student_scores.float().reshape(len(student_scores))
    loss = F.mse_loss(student, teacher_scores.float().reshape(len(teacher_scores)))
    if hard_label_weight > 0:
        if labels is None:
            raise ValueError("hard_label_weight > 0 needs gold labels in the batch")
        loss = loss + hard_label_weight * F.mse_loss(student, labels.float())
    return loss
