"""Asynchronous rollout production under a staleness bound: the admission rule and the turn gate.

Prompt groups are numbered in admission order; with ``B`` groups per step, group ``g`` is
trained on in step ``g // B + 1``. A group is *consumed* once the update trained on it has
reached every engine. ``StalenessBuffer`` admits a new group only while

    (eta + 1) * B - (groups admitted and not yet consumed) > 0,

so at most ``(eta + 1) * B`` groups are ever waiting for the trainer or being generated, and it
hands the trainer each step's groups in order (oldest first, a step's batch only once all its
groups are complete). A group admitted while the engines hold policy version ``v`` (``v`` steps
consumed) belongs to a step ``s <= v + eta + 1``, whose update starts from version ``s - 1``;
weights only move forward, so every token of it was sampled by a version at most ``eta``
behind the policy it trains. ``eta = 0`` admits step ``s`` only once step ``s - 1``'s weights
are on the engines: the synchronous loop.

``TurnGate`` makes weights reach an engine only between two generate calls of a rollout: while
a swap holds an engine, new calls to it wait and the calls in flight finish on the weights they
started with; the rollout's next call prefills its context on the new weights.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import ClassVar, Generic, TypeVar

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
)

T = TypeVar("T")


class StalenessBuffer(Generic[T]):
    """The admission rule of bounded-staleness RL and the trainer's queue of finished steps.

    ``max_staleness`` is eta, ``groups_per_step`` is B (prompts per step). ``start_step`` steps
    are taken as consumed already (a resumed run): admission continues with their successors.
    Values are one per step: whatever the producer made of that step's groups.
    """

    def __init__(self, max_staleness: int, groups_per_step: int, *, start_step: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if groups_per_step < 1:
            raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self.consumed_groups = start_step * groups_per_step
        self.admitted_groups = self.consumed_groups
        self._finished: dict[int, T] = {}
        self._admitted_at: dict[int, int] = {}  # step -> version when its first group came in
        self._taken: deque[int] = deque()  # steps taken whose update is not on the engines yet
        self._failure: BaseException | None = None
        self._changed = asyncio.Condition()

    @property
    def version(self) -> int:
        """The policy version on the engines: steps whose update has reached them."""
        return self.consumed_groups // self.groups_per_step

    @property
    def unconsumed(self) -> int:
        """Groups admitted and not yet consumed: generating, finished and queued, or taken by
        the trainer for an update that has not reached the engines."""
        return self.admitted_groups - self.consumed_groups

    @property
    def capacity(self) -> int:
        """``(eta + 1) * B - unconsumed``: how many groups may be admitted now."""
        return (self.max_staleness + 1) * self.groups_per_step - self.unconsumed

    @property
    def queued_groups(self) -> int:
        """Groups of finished steps waiting for the trainer."""
        return len(self._finished) * self.groups_per_step

    def step_of(self, group: int) -> int:
        return group // self.groups_per_step + 1

    def admitted_version(self, step: int) -> int:
        """The policy version on the engines when ``step``'s first group was admitted."""
        return self._admitted_at[step]

    async def admit(self, *, until_step: int) -> range:
        """Wait until a group may be admitted, then admit as many as the rule allows, up to the
        end of the first one's step and never past step ``until_step``; returns their numbers
        (empty once every group up to ``until_step`` is admitted)."""
        limit = until_step * self.groups_per_step
        async with self._changed:
            await self._changed.wait_for(lambda: self.capacity > 0 or self.admitted_groups >= limit)
            first = self.admitted_groups
            if first >= limit:
                return range(first, first)
            step_end = self.step_of(first) * self.groups_per_step
            count = min(self.capacity, step_end - first, limit - first)
            self.admitted_groups += count
            self._admitted_at.setdefault(self.step_of(first), self.version)
            return range(first, first + count)

    async def finish(self, step: int, value: T) -> None:
        """Every group of ``step`` is complete: queue ``value`` for the trainer."""
        async with self._changed:
            self._finished[step] = value
            self._changed.notify_all()

    async def fail(self, failure: BaseException) -> None:
        """The producer failed: ``take`` raises instead of waiting for steps that never come."""
        async with self._changed:
            self._failure = failure
            self._changed.notify_all()

    async def take(self) -> tuple[int, T]:
        """The next step's value, once all its groups are complete (steps in order). Steps
        taken before it need not be consumed yet (their weights may still be on the way)."""
        async with self._changed:
            step = self.version + len(self._taken) + 1
            await self._changed.wait_for(
                lambda: step in self._finished or self._failure is not None
            )
            if step not in self._finished:
                raise RuntimeError(f"rollout production failed before step {step}") from (
                    self._failure
                )
            self._taken.append(step)
            return step, self._finished.pop(step)

    async def consumed(self) -> None:
        """The update trained on the oldest taken step has reached every engine: its groups
        leave the bound, and as many new ones may be admitted."""
        async with self._changed:
            if not self._taken:
                raise RuntimeError("consumed() without a taken step")
            self._admitted_at.pop(self._taken.popleft(), None)
            self.consumed_groups += self.groups_per_step
            self._changed.notify_all()


async def produce(
    buffer: StalenessBuffer[T], run_step: Callable[[int], Awaitable[T]], *, last_step: int
) -> None:
    """Admit groups as ``buffer`` allows and run each step (``run_step(step)``) once all its
    groups are admitted, several steps at once, until step ``last_step``; each result goes to
    the buffer. A failing step cancels the others and fails the buffer's ``take`` with it.
    """

    async def run(step: int) -> None:
        await buffer.finish(step, await run_step(step))

    try:
        async with asyncio.TaskGroup() as steps:
            while True:
                groups = await buffer.admit(until_step=last_step)
                if not groups:
                    return
                step = buffer.step_of(groups.start)
                if groups.stop == step * buffer.groups_per_step:  # the step's last group
                    steps.create_task(run(step), name=f"rollouts-step-{step}")
    except BaseException as failure:
        await buffer.fail(failure)
        raise


class GatedEngine(Engine):
    """An engine seen through a ``TurnGate``: generate calls wait while a swap holds it."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    def __init__(self, gate: TurnGate, engine: Engine, index: int) -> None:
        self.name = engine.name
        self.inner = engine
        self._gate = gate
        self._index = index

    def supports(self, capability: Capability) -> bool:
        return self.inner.supports(capability)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        gate = self._gate
        await gate.enter(self._index)
        try:
            return await self.inner.generate(request)
        finally:
            gate.leave(self._index)

    def kv_stats(self) -> KVStats:
        return self.inner.kv_stats()

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        async with self._gate.hold([self._index]):
            await self.inner.update_weights(weights, version=version)

    async def reset_prefix_cache(self) -> None:
        await self.inner.reset_prefix_cache()

    async def sleep(self, level: int = 1) -> None:
        await self.inner.sleep(level)

    async def wake_up(self) -> None:
        await self.inner.wake_up()

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()


class TurnGate:
    """Holds engines for weight swaps at turn boundaries, and counts their busy time.

    Give ``gate.engines`` (one ``GatedEngine`` per engine) to the rollout scheduler, and swap
    weights inside ``async with gate.hold(indices)``. An engine is busy while at least one
    generate call to it is in flight (the scheduler's definition), so ``busy_s`` over a span of
    time gives the engines' idle fraction in it.
    """

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = [GatedEngine(self, engine, i) for i, engine in enumerate(engines)]
        count = len(self.engines)
        self._in_flight = [0] * count
        self._held = [0] * count
        self._busy_total = [0.0] * count
        self._busy_since: list[float | None] = [None] * count
        # Replaced at every change; waiters re-check their condition when it fires (a broadcast
        # that needs no lock, so a call's bookkeeping never suspends it).
        self._changed = asyncio.Event()

    @property
    def inner(self) -> list[Engine]:
        return [engine.inner for engine in self.engines]

    def in_flight(self) -> int:
        """Generate calls in flight over all engines."""
        return sum(self._in_flight)

    def busy_s(self) -> list[float]:
        """Seconds each engine has been busy since the gate was made (up to now)."""
        now = asyncio.get_running_loop().time()
        return [
            total + (now - since if since is not None else 0.0)
            for total, since in zip(self._busy_total, self._busy_since, strict=True)
        ]

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.wait()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def enter(self, index: int) -> None:
        await self._until(lambda: not self._held[index])
        if self._in_flight[index] == 0:
            self._busy_since[index] = asyncio.get_running_loop().time()
        self._in_flight[index] += 1

    def leave(self, index: int) -> None:
        self._in_flight[index] -= 1
        if self._in_flight[index] == 0:
            since = self._busy_since[index]
            assert since is not None
            self._busy_total[index] += asyncio.get_running_loop().time() - since
            self._busy_since[index] = None
            self._signal()

    @asynccontextmanager
    async def hold(self, indices: Sequence[int] | None = None) -> AsyncIterator[None]:
        """Stop new generate calls to these engines (default: all), wait for their calls in
        flight to return, and yield; calls held meanwhile go on once the block ends."""
        chosen = list(range(len(self.engines))) if indices is None else list(indices)
        for index in chosen:
            self._held[index] += 1
        try:
            await self._until(lambda: all(self._in_flight[index] == 0 for index in chosen))
            yield
        finally:
            self._release(chosen)

    def _release(self, chosen: list[int]) -> None:
        for index in chosen:
            self._held[index] -= 1
        self._signal()
