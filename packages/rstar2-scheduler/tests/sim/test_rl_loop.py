"""The simulated RL loop's measurement: steady-state windows and equal-hardware layouts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rstar2_scheduler.sim import LogNormal, SimEngineConfig, WorkloadConfig
from rstar2_scheduler.sim.rl_loop import RLSimConfig, TrainerModel, run_rl_benchmark, simulate_rl
from rstar2_scheduler.sim.workload import Workload

LOAD_S = 0.5


def config(**more: object) -> RLSimConfig:
    return RLSimConfig.model_validate(
        {
            "engines": 4,
            "workload": WorkloadConfig(
                prompts=4,
                rollouts_per_prompt=4,
                response_budget=512,
                max_turns=3,
                turn_tokens=LogNormal(median=60, sigma=0.8),
                prompt_tokens=LogNormal(median=30, sigma=0.3, minimum=4, maximum=64),
                seed=5,
            ),
            "engine": SimEngineConfig(num_blocks=256, max_num_seqs=8),
            "trainer": TrainerModel(fixed_s=1.0, s_per_token=1e-5, load_s=LOAD_S),
            "steps": 5,
            "warmup_steps": 1,
            **more,
        }
    )


def test_the_last_max_staleness_steps_drain_and_are_left_out() -> None:
    run = simulate_rl(config(), 1)
    assert [r.step for r in run.measured] == [2, 3, 4]
    # Nothing generates behind the last update, so its sync is the load alone; the steps before
    # it waited for the next step's running turns.
    assert run.steps[-1].sync_s == pytest.approx(LOAD_S)
    assert max(r.sync_s for r in run.measured) > LOAD_S
    assert run.window_s == pytest.approx(run.steps[3].end_s - run.steps[0].end_s)
    assert run.steps_per_hour_with_drain > run.steps_per_hour  # the artefact the window avoids
    sync = simulate_rl(config(), 0)
    assert [r.step for r in sync.measured] == [2, 3, 4, 5]  # synchronous: nothing drains


def test_equal_hardware_splits_the_same_gpus() -> None:
    settings = config(trainer_gpus=1)
    assert settings.layout("split", 1) == (4, 64, 68)
    assert settings.layout("equal", 0) == (4, 4, 4)  # colocated: trains on every GPU
    assert settings.layout("equal", 1) == (3, 1, 4)
    plans = Workload(settings.workload).plans
    trainer = settings.trainer
    per_token = trainer.update_s(plans) - trainer.fixed_s
    assert trainer.update_s(plans, 16) - trainer.fixed_s == pytest.approx(4 * per_token)
    colocated = simulate_rl(settings, 0, hardware="equal")
    split = simulate_rl(settings, 1, hardware="equal")
    assert (colocated.gpus, colocated.engines, split.gpus, split.engines) == (4, 4, 4, 3)
    # Colocated on 4 GPUs an update takes 16 times the 64-GPU model's per-token time; on one
    # GPU, 64 times.
    assert colocated.steps[0].update_s > simulate_rl(settings, 0).steps[0].update_s
    assert split.steps[0].update_s > colocated.steps[0].update_s
    assert split.steps_per_hour_per_gpu == pytest.approx(split.steps_per_hour / 4)


def test_bad_layouts_and_windows_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"trainer_gpus \(4\) must leave engines"):
        config(trainer_gpus=4)
    with pytest.raises(ValueError, match=r"must exceed warmup_steps \(1\) \+ max_staleness \(4\)"):
        run_rl_benchmark(config(), [0, 4])
    # Outside a benchmark a short run still runs, its drain cut to keep one measured step.
    assert [r.step for r in simulate_rl(config(steps=3), 4).measured] == [2]
    with pytest.raises(ValueError, match="equal-hardware runs need trainer_gpus"):
        config().layout("equal", 1)
