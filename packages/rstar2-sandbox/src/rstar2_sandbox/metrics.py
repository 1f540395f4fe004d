"""Prometheus metrics of one service instance (its own registry, so apps never share counters)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rstar2_sandbox.dispatch import DispatcherStats
from rstar2_sandbox.models import RunResult

LATENCY_BUCKETS = (
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class _StatsCollector(Collector):
    """Reads the dispatcher's snapshot at scrape time."""

    def __init__(self, stats: Callable[[], DispatcherStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        for name, value, text in (
            ("queue_depth", stats.queue_depth, "Calls waiting for a slot."),
            ("queue_limit", stats.queue_limit, "Waiting calls allowed before 503."),
            ("in_flight", stats.in_flight, "Calls running now."),
            ("workers", stats.workers, "Execution processes up."),
            ("slots", stats.slots, "Calls that can run at once."),
            ("executor_restarts", stats.restarts, "Executors restarted after dying."),
        ):
            yield GaugeMetricFamily(f"rstar2_sandbox_{name}", text, value=value)


class Metrics:
    """Counters and histograms the HTTP layer updates, plus gauges read from the dispatcher."""

    def __init__(self, stats: Callable[[], DispatcherStats]) -> None:
        self.registry = CollectorRegistry()
        self.completed = Counter(
            "rstar2_sandbox_calls",
            "Calls completed, by API and status.",
            ["api", "status"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "rstar2_sandbox_rejected",
            "Calls refused because the queue was full.",
            ["api"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "rstar2_sandbox_call_latency_seconds",
            "Time from acceptance to result (queueing included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StatsCollector(stats))

    def observe(self, api: str, result: RunResult, seconds: float) -> None:
        """Count one completed call."""
        self.completed.labels(api=api, status=result.status.value).inc()
        self.latency.observe(seconds)
