"""Resample-on-Correct: quota split, selection strategies, determinism and statistics."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import (
    RocStats,
    TrajectoryQuality,
    resample_groups,
    resample_on_correct,
    split_quota,
)


def with_errors(failed: int, calls: int = 4, answers: int = 1, turns: int = 5) -> TrajectoryQuality:
    """A rollout whose p_err is failed / calls (runtime errors) and p_format from answers."""
    return TrajectoryQuality(
        tool_calls=calls,
        parse_errors=0,
        runtime_errors=failed,
        timeouts=0,
        other_errors=0,
        answer_tags=answers,
        turns=turns,
        truncated=False,
    )


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[float], list[TrajectoryQuality], int, int, int]:
    """A group of n rollouts with random rewards and qualities, a k <= n and valid minimums."""
    n = draw(st.integers(1, 24))
    rewards = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))
    qualities = []
    for _ in range(n):
        calls = draw(st.integers(0, 5))
        qualities.append(
            with_errors(draw(st.integers(0, calls)), calls, draw(st.integers(0, 3)), turns=6)
        )
    k = draw(st.integers(1, n))
    min_pos = draw(st.integers(0, k))
    min_neg = draw(st.integers(0, k - min_pos))
    return rewards, qualities, k, min_pos, min_neg


@settings(max_examples=150, deadline=None)
@given(groups(), st.sampled_from(["sample", "topk", "uniform"]), st.integers(0, 2**31))
def test_keeps_exactly_k_distinct_indices_and_respects_minimums(
    group: tuple[list[float], list[TrajectoryQuality], int, int, int], strategy: str, seed: int
) -> None:
    rewards, qualities, k, min_pos, min_neg = group
    selection = resample_on_correct(
        torch.tensor(rewards),
        qualities,
        k,
        strategy=strategy,  # type: ignore[arg-type]
        min_positives=min_pos,
        min_negatives=min_neg,
        generator=seed,
    )
    kept = selection.kept.tolist()
    assert len(kept) == k == len(set(kept))
    assert kept == sorted(kept)
    assert all(0 <= i < len(rewards) for i in kept)
    positives = sum(r > 0 for r in rewards)
    negatives = len(rewards) - positives
    kept_pos = sum(rewards[i] > 0 for i in kept)
    assert kept_pos >= min(min_pos, positives)
    assert k - kept_pos >= min(min_neg, negatives)
    assert (selection.stats.kept_positives, selection.stats.kept_negatives) == (
        kept_pos,
        k - kept_pos,
    )


@settings(max_examples=100, deadline=None)
@given(groups(), st.integers(0, 2**31))
def test_topk_never_keeps_a_positive_worse_than_a_dropped_one(
    group: tuple[list[float], list[TrajectoryQuality], int, int, int], seed: int
) -> None:
    rewards, qualities, k, min_pos, min_neg = group
    kept = set(
        resample_on_correct(
            rewards,
            qualities,
            k,
            strategy="topk",
            min_positives=min_pos,
            min_negatives=min_neg,
            generator=seed,
        ).kept.tolist()
    )
    positives = [i for i, r in enumerate(rewards) if r > 0]
    kept_penalties = [qualities[i].penalty for i in positives if i in kept]
    dropped_penalties = [qualities[i].penalty for i in positives if i not in kept]
    if kept_penalties and dropped_penalties:
        assert max(kept_penalties) <= min(dropped_penalties)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(1, 80),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_split_quota_is_proportional_then_clamped(
    positives: int, negatives: int, k: int, min_pos: int, min_neg: int
) -> None:
    total = positives + negatives
    k = min(k, total)
    if min_pos + min_neg > k:
        min_neg = max(0, k - min_pos)
        min_pos = k - min_neg
    keep_pos, keep_neg = split_quota(k, positives, negatives, min_pos, min_neg)
    assert keep_pos + keep_neg == k
    assert 0 <= keep_pos <= positives
    assert 0 <= keep_neg <= negatives
    assert keep_pos >= min(min_pos, positives)
    assert keep_neg >= min(min_neg, negatives)
    proportional = k * positives / total
    if min_pos == 0 and min_neg == 0:
        assert abs(keep_pos - proportional) <= 0.5


def test_split_quota_worked_examples() -> None:
    # The paper's case: 32 rollouts, keep 16 -> half of each side.
    assert split_quota(16, 12, 20, 1, 1) == (6, 10)
    # An odd split rounds half up, in favour of positives: 16 * 5 / 32 = 2.5.
    assert split_quota(16, 5, 27, 1, 1) == (3, 13)
    # One positive out of 32: proportionally 0.5 -> 1, kept by the minimum in any case.
    assert split_quota(16, 1, 31, 1, 1) == (1, 15)
    # 2 positives, minimum 4: keep both, the rest from negatives.
    assert split_quota(16, 2, 30, 4, 1) == (2, 14)
    # 30 positives, 2 negatives, negatives minimum 3: both negatives kept.
    assert split_quota(16, 30, 2, 1, 3) == (14, 2)
    # Minimum raises the small side above its proportional share.
    assert split_quota(16, 28, 4, 1, 4) == (12, 4)


def test_sample_strategy_draws_proportionally_to_inverse_penalty() -> None:
    # Four positives with penalties 1/4, 2/4, 3/4, 4/4 (weights 4, 2, 4/3, 1) and four
    # negatives; k=4 keeps 2 positives. Compare inclusion frequencies over many seeds with the
    # exact inclusion probabilities of sequential sampling without replacement.
    qualities = [with_errors(f) for f in (1, 2, 3, 4)] + [with_errors(0)] * 4
    rewards = [1.0] * 4 + [0.0] * 4
    weights = [4.0, 2.0, 4 / 3, 1.0]
    total = sum(weights)
    exact = [
        weights[i] / total
        + sum(weights[j] / total * weights[i] / (total - weights[j]) for j in range(4) if j != i)
        for i in range(4)
    ]
    trials = 4000
    generator = torch.Generator().manual_seed(1234)
    counts = np.zeros(8)
    for _ in range(trials):
        kept = resample_on_correct(rewards, qualities, 4, generator=generator).kept
        counts[kept.numpy()] += 1
    frequencies = counts / trials
    assert list(frequencies[:4]) == sorted(frequencies[:4], reverse=True)
    for observed, expected in zip(frequencies[:4], exact, strict=True):
        sigma = (expected * (1 - expected) / trials) ** 0.5
        assert abs(observed - expected) < 4.5 * sigma
    # Negatives are uniform: each kept with probability 2/4.
    assert np.all(np.abs(frequencies[4:] - 0.5) < 4.5 * (0.25 / trials) ** 0.5)


def test_zero_penalty_positives_are_taken_first() -> None:
    perfect = with_errors(0)  # all tool calls ran, one answer: p_total = 0
    qualities = [with_errors(3), perfect, with_errors(1), perfect, with_errors(0)]
    rewards = [1.0, 1.0, 1.0, 1.0, 0.0]
    # Keep 4 of 5: 3 positives (16/5 * 4 rounded) -> both perfect ones plus one of the others.
    for seed in range(50):
        kept = resample_on_correct(rewards, qualities, 4, generator=seed).kept.tolist()
        assert {1, 3} <= set(kept)


def test_same_seed_same_selection_for_torch_and_numpy_generators() -> None:
    rewards = [1.0, 0.0] * 8
    qualities = [with_errors(i % 5) for i in range(16)]

    def pick(generator: object) -> list[int]:
        return resample_on_correct(rewards, qualities, 8, generator=generator).kept.tolist()  # type: ignore[arg-type]

    assert pick(torch.Generator().manual_seed(7)) == pick(torch.Generator().manual_seed(7))
    assert pick(np.random.default_rng(7)) == pick(np.random.default_rng(7))
    assert pick(7) == pick(7)
    assert len({tuple(pick(seed)) for seed in range(20)}) > 1


def test_statistics_of_kept_and_dropped_positives() -> None:
    # Positives with penalties 0, 0.25, 0.5, 0.75 (tool errors 0..3 of 4); keep 2 by topk.
    qualities = [with_errors(f) for f in range(4)] + [with_errors(0)] * 4
    rewards = [1.0] * 4 + [0.0] * 4
    selection = resample_on_correct(rewards, qualities, 4, strategy="topk", generator=0)
    stats = selection.stats
    assert (stats.positives, stats.negatives, stats.kept_positives, stats.kept_negatives) == (
        4,
        4,
        2,
        2,
    )
    assert set(selection.kept.tolist()) >= {0, 1}
    assert stats.kept_positive_penalty == pytest.approx((0 + 0.25) / 2)
    assert stats.dropped_positive_penalty == pytest.approx((0.5 + 0.75) / 2)
    assert stats.kept_positive_tool_error_ratio == pytest.approx(1 / 8)
    assert stats.dropped_positive_tool_error_ratio == pytest.approx(5 / 8)
    metrics = stats.metrics()
    assert metrics["roc/kept_positive_penalty"] == pytest.approx(0.125)


def test_undefined_statistics_are_none_and_left_out_of_metrics() -> None:
    stats = resample_on_correct([0.0, 0.0, 0.0], [with_errors(0)] * 3, 2, generator=0).stats
    assert stats.kept_positive_penalty is None
    assert stats.kept_positive_tool_error_ratio is None
    assert "roc/kept_positive_penalty" not in stats.metrics()
    assert stats.metrics()["roc/kept_negatives"] == 2.0


def test_stats_pool_by_addition() -> None:
    a = RocStats(
        positives=2,
        kept_positives=1,
        kept_positive_penalty_sum=0.5,
        dropped_positive_penalty_sum=1.0,
    )
    b = RocStats(
        positives=4,
        kept_positives=3,
        kept_positive_penalty_sum=0.5,
        dropped_positive_penalty_sum=0.5,
    )
    pooled = a + b
    assert (pooled.positives, pooled.kept_positives) == (6, 4)
    # Pooled means weight every trajectory equally, not every group.
    assert pooled.kept_positive_penalty == pytest.approx(1.0 / 4)
    assert pooled.dropped_positive_penalty == pytest.approx(1.5 / 2)


def test_resample_groups_selects_per_group_with_batch_indices() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    qualities = [with_errors(i % 4) for i in range(8)]
    groups = ["q1", "q2"] * 4
    selection = resample_groups(rewards, qualities, groups, 2, strategy="topk", generator=3)
    kept = selection.kept.tolist()
    assert len(kept) == 4
    assert sorted(groups[i] for i in kept) == ["q1", "q1", "q2", "q2"]
    # Each group keeps one positive and one negative; pooled stats cover both groups.
    assert selection.stats.kept_positives == 2
    assert selection.stats.kept_negatives == 2
    assert selection.stats.positives == 4
    again = resample_groups(rewards, qualities, groups, 2, strategy="topk", generator=3)
    assert again.kept.tolist() == kept


def test_resample_groups_names_the_group_that_is_too_small() -> None:
    with pytest.raises(ValueError, match="group 'short': k=3 exceeds the group size n=2"):
        resample_groups(
            [1.0, 0.0, 1.0, 0.0, 1.0],
            [with_errors(0)] * 5,
            ["long", "long", "long", "short", "short"],
            3,
        )


@pytest.mark.parametrize(
    ("k", "kwargs", "message"),
    [
        (5, {}, "k=5 exceeds the group size n=4"),
        (0, {}, "k must be >= 1"),
        (2, {"strategy": "greedy"}, "strategy must be one of"),
        (2, {"min_positives": 2, "min_negatives": 1}, "exceeds k=2"),
        (2, {"min_negatives": -1}, "must be >= 0"),
        (2, {"generator": "seed"}, "generator must be"),
    ],
)
def test_bad_arguments_are_rejected(k: int, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resample_on_correct([1.0, 0.0, 1.0, 0.0], [with_errors(0)] * 4, k, **kwargs)  # type: ignore[arg-type]


def test_qualities_must_match_rewards() -> None:
    with pytest.raises(ValueError, match="one record per reward"):
        resample_on_correct([1.0, 0.0], [with_errors(0)], 1)


def test_topk_with_distinct_penalties_ignores_the_seed() -> None:
    # All penalties distinct: topk does not depend on the seed at all.
    qualities = [with_errors(f, calls=6) for f in range(6)]
    rewards = [1.0] * 6
    picks = {
        tuple(
            resample_on_correct(rewards, qualities, 3, strategy="topk", generator=s).kept.tolist()
        )
        for s in range(10)
    }
    assert picks == {(0, 1, 2)}


def test_uniform_ignores_penalties() -> None:
    # One clean positive among five that all failed their tool calls: "sample" nearly always
    # keeps the clean one, "uniform" keeps it as often as any other (1 in 5 for k_pos = 1).
    rewards = torch.tensor([1.0] * 6 + [0.0] * 6)
    clean = with_errors(0, 2, 1, turns=3)
    qualities = [clean] + [with_errors(2, 2, 1, turns=3)] * 5 + [with_errors(0, 2, 1, turns=3)] * 6
    trials = 2000
    kept_clean = {"sample": 0, "uniform": 0}
    generator = torch.Generator().manual_seed(0)
    for strategy in kept_clean:
        for _ in range(trials):
            selection = resample_on_correct(
                rewards,
                qualities,
                2,
                strategy=strategy,
                generator=generator,  # type: ignore[arg-type]
            )
            kept_clean[strategy] += 0 in selection.kept.tolist()
    assert kept_clean["uniform"] / trials == pytest.approx(1 / 6, abs=0.03)
    assert kept_clean["sample"] / trials > 0.5
