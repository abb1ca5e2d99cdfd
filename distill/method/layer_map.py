"""Layer maps g: student layer m ↔ teacher layer g(m) (TinyBERT, Jiao et al., 2020, §3.1 "Problem Formulation").

Layer 0 is the embedding output on both sides (g(0) = 0); layers 1..M of the student map to teacher layers in 1..N.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def build_layer_map(spec: str | list[int], num_teacher_layers: int, num_student_layers: int) -> list[int]:
    """Teacher layer for each student layer 1..M.

    Args:
        spec: "uniform" (g(m) = round(m·N/M), TinyBERT's choice: 4-of-12 → [3, 6, 9, 12]), "last" (g(m) = N−M+m),
            "first" (g(m) = m), or an explicit list [g(1), ..., g(M)].
        num_teacher_layers: N.
        num_student_layers: M.

    Returns:
        [g(1), ..., g(M)], each in 1..N. (g(0) = 0 is implied.)

    Raises:
        ValueError: M > N, an unknown spec, or an explicit list of the wrong length or with out-of-range layers.
    """
    n, m = num_teacher_layers, num_student_layers
    if m < 1 or n < 1:
        raise ValueError(f"layer counts must be positive, got teacher {n}, student {m}")
    if isinstance(spec, (list, tuple)):
        layers = [int(x) for x in spec]
        if len(layers) != m:
            raise ValueError(f"explicit layer_map has {len(layers)} entries but the student has {m} layers")
        bad = [x for x in layers if not 1 <= x <= n]
        if bad:
            raise ValueError(f"layer_map entries {bad} are outside the teacher's layers 1..{n}")
        logger.info("layer map (explicit, %d-of-%d): student 0..%d -> teacher %s", m, n, m, [0, *layers])
        return layers
    if m > n:
        raise ValueError(
            f"the student has {m} layers and the teacher {n}: a student deeper than its teacher cannot be mapped; "
            "give an explicit layer_map or a shallower student"
        )
    if spec == "uniform":
        # Half-up rounding (not Python's banker's rounding) keeps the map strictly increasing.
        layers = [int(k * n / m + 0.5) for k in range(1, m + 1)]
    elif spec == "last":
        layers = [n - m + k for k in range(1, m + 1)]
    elif spec == "first":
        layers = list(range(1, m + 1))
    else:
        raise ValueError(f"unknown layer_map {spec!r}; use uniform, last, first or a list of teacher layers")
    logger.info("layer map (%s, %d-of-%d): student 0..%d -> teacher %s", spec, m, n, m, [0, *layers])
    return layers
