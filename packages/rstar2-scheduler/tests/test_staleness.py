"""Bounded staleness: the admission rule, the turn gate, and the simulated RL loop's bound.

Everything runs on the virtual-time event loop: a wait that would block forever shows as a
timeout at once, and simulated hours cost only the bookkeeping.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted import ScriptedEngine

from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.sim import (
    LogNormal,
    RLSimConfig,
    SimEngineConfig,
    TrainerModel,
    WorkloadConfig,
    run_virtual,
    simulate_rl,
)
from rstar2_scheduler.staleness import StalenessBuffer, TurnGate, produce


async def blocked(awaitable: object, seconds: float = 1.0) -> bool:
    """Whether ``awaitable`` is still waiting after ``seconds`` (virtual time)."""
    try:
        await asyncio.wait_for(awaitable, seconds)  # type: ignore[arg-type]
    except TimeoutError:
        return True
    return False


def test_admission_keeps_eta_plus_one_steps_unconsumed() -> None:
    async def main() -> None:
        buffer: StalenessBuffer[str] = StalenessBuffer(1, 3)
        # (eta + 1) * B = 6 groups, admitted one step at a time.
        assert await buffer.admit(until_step=10) == range(3)
        assert await buffer.admit(until_step=10) == range(3, 6)
        assert buffer.capacity == 0
        assert await blocked(buffer.admit(until_step=10))
        await buffer.finish(1, "step 1")
        assert await buffer.take() == (1, "step 1")
        # Taken is not consumed: its groups hold their place until the weights are out.
        assert await blocked(buffer.admit(until_step=10))
        await buffer.consumed()
        assert buffer.version == 1
        assert await buffer.admit(until_step=10) == range(6, 9)
        assert buffer.admitted_version(3) == 1
        assert buffer.admitted_version(2) == 0

    run_virtual(main())


def test_eta_zero_admits_a_step_only_once_the_previous_one_is_on_the_engines() -> None:
    async def main() -> None:
        buffer: StalenessBuffer[int] = StalenessBuffer(0, 2)
        assert await buffer.admit(until_step=2) == range(2)
        assert await blocked(buffer.admit(until_step=2))
        await buffer.finish(1, 1)
        await buffer.take()
        assert await blocked(buffer.admit(until_step=2))
        await buffer.consumed()
        assert await buffer.admit(until_step=2) == range(2, 4)
        # Nothing past the last step.
        await buffer.finish(2, 2)
        await buffer.take()
        await buffer.consumed()
        assert await buffer.admit(until_step=2) == range(4, 4)

    run_virtual(main())


def test_steps_are_taken_in_order_and_a_resumed_buffer_starts_after_its_steps() -> None:
    async def main() -> None:
        buffer: StalenessBuffer[str] = StalenessBuffer(2, 1, start_step=5)
        assert buffer.version == 5
        assert [await buffer.admit(until_step=9) for _ in range(3)] == [
            range(5, 6),
            range(6, 7),
            range(7, 8),
        ]
        await buffer.finish(7, "late")
        await buffer.finish(8, "later")
        assert await blocked(buffer.take())  # step 6 is not finished: nothing overtakes it
        await buffer.finish(6, "first")
        assert await buffer.take() == (6, "first")
        assert await buffer.take() == (7, "late")  # before step 6's weights are out
        assert buffer.queued_groups == 1

    run_virtual(main())


def test_a_failing_step_fails_the_trainers_take_instead_of_hanging() -> None:
    async def main() -> None:
        buffer: StalenessBuffer[int] = StalenessBuffer(1, 2)

        async def run_step(step: int) -> int:
            if step == 2:
                raise ValueError("engine gone")
            return step

        producer = asyncio.create_task(produce(buffer, run_step, last_step=4))
        assert await buffer.take() == (1, 1)
        await buffer.consumed()
        with pytest.raises(RuntimeError, match="before step 2") as failure:
            await buffer.take()
        assert "engine gone" in repr(failure.value.__cause__)
        with pytest.raises(ExceptionGroup):
            await producer

    run_virtual(main())


def test_buffer_refuses_bad_settings_and_calls_out_of_order() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessBuffer(-1, 2)
    with pytest.raises(ValueError, match="groups_per_step"):
        StalenessBuffer(0, 0)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="without a taken step"):
            await StalenessBuffer(0, 1).consumed()

    run_virtual(main())


class SlowEngine(ScriptedEngine):
    """A scripted engine whose every call takes ``seconds`` and reports its weights version."""

    def __init__(self, seconds: float) -> None:
        super().__init__([[1, 2, 3]] * 100)
        self.seconds = seconds
        self.weights_version: str | None = None
        self.in_flight = 0
        self.swaps_met: list[int] = []

    async def generate(self, request: GenerationRequest) -> object:  # type: ignore[override]
        self.in_flight += 1
        try:
            await asyncio.sleep(self.seconds)
            return await super().generate(request)
        finally:
            self.in_flight -= 1

    async def update_weights(self, weights: object, *, version: str | None = None) -> None:
        self.swaps_met.append(self.in_flight)
        self.weights_version = version


def request(key: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=key, prompt_ids=(1,), sampling=SamplingParams(max_new_tokens=3)
    )


def test_turn_gate_swaps_weights_only_between_calls_and_counts_busy_time() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        engines = [SlowEngine(10.0), SlowEngine(10.0)]
        gate = TurnGate(engines)
        first = asyncio.create_task(gate.engines[0].generate(request("a")))
        await asyncio.sleep(2)
        held_at = loop.time()
        swapped: list[float] = []

        async def swap() -> None:
            async with gate.hold():
                swapped.append(loop.time())
                for engine in gate.inner:
                    await engine.update_weights([], version="1")

        swapping = asyncio.create_task(swap())
        await asyncio.sleep(1)
        # A call made while the swap waits for "a" to finish waits too.
        second = asyncio.create_task(gate.engines[1].generate(request("b")))
        await asyncio.gather(first, swapping)
        assert swapped == [pytest.approx(held_at + 8)]  # "a" started at 0 and ran 10 s
        assert [engine.swaps_met for engine in engines] == [[0], [0]]
        await second
        assert loop.time() == pytest.approx(20)  # "b" started after the swap, at 10
        # Engine 0 busy 0-10, engine 1 busy 10-20.
        assert gate.busy_s() == [pytest.approx(10), pytest.approx(10)]
        # One engine held alone leaves the other serving.
        async with gate.hold([0]):
            assert not await blocked(gate.engines[1].generate(request("c")), 20)
            assert await blocked(gate.engines[0].generate(request("d")))

    run_virtual(main())


@settings(max_examples=25, deadline=None)
@given(
    eta=st.integers(0, 3),
    engines=st.integers(1, 3),
    prompts=st.integers(1, 3),
    rollouts=st.integers(1, 4),
    turn_median=st.integers(4, 200),
    turn_sigma=st.floats(0.1, 1.5),
    tool_probability=st.floats(0.0, 1.0),
    trainer_fixed_s=st.floats(0.0, 30.0),
    trainer_per_token=st.floats(0.0, 0.05),
    load_s=st.floats(0.0, 5.0),
    steps=st.integers(2, 6),
    seed=st.integers(0, 1000),
)
def test_no_trained_token_is_more_than_eta_versions_old(
    eta: int,
    engines: int,
    prompts: int,
    rollouts: int,
    turn_median: int,
    turn_sigma: float,
    tool_probability: float,
    trainer_fixed_s: float,
    trainer_per_token: float,
    load_s: float,
    steps: int,
    seed: int,
) -> None:
    """Random rollout lengths (turns, tokens, tool latencies) and step times (update and
    weight-load times) through the production buffer, gate and scheduler."""
    config = RLSimConfig(
        engines=engines,
        workload=WorkloadConfig(
            prompts=prompts,
            rollouts_per_prompt=rollouts,
            response_budget=512,
            max_turns=4,
            turn_tokens=LogNormal(median=turn_median, sigma=turn_sigma),
            tool_call_probability=tool_probability,
            prompt_tokens=LogNormal(median=30, sigma=0.3, minimum=4, maximum=64),
            seed=seed,
        ),
        engine=SimEngineConfig(num_blocks=256, max_num_seqs=8),
        trainer=TrainerModel(fixed_s=trainer_fixed_s, s_per_token=trainer_per_token, load_s=load_s),
        steps=steps,
        warmup_steps=1,
    )
    run = simulate_rl(config, eta)
    assert [record.step for record in run.steps] == list(range(1, steps + 1))
    assert run.mid_request_swaps == 0
    for record in run.steps:
        assert record.lag, "every step trains on tokens"
        assert min(record.lag) >= 0
        assert max(record.lag) <= eta, (record.step, record.lag)
    if eta == 0:
        assert all(set(record.lag) == {0} for record in run.steps)
