"""GRPO group-relative advantages: ``(r - group mean) / (std + eps)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from rstar2_algo._groups import (
    GroupIds,
    group_constant,
    group_sums,
    index_groups,
    rewards_vector,
)

AdvantageScale = Literal["group", "batch", "none"]
"""How centred rewards are scaled: by their group's std (GRPO, the paper), by the std of every
reward in the batch, or not at all (Dr. GRPO)."""


@dataclass(frozen=True)
class GroupAdvantages:
    """Per-rollout advantages and how many groups carried no learning signal."""

    advantages: torch.Tensor
    num_groups: int
    zero_variance_groups: int

    @property
    def zero_variance_fraction(self) -> float:
        """Share of groups whose rewards were all equal (their advantages are 0)."""
        return self.zero_variance_groups / self.num_groups if self.num_groups else 0.0


def _sample_std(values: torch.Tensor) -> torch.Tensor:
    # Bessel-corrected like torch.std; one value has no spread, not NaN.
    if values.numel() < 2:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    return values.std()


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: GroupIds,
    eps: float = 1e-6,
    scale: AdvantageScale = "group",
) -> GroupAdvantages:
    """Group-relative advantages, one per rollout, on the rewards' device and dtype.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` where ``g`` is rollout ``i``'s group and ``std_g``
    is the Bessel-corrected standard deviation (as ``torch.std``). A group whose rewards are all
    equal, a singleton included, gets advantage exactly 0: it carries no signal, and this avoids
    both 0/0 and the rounding residue of ``r - mean``. Integer or bool rewards give float32.
    """
    if scale not in get_args(AdvantageScale):
        raise ValueError(f"scale must be one of {get_args(AdvantageScale)}, got {scale!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps}")
    values = rewards_vector(rewards)
    index = index_groups(group_ids, values.shape[0], values.device)
    # Accumulate in at least float32 so bf16 rewards do not lose the mean.
    work = values.to(torch.promote_types(values.dtype, torch.float32))
    counts = group_sums(torch.ones_like(work), index)
    means = group_sums(work, index) / counts.clamp(min=1)
    centred = work - means[index.inverse]
    constant_groups = group_constant(work, index)
    constant = constant_groups[index.inverse]

    if scale == "group":
        variances = group_sums(centred.square(), index) / (counts - 1).clamp(min=1)
        scaled = centred / (variances.sqrt()[index.inverse] + eps)
    elif scale == "batch":
        scaled = centred / (_sample_std(work) + eps)
    else:
        scaled = centred
    # Set, not computed: with eps=0 a constant group would be 0/0.
    advantages = torch.where(constant, torch.zeros_like(scaled), scaled)
    return GroupAdvantages(
        advantages=advantages.to(values.dtype),
        num_groups=index.num_groups,
        zero_variance_groups=int(constant_groups.sum()),
    )
