"""group_advantages: GRPO's (r - mean) / (std + eps) per group."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import group_advantages

GROUPED_REWARDS = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([0.0, 1.0, 0.5, -1.0, 2.5])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(GROUPED_REWARDS, st.sampled_from(["group", "batch", "none"]))
def test_advantages_are_finite_and_zero_mean_per_group(
    pairs: list[tuple[int, float]], scale: str
) -> None:
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    result = group_advantages(rewards, groups, scale=scale)  # type: ignore[arg-type]
    assert result.advantages.shape == rewards.shape
    assert torch.isfinite(result.advantages).all()
    for group in groups.unique():
        members = result.advantages[groups == group]
        assert abs(members.mean().item()) < 1e-9
        if rewards[groups == group].unique().numel() == 1:
            assert (members == 0).all()


@settings(max_examples=40, deadline=None)
@given(GROUPED_REWARDS)
def test_group_scale_gives_unit_sample_std_in_mixed_groups(pairs: list[tuple[int, float]]) -> None:
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    advantages = group_advantages(rewards, groups, eps=0.0).advantages
    for group in groups.unique():
        if rewards[groups == group].unique().numel() > 1:
            assert advantages[groups == group].std().item() == pytest.approx(1.0)


def test_worked_example_one_correct_out_of_four() -> None:
    # mean 0.25, sample std sqrt(0.25) = 0.5 (Bessel: sum of squares 0.75 / 3).
    result = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long))
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6)
    torch.testing.assert_close(result.advantages, expected)


def test_singleton_and_all_equal_groups_get_zero_and_are_reported() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.0])
    groups = ["a", "a", "b", "b", "c", "c", "c", "d"]
    result = group_advantages(rewards, groups)
    # 0.1 * 3 / 3 is not exactly 0.1 in floating point; the group must still be exactly 0.
    assert result.advantages[2:].tolist() == [0.0] * 6
    assert result.advantages[0].item() > 0 > result.advantages[1].item()
    assert result.num_groups == 4
    assert result.zero_variance_groups == 3
    assert result.zero_variance_fraction == 0.75


def test_batch_and_none_scales() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 1])
    centred = torch.tensor([0.5, -0.5, 0.5, 0.5, -0.5, -0.5])
    none = group_advantages(rewards, groups, scale="none").advantages
    torch.testing.assert_close(none, centred)
    batch = group_advantages(rewards, groups, scale="batch", eps=0.0).advantages
    torch.testing.assert_close(batch, centred / rewards.std())


def test_dtype_and_device_follow_the_rewards() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.bfloat16)
    result = group_advantages(rewards, torch.tensor([3, 3, 7, 7]))
    assert result.advantages.dtype == torch.bfloat16
    assert result.advantages.device == rewards.device
    assert group_advantages([1, 0], [0, 0]).advantages.dtype == torch.float32


def test_empty_batch_has_no_groups() -> None:
    result = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert result.advantages.numel() == 0
    assert result.zero_variance_fraction == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rewards": torch.zeros(2, 2), "group_ids": torch.zeros(4)}, "1-D tensor"),
        ({"rewards": torch.zeros(3), "group_ids": torch.zeros(2, dtype=torch.long)}, r"\(3,\)"),
        ({"rewards": torch.zeros(2), "group_ids": torch.zeros(2)}, "integer tensor"),
        ({"rewards": torch.zeros(2), "group_ids": ["a"]}, "2 entries"),
        ({"rewards": torch.zeros(2), "group_ids": [0, 0], "scale": "global"}, "scale must be"),
        ({"rewards": torch.zeros(2), "group_ids": [0, 0], "eps": math.nan}, "eps must be"),
    ],
)
def test_bad_input_is_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group_advantages(**kwargs)  # type: ignore[arg-type]
