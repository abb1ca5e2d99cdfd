"""Reading answers from a QA head's start and end logits: the best valid span of each feature, the best feature of
each question (as Hugging Face's ``utils_qa.py`` post-processes ``run_qa.py``'s outputs). A leaf: numpy and the
standard library only.

Shapes: T_i word pieces of feature i; logits (T_i, 2), start and end.
"""

from __future__ import annotations

import numpy as np

N_BEST = 20  # starts and ends considered per feature (run_qa.py's default)
MAX_ANSWER_LENGTH = 30  # word pieces (run_qa.py's default)
NO_SPAN = (-1, -1)  # the character span of a piece outside the context


def best_span(logits: np.ndarray, offsets: list, n_best: int = N_BEST, max_answer_length: int = MAX_ANSWER_LENGTH
              ) -> tuple[float, int, int] | None:
    """The best valid answer span of one feature: the ``n_best`` highest starts and ends among the context's pieces,
    an end not before its start, at most ``max_answer_length`` pieces, the highest start + end logit.

    Args:
        logits: (T_i, 2) start and end logits of the feature's pieces.
        offsets: (T_i,) character spans ``[start, end]`` of the pieces, ``[-1, -1]`` outside the context.

    Returns:
        (score = start logit + end logit, first character, last character + 1), or None when no span is valid.
    """
    logits = np.asarray(logits)
    # The n best among the context's pieces only: the prediction loss leaves the other positions' logits free, so
    # they may score anything and must not crowd the context out of the n best (run_qa.py ranks every position).
    context = np.array([k for k in range(min(len(logits), len(offsets))) if tuple(offsets[k]) != NO_SPAN], dtype=int)
    if context.size == 0:
        return None
    starts = context[np.argsort(logits[context, 0], kind="stable")[::-1][:n_best]]
    ends = context[np.argsort(logits[context, 1], kind="stable")[::-1][:n_best]]
    best = None
    for s in starts:
        for e in ends:
            if e < s or e - s + 1 > max_answer_length:
                continue
            score = float(logits[s, 0]) + float(logits[e, 1])  # in float64, as _span_probability's normaliser
            if best is None or score > best[0]:
                best = (score, int(offsets[s][0]), int(offsets[e][1]))
    return best


def answers(outputs: list[np.ndarray], labels: list[dict], max_answer_length: int = MAX_ANSWER_LENGTH
            ) -> dict[int, dict]:
    """Each question's predicted answer: the best span over its features (:func:`best_span`).

    Args:
        outputs: per feature (T_i, 2) logits. labels: per feature the ``labels`` of :func:`distill.tasks.question_answering.tokenize_questions`.
        max_answer_length: the longest answer, in pieces.

    Returns:
        {question index: {"answer": text ("" when no span is valid), "start", "end" (characters of the context,
        end exclusive; -1 without a span), "score" (the probability of the span's start times that of its end, each
        a softmax over the feature's context pieces), "gold": [gold answers]}}.
    """
    found: dict[int, dict] = {}
    for feature_logits, label in zip(outputs, labels):
        question = label["example"]
        span = best_span(feature_logits, label["offsets"], max_answer_length=max_answer_length)
        if span is None:
            best = {"answer": "", "start": -1, "end": -1, "score": 0.0, "logit": float("-inf")}
        else:
            best = {"answer": label["context"][span[1]:span[2]], "start": span[1], "end": span[2],
                    "score": _span_probability(feature_logits, label["offsets"], span[0]), "logit": span[0]}
        if question not in found or best["logit"] > found[question]["logit"]:
            found[question] = {**best, "gold": list(label["answers"])}
    return {question: {k: v for k, v in best.items() if k != "logit"} for question, best in found.items()}


def _span_probability(logits: np.ndarray, offsets: list, span_logit: float) -> float:
    """exp(start logit + end logit) over the start and end softmax normalisers of the context pieces."""
    logits = np.asarray(logits, dtype=np.float64)[: len(offsets)]
    context = np.array([tuple(o) != NO_SPAN for o in offsets[: len(logits)]])
    normaliser = sum(float(np.logaddexp.reduce(logits[context, k])) for k in (0, 1))
    return min(1.0, float(np.exp(span_logit - normaliser)))  # a probability, whatever the last bit of rounding
