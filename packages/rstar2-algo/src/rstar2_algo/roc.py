"""Resample-on-Correct (RoC): keep k of n rollouts per group, preferring clean positives."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal, get_args

import torch

from rstar2_algo._groups import GroupIds, index_groups, rewards_vector
from rstar2_algo._rng import Generator, RandomSource, as_generator, uniforms
from rstar2_algo.quality import TrajectoryQuality

RocStrategy = Literal["sample", "topk", "uniform"]
"""How positives are chosen: sampled without replacement with probability proportional to
1 / penalty (the paper), the k lowest penalties (the released code), or uniformly at random like
negatives (plain GRPO on the same down-sampled budget: the ablation without RoC's preference)."""


@dataclass(frozen=True)
class RocStats:
    """Counts and sums behind the RoC metrics; add two to pool groups."""

    positives: int = 0
    negatives: int = 0
    kept_positives: int = 0
    kept_negatives: int = 0
    kept_positive_penalty_sum: float = 0.0
    dropped_positive_penalty_sum: float = 0.0
    kept_positive_tool_calls: int = 0
    kept_positive_failed_tool_calls: int = 0
    dropped_positive_tool_calls: int = 0
    dropped_positive_failed_tool_calls: int = 0

    def __add__(self, other: RocStats) -> RocStats:
        return RocStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def kept_positive_penalty(self) -> float | None:
        """Mean p_total of kept positives (None when no positive was kept)."""
        return _ratio(self.kept_positive_penalty_sum, self.kept_positives)

    @property
    def dropped_positive_penalty(self) -> float | None:
        """Mean p_total of dropped positives (None when no positive was dropped)."""
        return _ratio(self.dropped_positive_penalty_sum, self.positives - self.kept_positives)

    @property
    def kept_positive_tool_error_ratio(self) -> float | None:
        """Failed / all tool calls, pooled over kept positives (None without tool calls)."""
        return _ratio(self.kept_positive_failed_tool_calls, self.kept_positive_tool_calls)

    @property
    def dropped_positive_tool_error_ratio(self) -> float | None:
        """Failed / all tool calls, pooled over dropped positives (None without tool calls)."""
        return _ratio(self.dropped_positive_failed_tool_calls, self.dropped_positive_tool_calls)

    def metrics(self, prefix: str = "roc/") -> dict[str, float]:
        """Flat metrics for a logger; undefined means are left out rather than logged as NaN."""
        values: dict[str, float | None] = {
            "positives": self.positives,
            "negatives": self.negatives,
            "kept_positives": self.kept_positives,
            "kept_negatives": self.kept_negatives,
            "kept_positive_penalty": self.kept_positive_penalty,
            "dropped_positive_penalty": self.dropped_positive_penalty,
            "kept_positive_tool_error_ratio": self.kept_positive_tool_error_ratio,
            "dropped_positive_tool_error_ratio": self.dropped_positive_tool_error_ratio,
        }
        return {prefix + key: float(value) for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class RocSelection:
    """Kept rollouts (ascending int64 indices, on the rewards' device) and their statistics."""

    kept: torch.Tensor
    stats: RocStats


def _ratio(numerator: float, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def split_quota(
    k: int, positives: int, negatives: int, min_positives: int, min_negatives: int
) -> tuple[int, int]:
    """How many positives and negatives to keep out of ``k``.

    Proportional to the counts, rounding half up in favour of positives; then each side is raised
    to its minimum, or to all it has when it has fewer than the minimum, taking the difference
    from the other side. Requires ``min_positives + min_negatives <= k <= positives + negatives``.
    """
    total = positives + negatives
    # floor(k * positives / total + 1/2) in exact integer arithmetic.
    keep_positives = (2 * k * positives + total) // (2 * total)
    keep_positives = max(keep_positives, min(min_positives, positives))
    keep_negatives = k - keep_positives
    if keep_negatives < min(min_negatives, negatives):
        keep_negatives = min(min_negatives, negatives)
        keep_positives = k - keep_negatives
    return keep_positives, keep_negatives


def _take_positives(
    penalties: list[float], count: int, strategy: RocStrategy, source: Generator
) -> list[int]:
    """Positions (into ``penalties``) of the positives to keep."""
    if strategy == "uniform":
        return _take_uniform(len(penalties), count, source)
    noise = uniforms(len(penalties), source)
    if strategy == "topk":
        # Lowest penalty first; equal penalties in random order so no position is favoured.
        order = sorted(range(len(penalties)), key=lambda i: (penalties[i], noise[i]))
    else:
        # Efraimidis-Spirakis: the top keys u^(1/w) with w = 1/p are a draw without replacement
        # proportional to w. log u^(1/w) = p * log u; a zero penalty (infinite weight) ties at the
        # top key 0 and is then ordered by u, i.e. taken first, uniformly among its peers.
        def key(i: int) -> tuple[float, float]:
            log_u = math.log(noise[i]) if noise[i] > 0 else -math.inf
            return (-(penalties[i] * log_u) if penalties[i] > 0 else 0.0, -noise[i])

        order = sorted(range(len(penalties)), key=key)
    return order[:count]


def _take_uniform(size: int, count: int, source: Generator) -> list[int]:
    noise = uniforms(size, source)
    return sorted(range(size), key=noise.__getitem__)[:count]


def _validate(k: int, size: int, min_positives: int, min_negatives: int, strategy: str) -> None:
    if strategy not in get_args(RocStrategy):
        raise ValueError(f"strategy must be one of {get_args(RocStrategy)}, got {strategy!r}")
    if min_positives < 0 or min_negatives < 0:
        raise ValueError(
            f"min_positives and min_negatives must be >= 0, got {min_positives}, {min_negatives}"
        )
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > size:
        raise ValueError(f"k={k} exceeds the group size n={size}: cannot keep more than n")
    if min_positives + min_negatives > k:
        raise ValueError(
            f"min_positives + min_negatives = {min_positives + min_negatives} exceeds k={k}"
        )


def resample_on_correct(
    rewards: torch.Tensor | Sequence[float],
    qualities: Sequence[TrajectoryQuality],
    k: int,
    *,
    strategy: RocStrategy = "sample",
    min_positives: int = 1,
    min_negatives: int = 1,
    generator: RandomSource = None,
) -> RocSelection:
    """Keep ``k`` of the ``n`` rollouts of one group (GRPO-RoC, oversample 2G keep G).

    Positives (reward > 0) and negatives share the quota in proportion to their counts (see
    :func:`split_quota`; a side with fewer rollouts than its minimum is kept whole). Negatives
    are kept uniformly at random. Positives are kept by ``strategy``: ``"sample"`` draws without
    replacement with probability proportional to ``1 / p_total`` (a zero penalty is taken
    first), ``"topk"`` keeps the lowest ``p_total``, ``"uniform"`` ignores the penalty. The same
    ``generator`` state gives the same selection.
    """
    values = rewards_vector(rewards)
    size = values.shape[0]
    if len(qualities) != size:
        raise ValueError(
            f"qualities must have one record per reward ({size}), got {len(qualities)}"
        )
    _validate(k, size, min_positives, min_negatives, strategy)
    source = as_generator(generator)

    positive = [reward > 0 for reward in values.tolist()]
    positives = [i for i in range(size) if positive[i]]
    negatives = [i for i in range(size) if not positive[i]]
    keep_pos, keep_neg = split_quota(
        k, len(positives), len(negatives), min_positives, min_negatives
    )

    penalties = [qualities[i].penalty for i in positives]
    kept_pos = {positives[j] for j in _take_positives(penalties, keep_pos, strategy, source)}
    kept_neg = [negatives[j] for j in _take_uniform(len(negatives), keep_neg, source)]

    kept_q = [qualities[i] for i in kept_pos]
    dropped_q = [qualities[i] for i in positives if i not in kept_pos]
    stats = RocStats(
        positives=len(positives),
        negatives=len(negatives),
        kept_positives=len(kept_pos),
        kept_negatives=len(kept_neg),
        kept_positive_penalty_sum=sum(q.penalty for q in kept_q),
        dropped_positive_penalty_sum=sum(q.penalty for q in dropped_q),
        kept_positive_tool_calls=sum(q.tool_calls for q in kept_q),
        kept_positive_failed_tool_calls=sum(q.failed_tool_calls for q in kept_q),
        dropped_positive_tool_calls=sum(q.tool_calls for q in dropped_q),
        dropped_positive_failed_tool_calls=sum(q.failed_tool_calls for q in dropped_q),
    )
    kept = torch.tensor(sorted([*kept_pos, *kept_neg]), dtype=torch.long, device=values.device)
    return RocSelection(kept=kept, stats=stats)


def resample_groups(
    rewards: torch.Tensor | Sequence[float],
    qualities: Sequence[TrajectoryQuality],
    group_ids: GroupIds,
    k: int,
    *,
    strategy: RocStrategy = "sample",
    min_positives: int = 1,
    min_negatives: int = 1,
    generator: RandomSource = None,
) -> RocSelection:
    """:func:`resample_on_correct` on every group of a batch; indices are into the batch and the
    statistics are pooled over groups. Groups are visited in a fixed order (sorted tensor labels,
    else first appearance), so one generator state gives one selection.

    An integer seed is turned into one generator for the whole batch, not reused per group.
    """
    values = rewards_vector(rewards)
    if len(qualities) != values.shape[0]:
        raise ValueError(
            f"qualities must have one record per reward ({values.shape[0]}), got {len(qualities)}"
        )
    source = as_generator(generator)
    index = index_groups(group_ids, values.shape[0], values.device)
    members: list[list[int]] = [[] for _ in range(index.num_groups)]
    for position, group in enumerate(index.inverse.tolist()):
        members[group].append(position)

    kept: list[int] = []
    stats = RocStats()
    for label, rows in zip(index.labels, members, strict=True):
        try:
            selection = resample_on_correct(
                values[rows],
                [qualities[i] for i in rows],
                k,
                strategy=strategy,
                min_positives=min_positives,
                min_negatives=min_negatives,
                generator=source,
            )
        except ValueError as error:
            raise ValueError(f"group {label!r}: {error}") from error
        kept.extend(rows[i] for i in selection.kept.tolist())
        stats = stats + selection.stats
    return RocSelection(
        kept=torch.tensor(sorted(kept), dtype=torch.long, device=values.device), stats=stats
    )
