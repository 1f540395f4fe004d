"""Drop groups whose rewards are all equal: under GRPO they have zero advantage everywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from rstar2_algo._groups import GroupIds, group_constant, index_groups, rewards_vector


class DropReason(StrEnum):
    """Why a group was dropped. A rollout is correct when its reward is above 0."""

    ALL_CORRECT = "all_correct"
    ALL_INCORRECT = "all_incorrect"


@dataclass(frozen=True)
class DroppedGroup:
    """One dropped group, for logging."""

    group_id: Hashable
    reason: DropReason
    size: int
    reward: float


@dataclass(frozen=True)
class GroupFilter:
    """Which rollouts survive, and which groups were dropped and why."""

    kept: torch.Tensor
    """Ascending indices (int64, on the rewards' device) of rollouts in groups that were kept."""
    dropped: tuple[DroppedGroup, ...]
    num_groups: int

    @property
    def dropped_fraction(self) -> float:
        return len(self.dropped) / self.num_groups if self.num_groups else 0.0

    def counts(self) -> dict[DropReason, int]:
        """Number of dropped groups per reason (every reason present, 0 when none)."""
        tally = Counter(group.reason for group in self.dropped)
        return {reason: tally[reason] for reason in DropReason}


def filter_groups(rewards: torch.Tensor | Sequence[float], group_ids: GroupIds) -> GroupFilter:
    """Keep only groups with at least two different rewards.

    Like the paper and the released code, dropped groups are not refilled: the batch shrinks.
    A singleton group counts as all-equal and is dropped.
    """
    values = rewards_vector(rewards)
    index = index_groups(group_ids, values.shape[0], values.device)
    constant = group_constant(values, index)
    kept = torch.nonzero(~constant[index.inverse]).flatten()

    dropped: list[DroppedGroup] = []
    dropped_groups = torch.nonzero(constant).flatten().tolist()
    if dropped_groups:
        sizes = torch.bincount(index.inverse, minlength=index.num_groups).tolist()
        # Any member's reward is the group's reward; take the first one of each group.
        first = torch.full((index.num_groups,), values.shape[0], device=values.device)
        positions = torch.arange(values.shape[0], device=values.device)
        first = first.scatter_reduce(0, index.inverse, positions, reduce="amin")
        group_rewards = values[first[constant]].tolist()
        for group, reward in zip(dropped_groups, group_rewards, strict=True):
            reason = DropReason.ALL_CORRECT if reward > 0 else DropReason.ALL_INCORRECT
            dropped.append(DroppedGroup(index.labels[group], reason, sizes[group], float(reward)))
    return GroupFilter(kept=kept, dropped=tuple(dropped), num_groups=index.num_groups)
