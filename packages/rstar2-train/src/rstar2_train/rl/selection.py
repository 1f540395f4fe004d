"""From 2G graded rollouts per prompt to the G kept ones and their advantages.

Groups whose rewards are all equal carry no GRPO signal and are dropped (not refilled, as in
the paper). Resample-on-Correct then keeps ``keep`` rollouts of every other group; advantages
are computed over the kept rollouts of each group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rstar2_algo import (
    DropReason,
    RocStats,
    filter_groups,
    group_advantages,
    resample_on_correct,
)
from rstar2_train.config.schema import RocConfig
from rstar2_train.rl.rollouts import ScoredRollout


@dataclass(frozen=True)
class Selection:
    """Kept rollouts (positions into the step's rollouts) and their advantages."""

    kept: list[int]
    advantages: list[float]
    groups: int
    dropped: dict[DropReason, int]
    roc: RocStats


def select(rollouts: Sequence[ScoredRollout], roc: RocConfig, *, seed: int) -> Selection:
    """Drop all-equal groups, keep ``roc.keep`` per group by the RoC strategy, score advantages.

    A group that lost rollouts to failures and has no more than ``keep`` left is kept whole.
    """
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    prompts = torch.tensor([r.prompt for r in rollouts], dtype=torch.long)
    survivors = filter_groups(rewards, prompts) if rollouts else None
    dropped = survivors.counts() if survivors is not None else dict.fromkeys(DropReason, 0)
    members: dict[int, list[int]] = {}
    for position in survivors.kept.tolist() if survivors is not None else []:
        members.setdefault(rollouts[position].prompt, []).append(position)
    generator = torch.Generator().manual_seed(seed)
    strategy = "uniform" if roc.strategy == "none" else roc.strategy
    kept: list[int] = []
    stats = RocStats()
    for prompt in sorted(members):
        rows = members[prompt]
        if len(rows) <= roc.keep:
            kept.extend(rows)
            continue
        selection = resample_on_correct(
            rewards[rows],
            [rollouts[i].trajectory.quality for i in rows],
            roc.keep,
            strategy=strategy,
            min_positives=roc.min_positives,
            min_negatives=roc.min_negatives,
            generator=generator,
        )
        kept.extend(rows[i] for i in selection.kept.tolist())
        stats = stats + selection.stats
    advantages = group_advantages(rewards[kept], prompts[kept]).advantages.tolist() if kept else []
    return Selection(
        kept=kept,
        advantages=advantages,
        groups=len({r.prompt for r in rollouts}),
        dropped=dropped,
        roc=stats,
    )
