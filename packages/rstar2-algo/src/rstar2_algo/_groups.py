"""Map per-rollout group labels to dense group indices, on the rewards' device."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

GroupIds = torch.Tensor | Sequence[Hashable]
"""Which prompt each rollout belongs to: an integer tensor, or any sequence of hashable labels
(e.g. the uid strings a trainer attaches to prompts)."""


@dataclass(frozen=True)
class GroupIndex:
    """Dense group numbering of a batch: ``inverse[i]`` is the group of rollout ``i``."""

    inverse: torch.Tensor
    labels: tuple[Hashable, ...]

    @property
    def num_groups(self) -> int:
        return len(self.labels)


def rewards_vector(
    rewards: torch.Tensor | Sequence[float], *, name: str = "rewards"
) -> torch.Tensor:
    """Rewards as a 1-D floating tensor (integer and bool rewards become float32)."""
    tensor = rewards if isinstance(rewards, torch.Tensor) else torch.tensor(rewards)
    if tensor.dim() != 1:
        raise ValueError(
            f"{name} must be a 1-D tensor of per-rollout rewards, got shape {tuple(tensor.shape)}"
        )
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    return tensor


def index_groups(group_ids: GroupIds, size: int, device: torch.device) -> GroupIndex:
    """Number the groups of ``group_ids`` densely; tensor labels are sorted, others keep the order
    in which they first appear."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.shape[0] != size:
            raise ValueError(
                f"group_ids must have shape ({size},) to match rewards, got "
                f"{tuple(group_ids.shape)}"
            )
        if group_ids.is_floating_point() or group_ids.is_complex():
            raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
        unique, inverse = torch.unique(group_ids.to(device), return_inverse=True)
        return GroupIndex(inverse=inverse, labels=tuple(unique.tolist()))
    if len(group_ids) != size:
        raise ValueError(
            f"group_ids must have {size} entries to match rewards, got {len(group_ids)}"
        )
    numbering: dict[Hashable, int] = {}
    dense = [numbering.setdefault(label, len(numbering)) for label in group_ids]
    inverse = torch.tensor(dense, dtype=torch.long, device=device)
    return GroupIndex(inverse=inverse, labels=tuple(numbering))


def group_sums(values: torch.Tensor, index: GroupIndex) -> torch.Tensor:
    """Sum of ``values`` per group."""
    out = torch.zeros(index.num_groups, dtype=values.dtype, device=values.device)
    return out.index_add_(0, index.inverse, values)


def group_constant(values: torch.Tensor, index: GroupIndex) -> torch.Tensor:
    """Per group: whether every value in it is equal (always true for a singleton group)."""
    shape = (index.num_groups,)
    high = torch.full(shape, -torch.inf, dtype=values.dtype, device=values.device)
    low = torch.full(shape, torch.inf, dtype=values.dtype, device=values.device)
    high = high.scatter_reduce(0, index.inverse, values, reduce="amax")
    low = low.scatter_reduce(0, index.inverse, values, reduce="amin")
    return high == low
