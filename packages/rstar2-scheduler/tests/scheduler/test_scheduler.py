"""RolloutScheduler: placement per policy, stickiness, bounded concurrency, failures, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, defaultdict

import pytest
from pydantic import ValidationError

from rstar2_scheduler import (
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    RolloutJob,
    RolloutScheduler,
    SamplingParams,
    SchedulerConfig,
)
from rstar2_scheduler.sim import LogNormal, SimEngine, SimEngineConfig, run_virtual


class RecordingEngine(SimEngine):
    """A SimEngine that remembers which requests it served."""

    def __init__(self, name: str, **config: object) -> None:
        defaults: dict[str, object] = {"output_tokens": LogNormal(median=20, sigma=0.5)}
        super().__init__(SimEngineConfig(**{**defaults, **config}), name=name)  # type: ignore[arg-type]
        self.served: list[str] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.served.append(request.request_id)
        return await super().generate(request)


class BrokenEngine(Engine):
    """Fails every request, as an engine whose worker died would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        await asyncio.sleep(0.01)
        return GenerationResult(
            request_id=request.request_id,
            token_ids=(),
            logprobs=(),
            finish_reason="error",
            error="worker died",
        )

    def kv_stats(self) -> KVStats:
        return KVStats(capacity_tokens=0, used_tokens=0)


def turns_job(
    key: str, turns: int, *, kv_tokens: int = 1000, pause: float = 0.3, max_new: int = 64
) -> RolloutJob[str]:
    """A multi-turn rollout: generate, wait on a 'tool', generate again on the same engine."""

    async def run(engine: Engine) -> str:
        ids: tuple[int, ...] = (1, 2, 3, 4)
        for turn in range(turns):
            result = await engine.generate(
                GenerationRequest(
                    request_id=f"{key}/{turn}",
                    prompt_ids=ids,
                    sampling=SamplingParams(
                        max_new_tokens=max_new, seed=hash((key, turn)) % 10_000
                    ),
                )
            )
            if result.finish_reason == "error":
                raise RuntimeError(result.error)
            ids += result.token_ids
            await asyncio.sleep(pause)
        return engine.name

    return RolloutJob(run=run, kv_tokens=kv_tokens, key=key)


def run_phase(
    engines: list[Engine], jobs: list[RolloutJob[str]], **settings: object
) -> list[tuple[str | None, str | None]]:
    async def main() -> list[tuple[str | None, str | None]]:
        async with RolloutScheduler(engines, **settings) as scheduler:
            phase = await scheduler.run(jobs)
        return [(r.engine, r.error) for r in phase.results]

    return run_virtual(main())


def test_static_split_is_even_and_contiguous() -> None:
    engines: list[Engine] = [RecordingEngine(f"e{i}") for i in range(3)]
    jobs = [turns_job(f"j{i:02d}", 1) for i in range(10)]
    placed = [engine for engine, _ in run_phase(engines, jobs, policy="static")]
    counts = Counter(placed)
    assert sorted(counts.values()) == [3, 3, 4]
    # Contiguous blocks: the placement never returns to an engine it left.
    changes = [a for a, b in itertools.pairwise(placed) if a != b]
    assert len(changes) == 2


POLICIES = [
    {"policy": "static"},
    {"policy": "least-loaded"},
    {"policy": "kv-aware", "reservation": "live"},
    {"policy": "kv-aware", "reservation": "max"},
]


@pytest.mark.parametrize("settings", POLICIES, ids=lambda s: "/".join(s.values()))
def test_every_turn_of_a_rollout_stays_on_its_engine(settings: dict[str, str]) -> None:
    engines = [RecordingEngine(f"e{i}") for i in range(3)]
    jobs = [turns_job(f"j{i}", turns=4) for i in range(12)]
    results = run_phase(list(engines), jobs, **settings)
    assert all(error is None for _, error in results)
    served_by: dict[str, set[str]] = defaultdict(set)
    for engine in engines:
        for request_id in engine.served:
            served_by[request_id.split("/")[0]].add(engine.name)
    for (engine_name, _), job in zip(results, jobs, strict=True):
        assert served_by[job.key] == {engine_name}
    assert sum(len(e.served) for e in engines) == 12 * 4


def test_kv_aware_max_never_reserves_beyond_capacity_times_overcommit() -> None:
    # 4096-token engines with over-commit 1.5 hold 6144 reserved tokens: 6 rollouts of 1000.
    engines = [RecordingEngine(f"e{i}", num_blocks=256, block_size=16) for i in range(2)]
    reserved: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    def tracked(job: RolloutJob[str]) -> RolloutJob[str]:
        async def run(engine: Engine) -> str:
            reserved[engine.name] += job.kv_tokens
            peak[engine.name] = max(peak[engine.name], reserved[engine.name])
            try:
                return await job.run(engine)
            finally:
                reserved[engine.name] -= job.kv_tokens

        return RolloutJob(run=run, kv_tokens=job.kv_tokens, key=job.key)

    jobs = [tracked(turns_job(f"j{i}", turns=2)) for i in range(40)]
    results = run_phase(list(engines), jobs, policy="kv-aware", reservation="max", overcommit=1.5)
    assert all(error is None for _, error in results)
    assert dict(peak) == {"e0": 6000, "e1": 6000}  # filled to the budget, never past it


@pytest.mark.parametrize("reservation", ["live", "max"])
def test_kv_aware_rejects_a_rollout_no_engine_can_hold(reservation: str) -> None:
    engines: list[Engine] = [RecordingEngine("e0", num_blocks=256, block_size=16)]
    jobs = [turns_job("small", 1, kv_tokens=500), turns_job("huge", 1, kv_tokens=5000)]
    results = run_phase(engines, jobs, policy="kv-aware", reservation=reservation, overcommit=1)
    assert results[0] == ("e0", None)
    engine, error = results[1]
    assert engine is None
    assert error is not None
    assert "kv_tokens (5000) exceeds every engine's KV" in error


def concurrency_tracked(jobs: list[RolloutJob[str]]) -> tuple[list[RolloutJob[str]], list[int]]:
    """The jobs, and the number of rollouts running as each of them started."""
    running = 0
    at_start: list[int] = []

    def tracked(job: RolloutJob[str]) -> RolloutJob[str]:
        async def run(engine: Engine) -> str:
            nonlocal running
            running += 1
            at_start.append(running)
            try:
                return await job.run(engine)
            finally:
                running -= 1

        return RolloutJob(run=run, kv_tokens=job.kv_tokens, key=job.key)

    return [tracked(job) for job in jobs], at_start


class UnknownBatchEngine(RecordingEngine):
    """Reports no batch limit, so kv-aware admits by its forecast alone (no batch floor)."""

    def kv_stats(self) -> KVStats:
        return super().kv_stats().model_copy(update={"max_running": None})


def test_kv_aware_live_learns_footprints_and_admits_as_the_cache_frees() -> None:
    # A 4,096-token cache, rollouts that may reach 2,000 tokens but use ~70: at first only
    # one fits the 10% headroom; once enough have finished, the forecast lets several share it
    # (the unsure tail of a forecast from a few dozen rollouts still counts at 2,000 tokens).
    engines: list[Engine] = [UnknownBatchEngine("e0", num_blocks=256, block_size=16)]
    jobs, at_start = concurrency_tracked(
        [turns_job(f"j{i}", turns=2, kv_tokens=2000) for i in range(120)]
    )
    results = run_phase(engines, jobs, policy="kv-aware", reservation="live", kv_headroom=0.1)
    assert all(error is None for _, error in results)
    assert at_start[:16] == [1] * 16
    assert max(at_start) >= 6
    assert engines[0].kv_stats().preemptions == 0


def test_kv_aware_live_runs_a_rollout_that_needs_most_of_the_cache() -> None:
    engines: list[Engine] = [
        RecordingEngine("e0", num_blocks=256, output_tokens=LogNormal(median=5000, sigma=0))
    ]
    # 60 x 600 + 3,600 reserved tokens: above 8.6 x the 4,096-token cache, so the forecast
    # places them (a smaller phase would be placed at once, the big rollout with it).
    small = [turns_job(f"s{i}", turns=1, kv_tokens=600, max_new=60) for i in range(60)]
    big = turns_job("big", turns=1, kv_tokens=3600, max_new=3500)
    results = run_phase(engines, [*small[:40], big, *small[40:]], policy="kv-aware")
    assert results == [("e0", None)] * 61


def test_kv_aware_needs_a_capacity_when_the_engine_reports_none() -> None:
    engines: list[Engine] = [BrokenEngine("blind")]
    results = run_phase(engines, [turns_job("j", 1)], policy="kv-aware")
    assert results[0][1] is not None
    assert "reports no KV capacity" in results[0][1]
    results = run_phase(engines, [turns_job("j", 1)], policy="kv-aware", capacity_tokens=4096)
    assert results[0] == ("blind", "RuntimeError: worker died")


def test_least_loaded_hands_new_rollouts_to_the_engine_with_fewest() -> None:
    engines: list[Engine] = [RecordingEngine(f"e{i}") for i in range(2)]
    jobs = [
        turns_job("long", turns=20),  # e0 (tie goes to the first engine)
        turns_job("short", turns=1),  # e1
        turns_job("next", turns=1),  # waits for a slot; e1 is then empty, e0 still busy
    ]
    placed = [
        engine for engine, _ in run_phase(engines, jobs, policy="least-loaded", max_concurrency=2)
    ]
    assert placed == ["e0", "e1", "e1"]


@pytest.mark.parametrize("policy", ["static", "least-loaded", "kv-aware"])
def test_concurrency_is_bounded(policy: str) -> None:
    engines: list[Engine] = [RecordingEngine(f"e{i}") for i in range(2)]
    in_flight = 0
    peak = 0

    def counted(job: RolloutJob[str]) -> RolloutJob[str]:
        async def run(engine: Engine) -> str:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await job.run(engine)
            finally:
                in_flight -= 1

        return RolloutJob(run=run, kv_tokens=job.kv_tokens, key=job.key)

    results = run_phase(
        engines,
        [counted(turns_job(f"j{i}", 2)) for i in range(15)],
        policy=policy,
        max_concurrency=3,
    )
    assert all(error is None for _, error in results)
    assert peak == 3


def test_an_erroring_engine_fails_only_its_own_rollouts() -> None:
    broken = BrokenEngine("broken")
    engines: list[Engine] = [broken, RecordingEngine("good")]
    jobs = [turns_job(f"j{i}", turns=2) for i in range(20)]
    results = run_phase(
        engines,
        jobs,
        policy="least-loaded",
        max_concurrency=4,
        max_consecutive_engine_errors=2,
    )
    failed = [(engine, error) for engine, error in results if error is not None]
    assert failed == [("broken", "RuntimeError: worker died")] * 2
    # After two errors in a row the broken engine gets nothing more; the rest run on the good one.
    assert broken.calls == 2
    assert [engine for engine, error in results if error is None] == ["good"] * 18


def test_static_keeps_its_split_even_when_an_engine_breaks() -> None:
    engines: list[Engine] = [BrokenEngine("broken"), RecordingEngine("good")]
    results = run_phase(engines, [turns_job(f"j{i}", 1) for i in range(6)], policy="static")
    assert [error is None for _, error in results] == [False] * 3 + [True] * 3


def test_a_rollout_that_raises_fails_alone_and_results_keep_submission_order() -> None:
    async def explode(engine: Engine) -> str:
        await asyncio.sleep(0.1)
        raise ValueError("bad tool output")

    jobs = [turns_job("a", 2), RolloutJob(run=explode, kv_tokens=100, key="b"), turns_job("c", 1)]
    engines: list[Engine] = [RecordingEngine("e0")]
    seen: list[str] = []

    async def main() -> list[tuple[str, str | None]]:
        async with RolloutScheduler(engines, policy="kv-aware") as scheduler:
            phase = await scheduler.run(jobs, on_result=lambda r: seen.append(r.key))
        return [(r.key, r.error) for r in phase.results]

    results = run_virtual(main())
    assert results == [("a", None), ("b", "ValueError: bad tool output"), ("c", None)]
    assert sorted(seen) == ["a", "b", "c"]
    assert seen.index("b") < seen.index("a")  # reported as it finished


def test_cancelling_a_phase_leaves_no_task_and_frees_the_cache() -> None:
    engines = [
        RecordingEngine(f"e{i}", output_tokens=LogNormal(median=5000, sigma=0)) for i in range(2)
    ]
    jobs = [turns_job(f"j{i}", turns=3, max_new=4000) for i in range(8)]

    async def main() -> tuple[set[asyncio.Task[object]], list[int]]:
        scheduler = RolloutScheduler(list(engines), policy="least-loaded")
        phase = asyncio.create_task(scheduler.run(jobs))
        await asyncio.sleep(5.0)
        assert any(e.kv_stats().running for e in engines)
        phase.cancel()
        with pytest.raises(asyncio.CancelledError):
            await phase
        used = [e.kv_stats().used_tokens for e in engines]
        await scheduler.close()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        return others, used  # type: ignore[return-value]

    others, used = run_virtual(main())
    assert others == set()
    assert used == [0, 0]


def test_bad_settings_name_the_field() -> None:
    engines: list[Engine] = [RecordingEngine("e0")]
    with pytest.raises(ValidationError, match="overcommit"):
        RolloutScheduler(engines, overcommit=0)
    with pytest.raises(ValidationError, match="policy"):
        RolloutScheduler(engines, policy="round-robin")
    with pytest.raises(ValueError, match="kv_tokens must be > 0"):
        turns_job("j", 1, kv_tokens=0)
    with pytest.raises(ValueError, match="engine names must be unique"):
        RolloutScheduler([RecordingEngine("same"), RecordingEngine("same")])
    config = SchedulerConfig(policy="static", max_concurrency=2)
    assert RolloutScheduler(engines, config, max_concurrency=5).config == SchedulerConfig(
        policy="static", max_concurrency=5
    )


class RaisingEngine(BrokenEngine):
    """Raises instead of returning an error result, as a buggy engine might."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        raise ConnectionError("connection reset")


def test_an_engine_that_raises_is_taken_out_of_service_too() -> None:
    raising = RaisingEngine("raising")
    engines: list[Engine] = [raising, RecordingEngine("good")]
    results = run_phase(
        engines,
        [turns_job(f"j{i}", 1) for i in range(8)],
        policy="least-loaded",
        max_concurrency=2,
        max_consecutive_engine_errors=1,
    )
    assert [error for _, error in results].count("ConnectionError: connection reset") == 1
    assert raising.calls == 1


def test_a_rollout_cancelling_its_own_request_is_no_engine_error() -> None:
    def impatient(key: str) -> RolloutJob[str]:
        patient = turns_job(key, 1)

        async def run(engine: Engine) -> str:
            request = GenerationRequest(
                request_id=f"{key}/hasty",
                prompt_ids=(1, 2, 3),
                sampling=SamplingParams(max_new_tokens=64, seed=1),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1e-4):
                    await engine.generate(request)
            return await patient.run(engine)

        return RolloutJob(run=run, kv_tokens=1000, key=key)

    engines: list[Engine] = [RecordingEngine("e0"), RecordingEngine("e1")]
    results = run_phase(
        engines,
        [impatient(f"j{i}") for i in range(6)],
        policy="least-loaded",
        max_concurrency=2,
        max_consecutive_engine_errors=1,
    )
    assert all(error is None for _, error in results)
    assert {engine for engine, _ in results} == {"e0", "e1"}
