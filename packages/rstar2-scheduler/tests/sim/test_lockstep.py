"""Turn-synchronous rollouts: an engine's rollouts take every turn and tool call together."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_scheduler.sim import (
    LockstepError,
    LogNormal,
    SimEngine,
    SimEngineConfig,
    TurnBarrier,
    Workload,
    WorkloadConfig,
    engine_barriers,
    run_virtual,
)

WORKLOAD = WorkloadConfig(
    prompts=2,
    rollouts_per_prompt=6,
    response_budget=2048,
    max_turns=4,
    turn_tokens=LogNormal(median=200, sigma=1.0),
)


def test_a_round_waits_for_every_member_and_not_for_those_who_left() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        barrier = TurnBarrier()
        events: list[tuple[str, float]] = []

        async def member(name: str, work: float, rounds: int) -> None:
            barrier.join()
            try:
                for _ in range(rounds):
                    await asyncio.sleep(work)
                    await barrier.wait()
                    events.append((name, loop.time()))
            finally:
                barrier.leave()

        # "quick" runs one round then leaves; "slow" sets the pace of every round it is in.
        await asyncio.gather(member("quick", 1.0, 1), member("slow", 5.0, 2), member("mid", 2, 3))
        return events

    events = run_virtual(main())
    times = {name: [t for n, t in events if n == name] for name in ("quick", "slow", "mid")}
    assert times["quick"] == [pytest.approx(5.0)]
    assert times["slow"] == [pytest.approx(5.0), pytest.approx(10.0)]
    # Once "slow" has left, "mid" runs its last round at its own pace.
    assert times["mid"] == [pytest.approx(5.0), pytest.approx(10.0), pytest.approx(12.0)]


def test_joining_after_the_first_round_is_an_error() -> None:
    async def main() -> None:
        barrier = TurnBarrier()
        barrier.join()
        await barrier.wait()
        barrier.join()

    with pytest.raises(LockstepError, match="placed up front"):
        run_virtual(main())


def test_lockstep_rollouts_call_tools_only_after_the_whole_turn() -> None:
    workload = Workload(WORKLOAD)
    plans = workload.plans

    async def main(lockstep: bool) -> float:
        engine = SimEngine(SimEngineConfig(output_tokens=WORKLOAD.turn_tokens), name="engine-0")
        barriers = engine_barriers() if lockstep else None
        loop = asyncio.get_running_loop()
        async with engine:
            await engine.start()
            replayed = await asyncio.gather(
                *(workload.run_rollout(plan, engine, lockstep=barriers) for plan in plans)
            )
        assert replayed == plans
        if barriers is not None:
            barrier = barriers["engine-0"]
            assert barrier.members == 0
            # Two rounds per turn that called the tool (after generating, after the tool).
            calls = max(sum(t.tool_latency_s is not None for t in p.turns) for p in plans)
            assert barrier.rounds == 2 * calls
        return loop.time()

    assert run_virtual(main(lockstep=True)) > run_virtual(main(lockstep=False))
