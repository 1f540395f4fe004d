"""Metrics of one rollout phase: makespan, engine busy and idle time, KV usage, preemptions.

An engine counts as busy while at least one ``generate`` call to it is in flight (its queue or
batch holds work) and idle otherwise, for instance while all its rollouts wait on tool calls or
after its share of the phase is done. The time a rollout spends off the engine between two turns
is its tool-call latency (plus the agent's own bookkeeping).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.engine import Engine


class LatencySummary(BaseModel):
    """Distribution of a set of durations, in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=0)
    mean_s: float = 0.0
    p50_s: float = 0.0
    p90_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencySummary:
        if not samples:
            return cls(count=0)
        ordered = sorted(samples)

        def quantile(q: float) -> float:
            return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

        return cls(
            count=len(ordered),
            mean_s=sum(ordered) / len(ordered),
            p50_s=quantile(0.5),
            p90_s=quantile(0.9),
            p99_s=quantile(0.99),
            max_s=ordered[-1],
        )


class EngineMetrics(BaseModel):
    """One engine over one rollout phase; times are seconds from the start of the phase."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    rollouts: int = Field(ge=0, description="Rollouts the scheduler assigned to it.")
    busy_s: float = Field(ge=0)
    idle_s: float = Field(ge=0, description="Makespan minus busy time.")
    preemptions: int = Field(ge=0, description="Preemptions the engine reported in the phase.")
    kv_usage_mean: float = Field(ge=0, le=1, description="Time-averaged KV cache usage.")
    kv_usage_peak: float = Field(ge=0, le=1)
    busy_intervals: list[tuple[float, float]] = Field(description="(start, end) of busy spans.")
    kv_timeline: list[tuple[float, float]] = Field(description="(time, usage) samples.")

    @property
    def idle_fraction(self) -> float:
        total = self.busy_s + self.idle_s
        return self.idle_s / total if total else 0.0


class PhaseMetrics(BaseModel):
    """A rollout phase under one scheduling policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    rollouts: int = Field(ge=0)
    failed: int = Field(ge=0, description="Rollouts that ended with an error.")
    makespan_s: float = Field(ge=0, description="From the phase start to the last rollout end.")
    engines: list[EngineMetrics]
    tool_latency: LatencySummary = Field(
        description="Time rollouts spent off their engine between two turns."
    )

    @property
    def busy_s(self) -> float:
        return sum(e.busy_s for e in self.engines)

    @property
    def idle_s(self) -> float:
        return sum(e.idle_s for e in self.engines)

    @property
    def idle_fraction(self) -> float:
        total = self.busy_s + self.idle_s
        return self.idle_s / total if total else 0.0

    @property
    def preemptions(self) -> int:
        return sum(e.preemptions for e in self.engines)

    @property
    def kv_usage_mean(self) -> float:
        return sum(e.kv_usage_mean for e in self.engines) / len(self.engines)

    @property
    def balanced_s(self) -> float:
        """Busy time spread evenly over the engines: the makespan with perfect balance."""
        return self.busy_s / len(self.engines)


class EngineActivity:
    """Busy spans and KV samples of one engine, fed by the scheduler as calls start and end."""

    def __init__(self, engine: Engine, origin: float) -> None:
        self.engine = engine
        self.origin = origin
        self.rollouts = 0
        self.in_flight = 0
        self.busy_intervals: list[tuple[float, float]] = []
        self.kv_timeline: list[tuple[float, float]] = []
        self._busy_since = 0.0
        self._preemptions_at_start = engine.kv_stats().preemptions

    def begin(self, now: float) -> None:
        if self.in_flight == 0:
            self._busy_since = now - self.origin
        self.in_flight += 1

    def end(self, now: float) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.busy_intervals.append((self._busy_since, now - self.origin))

    def sample(self, now: float) -> None:
        self.kv_timeline.append((now - self.origin, self.engine.kv_stats().usage))

    def report(self, makespan: float) -> EngineMetrics:
        busy = sum(end - start for start, end in self.busy_intervals)
        samples = [usage for t, usage in self.kv_timeline if t <= makespan] or [0.0]
        return EngineMetrics(
            name=self.engine.name,
            rollouts=self.rollouts,
            busy_s=busy,
            idle_s=max(0.0, makespan - busy),
            preemptions=self.engine.kv_stats().preemptions - self._preemptions_at_start,
            kv_usage_mean=sum(samples) / len(samples),
            kv_usage_peak=max(samples),
            busy_intervals=self.busy_intervals,
            kv_timeline=self.kv_timeline,
        )
