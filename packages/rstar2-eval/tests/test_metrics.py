"""Metrics: unbiased pass@k against the exact binomial formula, avg@k, majority vote."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rstar2_eval import majority_vote, mean_accuracy, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (3, 1, 2, 2 / 3),
        (3, 1, 1, 1 / 3),
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (10, 3, 8, 1.0),  # fewer than k wrong samples: some draw of k always holds a right one
        (16, 4, 4, 1 - comb(12, 4) / comb(16, 4)),
    ],
)
def test_pass_at_k_known_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(st.data())
def test_pass_at_k_matches_exact_binomials(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 200))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-9)


def test_pass_at_k_stays_finite_where_binomials_overflow_floats() -> None:
    # C(2000, 1000) is far beyond float range; the product form does not need it.
    value = pass_at_k(2000, 1, 1000)
    assert value == pytest.approx(0.5)


def test_pass_at_1_is_the_sample_accuracy() -> None:
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        pass_at_k(n, c, k)


def test_mean_accuracy_averages_per_problem_rates() -> None:
    # Problems weigh equally whatever their sample counts.
    assert mean_accuracy([1, 4], [2, 4]) == pytest.approx(0.75)


def test_mean_accuracy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no problems"):
        mean_accuracy([], [])
    with pytest.raises(ValueError, match="5 correct of 4"):
        mean_accuracy([5], [4])


def test_majority_vote_counts_and_ignores_missing_answers() -> None:
    assert majority_vote(["3", None, "5", "3", None, None]) == ("3", 2)


def test_majority_vote_ties_go_to_the_earliest_answer() -> None:
    assert majority_vote(["5", "3", "3", "5"]) == ("5", 2)


def test_majority_vote_with_no_answers() -> None:
    assert majority_vote([None, None]) == (None, 0)
