"""Sample-based accuracy metrics: avg@k, unbiased pass@k and maj@k."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import TypeVar

Answer = TypeVar("Answer", bound=Hashable)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k).

    Computed as a product of ratios, which stays exact-ish for large ``n`` where the binomials
    themselves would overflow a float.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}, got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_accuracy(correct_counts: Sequence[int], sample_counts: Sequence[int]) -> float:
    """avg@k: the mean over problems of correct / samples (the paper's "average pass@1")."""
    if len(correct_counts) != len(sample_counts):
        raise ValueError("correct_counts and sample_counts differ in length")
    if not correct_counts:
        raise ValueError("no problems to average")
    for c, n in zip(correct_counts, sample_counts, strict=True):
        if n < 1 or not 0 <= c <= n:
            raise ValueError(f"invalid counts: {c} correct of {n} samples")
    return sum(c / n for c, n in zip(correct_counts, sample_counts, strict=True)) / len(
        sample_counts
    )


def majority_vote(answers: Sequence[Answer | None]) -> tuple[Answer | None, int]:
    """The most frequent non-None answer and its count; ties go to the earliest answer.

    Returns ``(None, 0)`` when no sample has an answer.
    """
    counts: dict[Answer, int] = {}
    for answer in answers:
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
    if not counts:
        return None, 0
    # dicts keep first-insertion order and max() keeps the first maximum: earliest wins ties.
    winner = max(counts, key=counts.__getitem__)
    return winner, counts[winner]
