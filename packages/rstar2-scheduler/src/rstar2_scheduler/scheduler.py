"""``RolloutScheduler``: runs a phase of rollouts over several engines under a placement policy.

The scheduler is generic over what a rollout is: a ``RolloutJob`` is a coroutine function that
receives the ``Engine`` it was placed on and may call ``generate`` on it any number of times (a
multi-turn rollout with tool calls in between). Every turn of a rollout stays on its engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.engine import Engine, GenerationRequest, GenerationResult, KVStats
from rstar2_scheduler.metrics import EngineActivity, LatencySummary, PhaseMetrics
from rstar2_scheduler.policies import (
    EngineSlot,
    PlacementError,
    Policy,
    PolicyName,
    Reservation,
    RolloutState,
    make_policy,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class SchedulerConfig(BaseModel):
    """How a ``RolloutScheduler`` places and bounds rollouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: PolicyName = Field(default="kv-aware", description="Placement policy.")
    max_concurrency: int | None = Field(
        default=None, gt=0, description="Most rollouts in flight over all engines; None: no cap."
    )
    reservation: Reservation = Field(
        default="live",
        description=(
            "kv-aware admission. 'live': from each engine's KV usage and the rollout footprints "
            "forecast during the phase; 'max': a fixed prompt + max response per rollout."
        ),
    )
    overcommit: float = Field(
        default=1 / 0.7,
        gt=0,
        description="kv-aware 'max': reservations may add up to this many times the KV capacity.",
    )
    kv_headroom: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="kv-aware 'live': fraction of each engine's KV capacity admission keeps free.",
    )
    capacity_tokens: int | None = Field(
        default=None, gt=0, description="kv-aware: KV capacity of engines that report none."
    )
    max_consecutive_engine_errors: int | None = Field(
        default=3,
        gt=0,
        description="Stop placing rollouts on an engine after this many errors in a row.",
    )
    kv_sample_interval_s: float = Field(
        default=1.0, gt=0, description="How often to sample each engine's KV usage."
    )


@dataclass(frozen=True)
class RolloutJob(Generic[T]):
    """One rollout: ``run(engine)`` does all its turns on the engine it is given.

    ``kv_tokens`` is the KV cache it may come to hold: prompt plus maximum response tokens.
    """

    run: Callable[[Engine], Awaitable[T]]
    kv_tokens: int
    key: str = ""

    def __post_init__(self) -> None:
        if self.kv_tokens <= 0:
            raise ValueError(f"RolloutJob.kv_tokens must be > 0, got {self.kv_tokens}")


@dataclass(frozen=True)
class JobResult(Generic[T]):
    """The outcome of one rollout; times are seconds from the start of the phase."""

    index: int
    key: str
    engine: str | None
    value: T | None
    error: str | None
    started_s: float
    finished_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RolloutPhase(Generic[T]):
    """Every rollout's result, in submission order, and the phase's metrics."""

    results: list[JobResult[T]]
    metrics: PhaseMetrics


class _PlacedEngine(Engine):
    """The view of an engine a rollout gets: it records activity, gaps, engine errors, and the
    rollout's context for the policy."""

    def __init__(self, run: _PhaseRun, rollout: RolloutState) -> None:
        self.name = rollout.slot.engine.name
        self._run = run
        self._rollout = rollout
        self._slot = rollout.slot
        self._last_end: float | None = None
        self._calls = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        activity = self._run.activity[self._slot.index]
        now = loop.time()
        if self._last_end is not None:
            self._run.gaps.append(now - self._last_end)
        activity.begin(now)
        policy, rollout = self._run.policy, self._rollout
        context = len(request.prompt_ids)
        self._calls += 1
        policy.track(rollout, context_tokens=context, generating=True)
        try:
            result = await self._slot.engine.generate(request)
            context += len(result.token_ids)
        except Exception:
            self._run.record_engine_outcome(self._slot, failed=True)
            raise
        finally:
            # A cancelled call is the caller's doing: it ends the busy span but is no error.
            self._last_end = loop.time()
            activity.end(self._last_end)
            self._calls -= 1
            policy.track(rollout, context_tokens=context, generating=self._calls > 0)
            self._run.changed.set()  # the engine's cache may have room for a waiting rollout
        self._run.record_engine_outcome(self._slot, failed=result.finish_reason == "error")
        return result

    def kv_stats(self) -> KVStats:
        return self._slot.engine.kv_stats()


class _PhaseRun:
    """The mutable state of one ``RolloutScheduler.run`` call."""

    def __init__(self, scheduler: RolloutScheduler, origin: float) -> None:
        self.config = config = scheduler.config
        self.origin = origin
        self.slots = [EngineSlot(i, engine) for i, engine in enumerate(scheduler.engines)]
        self.policy: Policy = make_policy(
            config.policy,
            self.slots,
            reservation=config.reservation,
            overcommit=config.overcommit,
            headroom=config.kv_headroom,
            fallback_capacity=config.capacity_tokens,
        )
        self.activity = [EngineActivity(engine, origin) for engine in scheduler.engines]
        self.gaps: list[float] = []
        self.changed = asyncio.Event()
        self.in_flight = 0

    def record_engine_outcome(self, slot: EngineSlot, *, failed: bool) -> None:
        slot.consecutive_errors = slot.consecutive_errors + 1 if failed else 0
        limit = self.config.max_consecutive_engine_errors
        if failed and slot.healthy and limit is not None and slot.consecutive_errors >= limit:
            slot.healthy = False
            logger.warning(
                "engine %r failed %d requests in a row; no new rollouts go to it this phase",
                slot.engine.name,
                slot.consecutive_errors,
            )

    async def sample_kv(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for activity in self.activity:
                activity.sample(loop.time())
            # Engines that refresh their statistics on their own may have freed cache meanwhile.
            self.changed.set()
            await asyncio.sleep(self.config.kv_sample_interval_s)


class RolloutScheduler:
    """Places rollouts on engines under a policy and runs them with bounded concurrency.

    ``RolloutScheduler(engines, policy="kv-aware", reservation="live")``: keyword settings are
    fields of ``SchedulerConfig`` and override ``config``. Engines are started by ``run`` and
    closed by ``close`` (or leaving ``async with``).
    """

    def __init__(
        self, engines: Sequence[Engine], config: SchedulerConfig | None = None, **settings: Any
    ) -> None:
        if not engines:
            raise ValueError("RolloutScheduler needs at least one engine")
        names = [engine.name for engine in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        base = config.model_dump() if config is not None else {}
        self.config = SchedulerConfig.model_validate({**base, **settings})
        self.engines = list(engines)

    async def __aenter__(self) -> RolloutScheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(engine.close() for engine in self.engines))

    async def run(
        self,
        jobs: Iterable[RolloutJob[T]],
        *,
        on_result: Callable[[JobResult[T]], None] | None = None,
    ) -> RolloutPhase[T]:
        """Run every job to completion; a failing job or engine fails only its own rollouts.

        Cancelling ``run`` cancels every rollout in flight and returns once they have unwound.
        """
        queue = list(jobs)
        await asyncio.gather(*(engine.start() for engine in self.engines))
        loop = asyncio.get_running_loop()
        state = _PhaseRun(self, loop.time())
        policy = state.policy
        if queue:
            policy.prepare([job.kv_tokens for job in queue])
        results: list[JobResult[T] | None] = [None] * len(queue)

        def finish(result: JobResult[T]) -> None:
            results[result.index] = result
            if on_result is not None:
                on_result(result)

        async def run_one(index: int, job: RolloutJob[T], rollout: RolloutState) -> None:
            slot = rollout.slot
            started = loop.time() - state.origin
            value: T | None = None
            error: str | None = None
            completed = False
            try:
                value = await job.run(_PlacedEngine(state, rollout))
                completed = True
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "rollout %s on %r failed: %s", job.key or index, slot.engine.name, error
                )
            finally:
                slot.active -= 1
                slot.reserved_tokens -= job.kv_tokens
                policy.finished(rollout, ok=completed)
                state.in_flight -= 1
                state.changed.set()
            finish(
                JobResult(
                    index,
                    job.key,
                    slot.engine.name,
                    value,
                    error,
                    started,
                    loop.time() - state.origin,
                )
            )

        limit = self.config.max_concurrency
        pending = deque(enumerate(queue))
        async with asyncio.TaskGroup() as group:
            sampler = group.create_task(state.sample_kv())
            while pending:
                index, job = pending[0]
                slot: EngineSlot | None = None
                if limit is None or state.in_flight < limit:
                    try:
                        slot = policy.choose(index, job.kv_tokens)
                    except PlacementError as exc:
                        pending.popleft()
                        now = loop.time() - state.origin
                        finish(JobResult(index, job.key, None, None, str(exc), now, now))
                        continue
                if slot is None:
                    state.changed.clear()
                    await state.changed.wait()
                    continue
                pending.popleft()
                slot.active += 1
                slot.reserved_tokens += job.kv_tokens
                state.in_flight += 1
                state.activity[slot.index].rollouts += 1
                rollout = RolloutState(index, slot, job.kv_tokens)
                policy.admitted(rollout)
                group.create_task(run_one(index, job, rollout), name=f"rollout-{job.key or index}")
            while state.in_flight:
                state.changed.clear()
                await state.changed.wait()
            sampler.cancel()

        done = [result for result in results if result is not None]
        makespan = max((r.finished_s for r in done), default=0.0)
        metrics = PhaseMetrics(
            policy=self.config.policy,
            rollouts=len(done),
            failed=sum(1 for r in done if not r.ok),
            makespan_s=makespan,
            engines=[activity.report(makespan) for activity in state.activity],
            tool_latency=LatencySummary.of(state.gaps),
        )
        return RolloutPhase(done, metrics)
