"""Phase metrics: busy and idle time, tool-call gaps, KV samples, preemptions, makespan."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_scheduler import Engine, GenerationRequest, RolloutJob, RolloutScheduler, SamplingParams
from rstar2_scheduler.metrics import LatencySummary, PhaseMetrics
from rstar2_scheduler.sim import LogNormal, SimEngine, SimEngineConfig, run_virtual


def two_turns(tool_s: float) -> RolloutJob[None]:
    async def run(engine: Engine) -> None:
        ids: tuple[int, ...] = (1,) * 32
        for turn in range(2):
            result = await engine.generate(
                GenerationRequest(
                    request_id=f"t{turn}",
                    prompt_ids=ids,
                    sampling=SamplingParams(max_new_tokens=500, seed=turn),
                )
            )
            ids += result.token_ids
            if turn == 0:
                await asyncio.sleep(tool_s)

    return RolloutJob(run=run, kv_tokens=600)


def test_busy_idle_and_tool_gap_of_one_rollout() -> None:
    config = SimEngineConfig(output_tokens=LogNormal(median=100, sigma=0))
    engines: list[Engine] = [SimEngine(config, name="e0"), SimEngine(config, name="e1")]

    async def main() -> PhaseMetrics:
        async with RolloutScheduler(engines, policy="static", kv_sample_interval_s=0.1) as s:
            return (await s.run([two_turns(tool_s=5.0)])).metrics

    metrics = run_virtual(main())
    e0, e1 = metrics.engines
    assert (e0.rollouts, e1.rollouts) == (1, 0)
    assert len(e0.busy_intervals) == 2
    assert e0.idle_s == pytest.approx(5.0)
    assert e0.busy_s + e0.idle_s == pytest.approx(metrics.makespan_s)
    assert e1.busy_s == 0.0
    assert e1.idle_fraction == 1.0
    assert metrics.idle_s == pytest.approx(5.0 + metrics.makespan_s)
    assert metrics.tool_latency.count == 1
    assert metrics.tool_latency.mean_s == pytest.approx(5.0)
    assert e0.kv_usage_peak > 0
    assert e1.kv_usage_peak == 0
    assert metrics.balanced_s == pytest.approx(e0.busy_s / 2)
    assert metrics.failed == 0


def test_preemptions_in_the_phase_are_counted() -> None:
    config = SimEngineConfig(
        num_blocks=64, block_size=16, output_tokens=LogNormal(median=400, sigma=0)
    )
    engine = SimEngine(config, name="tight")
    jobs = [two_turns(tool_s=0.1) for _ in range(6)]

    async def main() -> PhaseMetrics:
        async with RolloutScheduler([engine], policy="least-loaded") as s:
            return (await s.run(jobs)).metrics

    metrics = run_virtual(main())
    assert metrics.preemptions == engine.counters.preemptions > 0
    assert metrics.engines[0].kv_usage_peak <= 1.0


def test_latency_summary_quantiles() -> None:
    summary = LatencySummary.of([float(x) for x in range(1, 101)])
    assert (summary.count, summary.p50_s, summary.p90_s, summary.p99_s, summary.max_s) == (
        100,
        50.0,
        90.0,
        99.0,
        100.0,
    )
    assert summary.mean_s == pytest.approx(50.5)
    assert LatencySummary.of([]).count == 0
