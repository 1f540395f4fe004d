"""Rollout placement policies: which engine a new rollout goes to, and when.

A rollout is placed once and keeps every turn on that engine (its prefix stays cached there).
The scheduler keeps the per-engine and per-rollout bookkeeping (``EngineSlot``, ``RolloutState``)
and tells the policy as a rollout's context changes and when it finishes.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rstar2_scheduler.engine import Engine
from rstar2_scheduler.kv_forecast import FootprintForecast

logger = logging.getLogger(__name__)

PolicyName = Literal["static", "least-loaded", "kv-aware"]
POLICY_NAMES: tuple[PolicyName, ...] = ("static", "least-loaded", "kv-aware")
Reservation = Literal["live", "max"]
RESERVATIONS: tuple[Reservation, ...] = ("live", "max")


@dataclass(eq=False)
class EngineSlot:
    """What the scheduler knows about one engine during a phase."""

    index: int
    engine: Engine
    active: int = 0
    reserved_tokens: int = 0
    consecutive_errors: int = 0
    healthy: bool = True


@dataclass(eq=False)
class RolloutState:
    """A placed rollout, as its engine calls show it to the scheduler."""

    index: int
    slot: EngineSlot
    kv_tokens: int
    context_tokens: int | None = None  # KV tokens of its context; None before its first call
    generating: bool = False  # a generate call of it is in flight


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

    def track(self, rollout: RolloutState, *, context_tokens: int, generating: bool) -> None:
        """A call of ``rollout`` started or ended; its context is now ``context_tokens``."""
        rollout.context_tokens = context_tokens
        rollout.generating = generating

    def admitted(self, rollout: RolloutState) -> None:  # noqa: B027 - optional hook
        """``rollout`` was placed on ``rollout.slot``."""

    def finished(self, rollout: RolloutState, *, ok: bool) -> None:  # noqa: B027 - optional hook
        """``rollout`` ended (``ok``: without an error) and left its engine."""

    def healthy(self) -> list[EngineSlot]:
        slots = [slot for slot in self.slots if slot.healthy]
        if not slots:
            raise PlacementError("every engine was taken out of service after repeated errors")
        return slots


def static_split(count: int, engines: int) -> list[int]:
    """The engine of each of ``count`` rollouts under an even split into contiguous blocks
    (a prompt's rollouts, submitted together, stay together)."""
    return [i * engines // count for i in range(count)]


class StaticPolicy(Policy):
    """The baseline: a fixed, even split of the phase's rollouts into contiguous blocks.

    Rollout ``i`` of ``n`` goes to engine ``i * engines // n`` whatever happens later, as
    verl v0.2 split a batch across its inference engines.
    """

    name = "static"

    def prepare(self, reservations: Sequence[int]) -> None:
        self._assignment = static_split(len(reservations), len(self.slots))

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        return self.slots[self._assignment[index]]


class LeastLoadedPolicy(Policy):
    """Sticky least-requests: a new rollout goes to the engine running the fewest rollouts."""

    name = "least-loaded"

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        return min(self.healthy(), key=lambda slot: (slot.active, slot.index))


def kv_capacity(slot: EngineSlot, fallback: int | None) -> int:
    """The engine's live KV capacity, or ``fallback`` where it reports none."""
    capacity = slot.engine.kv_stats().capacity_tokens or fallback
    if not capacity:
        raise PlacementError(
            f"engine {slot.engine.name!r} reports no KV capacity; the kv-aware policy needs one "
            "(set capacity_tokens in the scheduler config)"
        )
    return capacity


class ReservedKVPolicy(Policy):
    """kv-aware with a fixed reservation per rollout, as the rStar2-Agent release does.

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

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        slots = self.healthy()
        budgets = {s.index: kv_capacity(s, self.fallback_capacity) * self.overcommit for s in slots}
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


class _EngineLoad:
    """What a ``LiveKVPolicy`` tracks of one engine's running rollouts."""

    def __init__(self, bins: int) -> None:
        self.counts = [0] * bins  # running rollouts per footprint bin
        self.projection = [0.0] * bins  # their expected KV usage after k bins of progress
        self.idle_tokens = 0  # context of rollouts between calls: absent from live KV usage
        self.in_engine = 0  # rollouts with a call in flight or admitted and not yet called


@dataclass
class _DueRefresh:
    """The state a due forecast re-estimate reads, and the shifts made after it."""

    running: list[int]
    finished: list[int]
    counts: dict[int, list[int]]
    shifts: list[tuple[_EngineLoad, int, int]] = field(default_factory=list)


class LiveKVPolicy(Policy):
    """kv-aware sized from each engine's free KV cache, as the rStar2-Agent paper describes.

    An engine takes a new rollout while both hold, with ``headroom`` of its capacity kept free:

    - forecast: the expected peak KV usage of its running rollouts plus the new one stays within
      capacity. Each rollout's footprint is projected from the context it has reached and the
      distribution of final footprints learnt online during the phase (``FootprintForecast``),
      bounded by the largest reservation of the phase.
    - now: the KV tokens the engine reports in use through ``kv_stats()``, plus the context of
      its rollouts that sit between calls (waiting on a tool, their cache released), plus the
      new rollout's prompt, stay within capacity.

    The scheduler re-evaluates waiting rollouts whenever a call or a rollout ends. An engine
    with none of this phase's rollouts takes one whatever it reports, so a rollout that needs
    most of the cache still runs; one whose ``kv_tokens`` exceed every engine's capacity fails.
    Among engines with room, the one with the lowest forecast peak wins.

    Whatever the forecast says, an engine also takes a rollout while fewer of its rollouts are
    at the engine (a call in flight, or admitted and not yet called) than it decodes at once
    (``KVStats.max_running``) and the "now" condition holds: the batch floor. A static split
    keeps every batch full from its queue; the forecast alone, cautious while few rollouts have
    finished (it assumes unsupported ones reach the largest footprint), kept batches smaller,
    and phases of one or two batches per engine ran up to 10% slower than under the static
    split. The floor sends rollout ``i`` to its static engine when that one has room (a
    prompt's rollouts stay together, sharing its cached prefix), else to the engine with the
    fewest rollouts. Engines that report no ``max_running`` have no floor.

    A phase whose rollouts reserve (``kv_tokens``: prompt + maximum response) at most
    ``UPFRONT_RESERVATION`` times the engines' total KV capacity is placed as the static split
    places it: every rollout at once, on its static engine. The engines' queues then start every
    rollout early in the phase, and on such a phase their caches hold what the rollouts come to
    need. Holding rollouts back there protects nothing and only delays their start: a long
    rollout decodes for most of the phase in a full batch, so one started late sets the
    makespan. Above that size the static split's queue outgrows the cache and evicts the
    prefixes of rollouts waiting on tools, and the forecast and the floor win. Whether the
    queue fits depends on the cache, not the batch: the ratio was measured (scheduler README)
    where kv-aware stopped losing with the default cache, with twice that cache and with half
    the batch, at the same reservation per rollout. It counts reservations, not use, so with a
    budget rollouts use little of (16K tokens there) it hands more phases to the forecast than
    it should, and kv-aware lost up to 3% on some of them.
    """

    UPFRONT_RESERVATION: ClassVar[float] = 8.6

    name = "kv-aware"

    def __init__(
        self,
        slots: Sequence[EngineSlot],
        *,
        headroom: float,
        fallback_capacity: int | None = None,
        min_at_risk: int = 32,
    ) -> None:
        super().__init__(slots)
        self.headroom = headroom
        self.fallback_capacity = fallback_capacity
        self.min_at_risk = min_at_risk
        self.prepare([1])  # sized for the phase when the scheduler calls prepare

    def prepare(self, reservations: Sequence[int]) -> None:
        self._static = static_split(len(reservations), len(self.slots))
        self._reserved = sum(reservations)
        self._upfront: bool | None = None  # decided at the first placement, engines started
        self.forecast = FootprintForecast(max(reservations), min_at_risk=self.min_at_risk)
        bins = self.forecast.bins
        self.loads = {slot.index: _EngineLoad(bins) for slot in self.slots}
        self.running = [0] * bins
        self._bin: dict[int, int] = {}
        self._prompts = self._prompt_total = 0
        self._changes = 0
        self._observations = 0
        # A due re-estimate, recorded (the counts it reads) and computed when an admission next
        # needs the forecast, and the shifts made since, replayed onto it then.
        self._due: _DueRefresh | None = None

    # -- bookkeeping -------------------------------------------------------------------------

    def admitted(self, rollout: RolloutState) -> None:
        self.loads[rollout.slot.index].in_engine += 1
        self._enter(rollout, self.forecast.bin_of(self._typical_prompt(rollout.kv_tokens)))

    def track(self, rollout: RolloutState, *, context_tokens: int, generating: bool) -> None:
        load = self.loads[rollout.slot.index]
        if rollout.context_tokens is None:
            self._prompts += 1
            self._prompt_total += context_tokens
        elif not rollout.generating:
            load.idle_tokens -= rollout.context_tokens
        was_in_engine = rollout.context_tokens is None or rollout.generating
        load.in_engine += int(generating) - int(was_in_engine)
        super().track(rollout, context_tokens=context_tokens, generating=generating)
        if not generating:
            load.idle_tokens += context_tokens
        self._move(rollout, self.forecast.bin_of(context_tokens))

    def finished(self, rollout: RolloutState, *, ok: bool) -> None:
        load = self.loads[rollout.slot.index]
        if rollout.context_tokens is not None and not rollout.generating:
            load.idle_tokens -= rollout.context_tokens
        if rollout.context_tokens is None or rollout.generating:
            load.in_engine -= 1
        self._move(rollout, None)
        if ok and rollout.context_tokens is not None:
            self.forecast.observe(rollout.context_tokens)
            self._observations += 1
            self._changed()

    def _typical_prompt(self, kv_tokens: int) -> int:
        """A rollout's prompt before its first call shows it: the phase's mean so far."""
        return self._prompt_total // self._prompts if self._prompts else kv_tokens

    def _enter(self, rollout: RolloutState, new: int) -> None:
        self._bin[rollout.index] = new
        self._shift(self.loads[rollout.slot.index], new, +1)

    def _move(self, rollout: RolloutState, new: int | None) -> None:
        old = self._bin.pop(rollout.index)
        load = self.loads[rollout.slot.index]
        if new == old:
            self._bin[rollout.index] = old
            return
        self._shift(load, old, -1)
        if new is not None:
            self._enter(rollout, new)
        self._changed()

    def _shift(self, load: _EngineLoad, b: int, sign: int) -> None:
        load.counts[b] += sign
        self.running[b] += sign
        if self._due is not None:
            self._due.shifts.append((load, b, sign))
        else:
            self._project(load, b, sign)

    def _project(self, load: _EngineLoad, b: int, sign: int) -> None:
        row = self.forecast.rows[b]
        projection = load.projection
        for k, value in enumerate(row):
            projection[k] += sign * value

    def _changed(self) -> None:
        # Re-estimating costs a pass over every bin and engine: it is due once the data has
        # grown by a small fraction, often early in the phase and rarely later. Rollouts change
        # bins at every turn while admissions come in bursts, so a due re-estimate only records
        # what it reads; `refresh_forecast` computes it when an admission needs the forecast,
        # with the same result as computing it here.
        self._changes += 1
        if self._changes >= max(1, self._observations // 64):
            self._changes = 0
            self._due = _DueRefresh(
                running=list(self.running),
                finished=list(self.forecast.finished),
                counts={index: list(load.counts) for index, load in self.loads.items()},
            )

    def refresh_forecast(self) -> None:
        """Bring the forecast and the engines' projections up to date (done before every
        admission that reads them)."""
        due, self._due = self._due, None
        if due is None:
            return
        self.forecast.refresh(due.running, due.finished)
        rows = self.forecast.rows
        for index, load in self.loads.items():
            counts = due.counts[index]
            load.projection = [
                sum(n * rows[b][k] for b, n in enumerate(counts) if n)
                for k in range(self.forecast.bins)
            ]
        for load, b, sign in due.shifts:
            self._project(load, b, sign)

    # -- admission ---------------------------------------------------------------------------

    def choose(self, index: int, kv_tokens: int) -> EngineSlot | None:
        slots = self.healthy()
        capacities = {s.index: kv_capacity(s, self.fallback_capacity) for s in slots}
        if all(kv_tokens > capacity for capacity in capacities.values()):
            raise PlacementError(
                f"kv_tokens ({kv_tokens}) exceeds every engine's KV capacity "
                f"({max(capacities.values())} tokens at most)"
            )
        if self._upfront is None:
            self._upfront = self._reserved <= self.UPFRONT_RESERVATION * sum(capacities.values())
        if self._upfront:
            static = self.slots[self._static[index]] if index < len(self._static) else None
            if static is not None and static.healthy and kv_tokens <= capacities[static.index]:
                return static
            return min(
                (s for s in slots if kv_tokens <= capacities[s.index]),
                key=lambda s: (s.active, s.index),
            )
        prompt = self._typical_prompt(kv_tokens)
        floor = self._batch_floor(index, slots, capacities, prompt)
        if floor is not None:
            return floor
        empty = [s for s in slots if s.active == 0 and kv_tokens <= capacities[s.index]]
        if empty:
            return empty[0]
        self.refresh_forecast()
        row = self.forecast.rows[self.forecast.bin_of(prompt)]
        best: tuple[float, EngineSlot] | None = None
        for slot in slots:
            load = self.loads[slot.index]
            # Tokens generated in turns still running are in the engine's live usage but not
            # yet in the contexts the forecast starts from; they stay until their rollout ends.
            unseen = slot.engine.kv_stats().used_tokens + load.idle_tokens - load.projection[0]
            peak = max(p + r for p, r in zip(load.projection, row, strict=True)) + max(0, unseen)
            if peak <= (1 - self.headroom) * capacities[slot.index] and (
                best is None or peak < best[0]
            ):
                best = (peak, slot)
        return None if best is None else best[1]

    def _batch_floor(
        self, index: int, slots: Sequence[EngineSlot], capacities: dict[int, int], prompt: int
    ) -> EngineSlot | None:
        """The static split's engine for rollout ``index`` (else the one with the fewest
        rollouts) while it has a free place in its batch and its cache holds the prompt now."""

        def room(slot: EngineSlot) -> bool:
            stats = slot.engine.kv_stats()
            now = stats.used_tokens + self.loads[slot.index].idle_tokens + prompt
            return (
                stats.max_running is not None
                and self.loads[slot.index].in_engine < stats.max_running
                and now <= (1 - self.headroom) * capacities[slot.index]
            )

        preferred = self.slots[self._static[index]] if index < len(self._static) else None
        if preferred is not None and preferred.healthy and room(preferred):
            return preferred
        open_slots = [slot for slot in slots if room(slot)]
        return min(open_slots, key=lambda s: (s.active, s.index)) if open_slots else None


def make_policy(
    name: PolicyName,
    slots: Sequence[EngineSlot],
    *,
    reservation: Reservation,
    overcommit: float,
    headroom: float,
    fallback_capacity: int | None,
) -> Policy:
    if name == "static":
        return StaticPolicy(slots)
    if name == "least-loaded":
        return LeastLoadedPolicy(slots)
    if reservation == "max":
        return ReservedKVPolicy(slots, overcommit=overcommit, fallback_capacity=fallback_capacity)
    return LiveKVPolicy(slots, headroom=headroom, fallback_capacity=fallback_capacity)
