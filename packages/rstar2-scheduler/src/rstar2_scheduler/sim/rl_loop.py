"""Simulated RL steps, synchronous or with bounded staleness, on simulated engines.

Each step's rollouts are a planned ``Workload`` phase (its own seed per step) run through the
production ``RolloutScheduler``; rollout production, admission and weight swaps are the
production ``StalenessBuffer``, ``produce`` and ``TurnGate``, the code ``rstar2-train`` runs.
Only the trainer is a model: an update takes ``fixed_s + s_per_token x`` the tokens it trains
on, then the new weights go to the engines (every engine is held: calls in flight finish,
then each loads for ``load_s``). ``max_staleness = 0`` is the synchronous loop: rollouts,
update, sync, next rollouts.

Two hardware layouts are compared. *Split*: the engines have ``engines`` GPUs and the trainer
``trainer.gpus`` of its own, for every max_staleness (the synchronous loop's engines then idle
through each update). *Equal*: ``engines`` GPUs in all: the synchronous loop trains on all of
them between rollout phases (colocated), an asynchronous one trains on ``trainer_gpus`` of them
while the rest generate. Rates are taken over the steady state: after ``warmup_steps`` (the
pipeline filling) and before the last ``max_staleness`` steps, which drain (nothing generates
behind their updates, so their syncs are short).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_scheduler.engine import GenerationResult
from rstar2_scheduler.policies import PolicyName, Reservation
from rstar2_scheduler.scheduler import RolloutJob, RolloutScheduler
from rstar2_scheduler.sim.bench import check_rollouts_fit
from rstar2_scheduler.sim.clock import run_virtual
from rstar2_scheduler.sim.engine import SimEngine, SimEngineConfig
from rstar2_scheduler.sim.workload import RolloutPlan, Workload, WorkloadConfig
from rstar2_scheduler.staleness import StalenessBuffer, TurnGate, produce


class TrainerModel(BaseModel):
    """How long a simulated update and weight sync take.

    The defaults: a 14B dense model trained on 64 MI300X-class GPUs of its own at 35% MFU.
    A trained token costs 8 x 14e9 FLOPs (6 for forward and backward, 2 for the log-probs
    recomputed first) over 64 x 1.3 PFLOP/s x 0.35: 3.85 us. ``keep_fraction`` is RoC's G of
    2G. A 28 GB bf16 copy of the weights loads in about 5 s.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fixed_s: float = Field(default=10.0, ge=0, description="Per update, whatever its size.")
    s_per_token: float = Field(default=3.85e-6, ge=0, description="Per trained token.")
    keep_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Rollouts trained on (RoC keeps G of 2G)."
    )
    load_s: float = Field(default=5.0, ge=0, description="Weight load per engine, after it drains.")
    gpus: int = Field(
        default=64, gt=0, description="GPUs s_per_token assumes; on g GPUs it scales by gpus / g."
    )

    def update_s(self, plans: list[RolloutPlan], gpus: int | None = None) -> float:
        """One update's seconds on ``gpus`` GPUs (default: ``self.gpus``)."""
        tokens = sum(plan.prompt_tokens + plan.response_tokens for plan in plans)
        per_token = self.s_per_token * self.gpus / (gpus or self.gpus)
        return self.fixed_s + per_token * self.keep_fraction * tokens


Hardware = Literal["split", "equal"]
"""Where a simulated run's trainer trains (see the module)."""


class RLSimConfig(BaseModel):
    """Engines, the per-step workload, the trainer model and how many steps to run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engines: int = Field(
        default=64,
        gt=0,
        description="Simulated inference engines, one GPU each; with equal hardware, all GPUs.",
    )
    trainer_gpus: int | None = Field(
        default=None,
        gt=0,
        description="Equal-hardware runs: GPUs out of `engines` that train while the rest "
        "generate (max_staleness >= 1); the synchronous loop trains on all of them. None: "
        "split-hardware runs only.",
    )
    workload: WorkloadConfig = Field(
        default_factory=WorkloadConfig, description="One step's rollouts (its seed varies)."
    )
    engine: SimEngineConfig = Field(
        default_factory=SimEngineConfig,
        description="Engine model; its output_tokens is replaced by workload.turn_tokens.",
    )
    trainer: TrainerModel = Field(default_factory=TrainerModel)
    steps: int = Field(default=8, gt=1, description="RL steps per run.")
    warmup_steps: int = Field(
        default=1, ge=0, description="Steps left out of the steady-state rates (the first fill)."
    )
    policy: PolicyName = "kv-aware"
    reservation: Reservation = "live"

    @model_validator(mode="after")
    def _check(self) -> RLSimConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})"
            )
        if self.trainer_gpus is not None and self.trainer_gpus >= self.engines:
            raise ValueError(
                f"trainer_gpus ({self.trainer_gpus}) must leave engines: below engines "
                f"({self.engines})"
            )
        for step in range(1, self.steps + 1):
            check_rollouts_fit(self.step_workload(step).config, self.engine)
        return self

    def step_workload(self, step: int) -> Workload:
        digest = hashlib.blake2b(f"{self.workload.seed}:{step}".encode(), digest_size=4)
        seed = int.from_bytes(digest.digest(), "big")
        return Workload(self.workload.model_copy(update={"seed": seed}))

    def layout(self, hardware: Hardware, max_staleness: int) -> tuple[int, int, int]:
        """``(engines, trainer GPUs, GPUs in all)`` of one run."""
        if hardware == "split":
            return self.engines, self.trainer.gpus, self.engines + self.trainer.gpus
        if self.trainer_gpus is None:
            raise ValueError("equal-hardware runs need trainer_gpus")
        if max_staleness == 0:  # colocated: the update runs on every GPU between phases
            return self.engines, self.engines, self.engines
        return self.engines - self.trainer_gpus, self.trainer_gpus, self.engines


class StepRecord(BaseModel):
    """One simulated step: when it ended and where the trainer's time went."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    end_s: float = Field(description="When the step's weights were on every engine.")
    wait_s: float = Field(description="The trainer waiting for the step's rollouts.")
    update_s: float
    sync_s: float = Field(description="Holding the engines (their calls drain) and loading.")
    rollout_s: float = Field(description="From the step's admission to its last rollout.")
    lag: dict[int, int] = Field(description="Trained tokens by version lag.")


class RLSimRun(BaseModel):
    """One run of ``RLSimConfig`` at one ``max_staleness``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_staleness: int
    hardware: Hardware = "split"
    steps: list[StepRecord]
    engine_busy_s: float = Field(description="Engine-seconds busy in the measured window.")
    engines: int
    gpus: int = Field(description="GPUs in all: the engines' and the trainer's.")
    warmup_steps: int
    drain_steps: int = Field(description="Last steps left out: nothing generated behind them.")
    mid_request_swaps: int = Field(description="Weight swaps that met a request (must be 0).")

    @property
    def measured(self) -> list[StepRecord]:
        """The steady-state steps: after the warm-up, before the drain."""
        return self.steps[self.warmup_steps : len(self.steps) - self.drain_steps]

    @property
    def window_s(self) -> float:
        """From the end of the warm-up steps to the end of the last measured step."""
        start = self.steps[self.warmup_steps - 1].end_s if self.warmup_steps else 0.0
        return self.measured[-1].end_s - start

    @property
    def steps_per_hour(self) -> float:
        return len(self.measured) / self.window_s * 3600

    @property
    def steps_per_hour_per_gpu(self) -> float:
        return self.steps_per_hour / self.gpus

    @property
    def steps_per_hour_with_drain(self) -> float:
        """After the warm-up to the last step, drain included: what a short run shows."""
        start = self.steps[self.warmup_steps - 1].end_s if self.warmup_steps else 0.0
        return (len(self.steps) - self.warmup_steps) / (self.steps[-1].end_s - start) * 3600

    @property
    def engine_idle(self) -> float:
        return 1 - self.engine_busy_s / (self.engines * self.window_s)

    @property
    def trainer_idle(self) -> float:
        """Fraction of the window the trainer waited for rollouts."""
        return sum(r.wait_s for r in self.measured) / self.window_s

    @property
    def sync_fraction(self) -> float:
        return sum(r.sync_s for r in self.measured) / self.window_s

    def lag_histogram(self) -> dict[int, int]:
        total: Counter[int] = Counter()
        for record in self.measured:
            total.update(record.lag)
        return dict(sorted(total.items()))

    @property
    def lag_mean(self) -> float:
        histogram = self.lag_histogram()
        tokens = sum(histogram.values())
        return sum(lag * n for lag, n in histogram.items()) / tokens if tokens else 0.0

    @property
    def lag_max(self) -> int:
        return max(self.lag_histogram(), default=0)


def _version(label: str | None) -> int:
    return 0 if label is None else int(label)


async def _simulate(
    config: RLSimConfig,
    max_staleness: int,
    hardware: Hardware,
    on_step: Callable[[StepRecord], None] | None,
) -> RLSimRun:
    engines, trainer_gpus, gpus = config.layout(hardware, max_staleness)
    # A run too short for a steady state (allowed outside benchmarks) keeps one measured step.
    drain = min(max_staleness, config.steps - config.warmup_steps - 1)
    engine_config = config.engine.model_copy(update={"output_tokens": config.workload.turn_tokens})
    sims = [SimEngine(engine_config, name=f"engine-{i}") for i in range(engines)]
    gate = TurnGate(sims)
    scheduler = RolloutScheduler(gate.engines, policy=config.policy, reservation=config.reservation)
    buffer: StalenessBuffer[tuple[list[RolloutPlan], list[tuple[int, int]], float]]
    buffer = StalenessBuffer(max_staleness, config.workload.prompts)
    loop = asyncio.get_running_loop()

    async def run_step(step: int) -> tuple[list[RolloutPlan], list[tuple[int, int]], float]:
        started = loop.time()
        workload = config.step_workload(step)
        turns: list[tuple[int, int]] = []  # (tokens, version) of every turn

        def record(result: GenerationResult) -> None:
            turns.append((len(result.token_ids), _version(result.weights_version)))

        jobs = [
            RolloutJob(
                run=partial(workload.run_rollout, plan, on_turn=record),
                kv_tokens=workload.kv_tokens(plan),
                key=f"s{step}-{plan.index}",
            )
            for plan in workload.plans
        ]
        phase = await scheduler.run(jobs)
        failed = [r for r in phase.results if not r.ok]
        if failed:
            raise RuntimeError(f"step {step}: {len(failed)} rollouts failed: {failed[0].error}")
        return workload.plans, turns, loop.time() - started

    for engine in sims:
        await engine.start()
    producer = asyncio.create_task(produce(buffer, run_step, last_step=config.steps))
    records: list[StepRecord] = []
    busy_at_window: float | None = None if config.warmup_steps else 0.0
    busy_at_end: float | None = None
    try:
        for _ in range(config.steps):
            waited = loop.time()
            step, (plans, turns, rollout_s) = await buffer.take()
            wait_s = loop.time() - waited
            lag: Counter[int] = Counter()
            for tokens, version in turns:
                lag[step - 1 - version] += tokens
            update_s = config.trainer.update_s(plans, trainer_gpus)
            await asyncio.sleep(update_s)
            synced = loop.time()
            async with gate.hold():
                await asyncio.sleep(config.trainer.load_s)
                for engine in sims:
                    await engine.update_weights([], version=str(step))
            sync_s = loop.time() - synced
            await buffer.consumed()
            records.append(
                StepRecord(
                    step=step,
                    end_s=loop.time(),
                    wait_s=wait_s,
                    update_s=update_s,
                    sync_s=sync_s,
                    rollout_s=rollout_s,
                    lag=dict(lag),
                )
            )
            if step == config.warmup_steps:
                busy_at_window = sum(gate.busy_s())
            if step == config.steps - drain:
                busy_at_end = sum(gate.busy_s())
            if on_step is not None:
                on_step(records[-1])
        await producer
    finally:
        producer.cancel()
        for engine in sims:
            await engine.close()
    assert busy_at_window is not None
    assert busy_at_end is not None
    return RLSimRun(
        max_staleness=max_staleness,
        hardware=hardware,
        steps=records,
        engine_busy_s=busy_at_end - busy_at_window,
        engines=engines,
        gpus=gpus,
        warmup_steps=config.warmup_steps,
        drain_steps=drain,
        mid_request_swaps=sum(engine.counters.mid_request_swaps for engine in sims),
    )


def simulate_rl(
    config: RLSimConfig,
    max_staleness: int,
    *,
    hardware: Hardware = "split",
    on_step: Callable[[StepRecord], None] | None = None,
) -> RLSimRun:
    """Run ``config.steps`` simulated RL steps at ``max_staleness`` on ``hardware`` in virtual
    time; ``on_step`` sees each step as it ends."""
    return run_virtual(_simulate(config, max_staleness, hardware, on_step))


TARGET_SPEEDUP: dict[Hardware, float] = {"split": 1.5, "equal": 1.3}
"""Steady-state steps per hour (per GPU: both sides have the same GPUs) at max_staleness 1 over
the synchronous loop's on the same hardware."""


class RLSimReport(BaseModel):
    """The same simulated steps, synchronous and at each max_staleness."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: RLSimConfig
    runs: list[RLSimRun]

    def run(self, max_staleness: int, hardware: Hardware = "split") -> RLSimRun | None:
        return next(
            (r for r in self.runs if (r.max_staleness, r.hardware) == (max_staleness, hardware)),
            None,
        )

    def speedup(self, run: RLSimRun) -> float | None:
        """Steps per hour over the synchronous run's on the same hardware (None without one)."""
        sync = self.run(0, run.hardware)
        return None if sync is None else run.steps_per_hour / sync.steps_per_hour

    def target_met(self, hardware: Hardware = "split") -> bool | None:
        """max_staleness 1 against the target (None without both runs)."""
        one = self.run(1, hardware)
        speedup = None if one is None else self.speedup(one)
        return None if speedup is None else speedup >= TARGET_SPEEDUP[hardware]


def benchmark_arms(config: RLSimConfig, staleness: Sequence[int]) -> list[tuple[Hardware, int]]:
    """The runs of a benchmark: every max_staleness on split hardware, and on equal hardware
    too when ``config.trainer_gpus`` says how to split it."""
    layouts: list[Hardware] = ["split"] if config.trainer_gpus is None else ["split", "equal"]
    return [(hardware, eta) for hardware in layouts for eta in staleness]


def check_steady_window(config: RLSimConfig, staleness: Sequence[int]) -> None:
    """ValueError unless every max_staleness in ``staleness`` leaves a measured step between
    the warm-up and the drain."""
    short = [eta for eta in staleness if config.steps - config.warmup_steps - eta < 1]
    if short:
        raise ValueError(
            f"steps ({config.steps}) must exceed warmup_steps ({config.warmup_steps}) + "
            f"max_staleness ({max(short)}): the last max_staleness steps drain and are not "
            "measured"
        )


def run_rl_benchmark(
    config: RLSimConfig,
    staleness: Sequence[int],
    *,
    on_step: Callable[[Hardware, int, StepRecord], None] | None = None,
) -> RLSimReport:
    """``simulate_rl`` for every arm of ``benchmark_arms`` (max_staleness 0: the synchronous
    loop); ``on_step`` sees each step with its run's hardware and max_staleness."""
    check_steady_window(config, staleness)
    runs = []
    for hardware, eta in benchmark_arms(config, staleness):
        callback = None if on_step is None else partial(on_step, hardware, eta)
        runs.append(simulate_rl(config, eta, hardware=hardware, on_step=callback))
    return RLSimReport(config=config, runs=runs)
