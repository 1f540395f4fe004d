"""The simulated workload: plans respect the budget and turn limit, and SimEngine replays them."""

from __future__ import annotations

import pytest

from rstar2_scheduler.sim import (
    BenchConfig,
    LogNormal,
    SimEngine,
    SimEngineConfig,
    Workload,
    WorkloadConfig,
    lower_bound,
    run_benchmark,
    run_virtual,
)

SMALL = WorkloadConfig(
    prompts=4,
    rollouts_per_prompt=8,
    response_budget=2048,
    max_turns=4,
    turn_tokens=LogNormal(median=300, sigma=1.2),
)


def test_plans_respect_budget_turns_and_are_reproducible() -> None:
    plans = Workload(SMALL).plans
    assert len(plans) == 32
    assert plans == Workload(SMALL).plans
    assert plans != Workload(SMALL.model_copy(update={"seed": 1})).plans
    for plan in plans:
        assert plan.prompt_index == plan.index // 8
        assert 1 <= len(plan.turns) <= SMALL.max_turns
        assert plan.response_tokens <= SMALL.response_budget
        # Every turn but the last calls the tool; the context grows by what came before.
        assert all(t.tool_latency_s is not None for t in plan.turns[:-1])
        for before, after in zip(plan.turns, plan.turns[1:], strict=False):
            assert (
                after.context_tokens
                == before.context_tokens + before.output_tokens + before.tool_tokens
            )
    truncated = [p for p in plans if p.truncated]
    assert truncated, "a long-tailed workload truncates some rollouts"
    assert all(p.response_tokens > SMALL.response_budget - 300 for p in truncated)


def test_simengine_replays_every_plan_exactly() -> None:
    workload = Workload(SMALL)
    engine = SimEngine(SimEngineConfig(output_tokens=SMALL.turn_tokens))

    async def main() -> int:
        async with engine:
            for plan in workload.plans:
                await workload.run_rollout(plan, engine)  # raises on any mismatch
        return engine.counters.decode_tokens

    decoded = run_virtual(main())
    assert decoded == sum(t.output_tokens for p in workload.plans for t in p.turns)


def test_a_mismatched_engine_is_reported() -> None:
    workload = Workload(SMALL)
    engine = SimEngine(SimEngineConfig(output_tokens=LogNormal(median=7, sigma=0)))

    async def main() -> None:
        async with engine:
            await workload.run_rollout(workload.plans[0], engine)

    with pytest.raises(RuntimeError, match="must equal the workload's turn_tokens"):
        run_virtual(main())


def test_lower_bound_terms() -> None:
    workload = Workload(SMALL)
    config = SimEngineConfig(output_tokens=SMALL.turn_tokens)
    one, four = lower_bound(workload.plans, config, 1), lower_bound(workload.plans, config, 4)
    assert one.work_s == four.work_s
    assert four.balanced_s == pytest.approx(one.balanced_s / 4)
    assert four.bound_s == max(four.balanced_s, four.critical_path_s)


def test_a_small_kv_cache_raises_the_bound_by_the_steps_it_forces() -> None:
    workload = Workload(SMALL)
    roomy = SimEngineConfig(output_tokens=SMALL.turn_tokens)
    turns = [t for p in workload.plans for t in p.turns]
    decoded = sum(t.output_tokens for t in turns)
    held = sum(
        t.output_tokens * t.context_tokens + t.output_tokens * (t.output_tokens - 1) // 2
        for t in turns
    )
    # A cache that holds far fewer contexts than max_num_seqs forces more, smaller steps.
    tight = roomy.model_copy(update={"num_blocks": 512})
    extra_steps = held / tight.capacity_tokens - decoded / roomy.max_num_seqs
    assert extra_steps > 0
    gained = (
        lower_bound(workload.plans, tight, 1).work_s - lower_bound(workload.plans, roomy, 1).work_s
    )
    assert gained == pytest.approx(extra_steps * roomy.step_overhead_s)
    report = run_benchmark(BenchConfig(engines=2, workload=SMALL, engine=tight))
    for run in report.runs.values():
        assert run.metrics.makespan_s >= report.bound.bound_s


@pytest.mark.parametrize("max_turns", [1, 4])
def test_a_lone_rollout_meets_its_critical_path(max_turns: int) -> None:
    single = SMALL.model_copy(
        update={"prompts": 1, "rollouts_per_prompt": 1, "max_turns": max_turns}
    )
    report = run_benchmark(BenchConfig(engines=1, workload=single, policies=("kv-aware",)))
    makespan = report.runs["kv-aware"].metrics.makespan_s
    if max_turns == 1:
        assert makespan == pytest.approx(report.bound.critical_path_s)
    else:
        # Later turns also recompute the partial last block of the cached context.
        assert report.bound.critical_path_s <= makespan < 1.02 * report.bound.critical_path_s
