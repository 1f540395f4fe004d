"""Rollout placement policies: which engine a new rollout goes to, and when.

A rollout is placed once and keeps every turn on that engine (its prefix stays cached there).
The scheduler keeps the per-engine bookkeeping (``EngineSlot``); a policy only reads it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from rstar2_scheduler.engine import Engine

logger = logging.getLogger(__name__)

PolicyName = Literal["static", "least-loaded", "kv-aware"]
POLICY_NAMES: tuple[PolicyName, ...] = ("static", "least-loaded", "kv-aware")


@dataclass(eq=False)
class EngineSlot:
    """What the scheduler knows about one engine during a phase."""

    index: int
    engine: Engine
    active: int = 0
    reserved_tokens: int = 0
    consecutive_errors: int = 0
    healthy: bool = True


class PlacementError(Exception):
    """A rollout that no engine can ever take; it fails with this message."""


class Policy(ABC):
    """Chooses an engine for each rollout, in submission order."""

    name: ClassVar[PolicyName]

    def __init__(self, slots: Sequence[EngineSlot]) -> None:
        self.slots = slots

    def prepare(self, reservations: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """See the KV reservation of every rollout of the phase before placing the first."""

    @abstractmethod
    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        """The engine for rollout ``index`` now, or None to wait until a rollout finishes.

        Raises ``PlacementError`` when the rollout can never be placed.
        """

    def healthy(self) -> list[EngineSlot]:
        slots = [slot for slot in self.slots if slot.healthy]
        if not slots:
            raise PlacementError("every engine was taken out of service after repeated errors")
        return slots


class StaticPolicy(Policy):
    """The baseline: a fixed, even split of the phase's rollouts into contiguous blocks.

    Rollout ``i`` of ``n`` goes to engine ``i * engines // n`` whatever happens later, as
    verl v0.2 split a batch across its inference engines.
    """

    name = "static"

    def prepare(self, reservations: Sequence[int]) -> None:
        count = len(reservations)
        self._assignment = [i * len(self.slots) // count for i in range(count)]

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        return self.slots[self._assignment[index]]


class LeastLoadedPolicy(Policy):
    """Sticky least-requests: a new rollout goes to the engine running the fewest rollouts."""

    name = "least-loaded"

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        return min(self.healthy(), key=lambda slot: (slot.active, slot.index))


class KVAwarePolicy(Policy):
    """Admit a rollout only where its KV reservation fits the engine's cache.

    Each rollout reserves ``kv_tokens`` (prompt + maximum response) until it finishes. An engine
    takes a rollout while the sum of its reservations stays within ``overcommit`` times the KV
    capacity it reports live through ``kv_stats()`` (``fallback_capacity`` where it reports
    none). Among engines with room, the one with the most unreserved budget wins, then the one
    with the most free KV cache right now. A rollout that fits nowhere waits until one finishes.
    """

    name = "kv-aware"

    def __init__(
        self,
        slots: Sequence[EngineSlot],
        *,
        overcommit: float,
        fallback_capacity: int | None = None,
    ) -> None:
        super().__init__(slots)
        self.overcommit = overcommit
        self.fallback_capacity = fallback_capacity

    def budget(self, slot: EngineSlot) -> float:
        capacity = slot.engine.kv_stats().capacity_tokens or self.fallback_capacity
        if not capacity:
            raise PlacementError(
                f"engine {slot.engine.name!r} reports no KV capacity; the kv-aware policy needs "
                "one (set capacity_tokens in the scheduler config)"
            )
        return capacity * self.overcommit

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        slots = self.healthy()
        budgets = {slot.index: self.budget(slot) for slot in slots}
        if all(kv_tokens > budget for budget in budgets.values()):
            raise PlacementError(
                f"kv_tokens ({kv_tokens}) exceeds every engine's KV budget (capacity x overcommit "
                f"= {max(budgets.values()):.0f} tokens at most)"
            )
        fits = [s for s in slots if s.reserved_tokens + kv_tokens <= budgets[s.index]]
        if not fits:
            return None
        return max(
            fits,
            key=lambda s: (
                budgets[s.index] - s.reserved_tokens,
                s.engine.kv_stats().free_tokens,
                -s.index,
            ),
        )


def make_policy(
    name: PolicyName,
    slots: Sequence[EngineSlot],
    *,
    overcommit: float,
    fallback_capacity: int | None,
) -> Policy:
    if name == "static":
        return StaticPolicy(slots)
    if name == "least-loaded":
        return LeastLoadedPolicy(slots)
    return KVAwarePolicy(slots, overcommit=overcommit, fallback_capacity=fallback_capacity)
