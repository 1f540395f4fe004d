"""filter_groups: drop all-equal groups and say why."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import DropReason, filter_groups


def test_drops_all_correct_and_all_incorrect_groups_with_reasons() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    groups = ["p1", "p1", "p2", "p2", "p3", "p3", "p4"]
    result = filter_groups(rewards, groups)
    assert result.kept.tolist() == [2, 3]
    assert [(d.group_id, d.reason, d.size, d.reward) for d in result.dropped] == [
        ("p1", DropReason.ALL_CORRECT, 2, 1.0),
        ("p3", DropReason.ALL_INCORRECT, 2, 0.0),
        ("p4", DropReason.ALL_INCORRECT, 1, 0.0),
    ]
    assert result.counts() == {DropReason.ALL_CORRECT: 1, DropReason.ALL_INCORRECT: 2}
    assert result.dropped_fraction == 0.75


def test_tensor_group_ids_are_reported_by_value() -> None:
    result = filter_groups([0.0, 1.0, 1.0, 1.0], torch.tensor([10, 10, 42, 42]))
    assert result.kept.tolist() == [0, 1]
    assert [(d.group_id, d.reason) for d in result.dropped] == [(42, DropReason.ALL_CORRECT)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0.0, 1.0])), max_size=40))
def test_kept_rollouts_are_exactly_the_mixed_groups(pairs: list[tuple[int, float]]) -> None:
    groups = torch.tensor([g for g, _ in pairs], dtype=torch.long)
    rewards = torch.tensor([r for _, r in pairs])
    result = filter_groups(rewards, groups)
    mixed = {g for g in set(groups.tolist()) if rewards[groups == g].unique().numel() > 1}
    assert result.kept.tolist() == [i for i, (g, _) in enumerate(pairs) if g in mixed]
    assert {d.group_id for d in result.dropped} == set(groups.tolist()) - mixed
    assert sum(d.size for d in result.dropped) + result.kept.numel() == len(pairs)
