"""The scheduler benchmark: the same simulated rollout phase under each placement policy.

Each policy gets fresh ``SimEngine`` instances and a fresh ``VirtualTimeEventLoop``, and runs the
production ``RolloutScheduler`` unchanged over the same planned rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_scheduler.metrics import PhaseMetrics
from rstar2_scheduler.policies import POLICY_NAMES, RESERVATIONS, PolicyName, Reservation
from rstar2_scheduler.scheduler import JobResult, RolloutJob, RolloutScheduler
from rstar2_scheduler.sim.bounds import LowerBound, lower_bound
from rstar2_scheduler.sim.clock import run_virtual
from rstar2_scheduler.sim.engine import SimEngine, SimEngineConfig, SimEngineCounters
from rstar2_scheduler.sim.lockstep import engine_barriers
from rstar2_scheduler.sim.workload import RolloutPlan, Workload, WorkloadConfig

# The paper's figures for its scheduler against a static split (rStar2-Agent, section 3.2).
TARGET_IDLE_REDUCTION = 0.60
TARGET_SPEEDUP = 1.45
TARGET_BOUND_GAP = 0.15
LOCKSTEP_RUN = "static/lockstep"
BASELINES = ("static", LOCKSTEP_RUN)


def check_rollouts_fit(workload: WorkloadConfig, engine: SimEngineConfig) -> None:
    """Raise ``ValueError`` when a rollout of ``workload`` cannot fit an engine: every request
    asks for its prompt plus what is left of the budget, and one that exceeds the engine's
    model length fails, and so would the whole run, after it ran."""
    prompt = max(len(ids) for ids in Workload(workload).prompts)
    needed = prompt + workload.response_budget
    if needed > engine.model_len:
        raise ValueError(
            f"a rollout needs up to {needed} tokens (its prompt, up to {prompt}, plus the "
            f"{workload.response_budget}-token response budget), more than an engine "
            f"holds ({engine.model_len}): raise the KV cache or lower the budget"
        )


class RunSpec(NamedTuple):
    """One run of the benchmark: its name, policy, kv-aware admission and turn lockstep."""

    name: str
    policy: PolicyName
    reservation: Reservation
    lockstep: bool


class BenchConfig(BaseModel):
    """Engines, workload and scheduler settings of one benchmark run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engines: int = Field(default=8, gt=0, description="Simulated inference engines.")
    workload: WorkloadConfig = WorkloadConfig()
    engine: SimEngineConfig = Field(
        default=SimEngineConfig(),
        description="Engine model; its output_tokens is replaced by workload.turn_tokens.",
    )
    policies: tuple[PolicyName, ...] = Field(default=POLICY_NAMES, min_length=1)
    reservations: tuple[Reservation, ...] = Field(
        default=RESERVATIONS, min_length=1, description="kv-aware admission modes to run."
    )
    overcommit: float = Field(default=1 / 0.7, gt=0, description="kv-aware 'max' over-commit.")
    kv_headroom: float = Field(
        default=0.1, ge=0, lt=1, description="kv-aware 'live': KV capacity kept free."
    )
    max_concurrency: int | None = Field(default=None, gt=0, description="Rollouts in flight.")
    kv_sample_interval_s: float = Field(default=1.0, gt=0)
    lockstep_baseline: bool = Field(
        default=True,
        description=(
            "With 'static' among the policies, also run the paper's baseline: the static split "
            "with each engine's rollouts taking their turns and tool calls in lockstep "
            "(the whole share at once, whatever max_concurrency says)."
        ),
    )

    @model_validator(mode="after")
    def _check_rollouts_fit(self) -> BenchConfig:
        check_rollouts_fit(self.workload, self.engine)
        return self

    @property
    def engine_config(self) -> SimEngineConfig:
        return self.engine.model_copy(update={"output_tokens": self.workload.turn_tokens})

    def runs(self) -> list[RunSpec]:
        """Every run of the benchmark; 'kv-aware' is the live admission."""
        runs: list[RunSpec] = []
        for policy in self.policies:
            modes = self.reservations if policy == "kv-aware" else RESERVATIONS[:1]
            for mode in modes:
                name = policy if policy != "kv-aware" or mode == "live" else f"{policy}/{mode}"
                runs.append(RunSpec(name, policy, mode, lockstep=False))
            if policy == "static" and self.lockstep_baseline:
                runs.append(RunSpec(LOCKSTEP_RUN, policy, RESERVATIONS[0], lockstep=True))
        return runs


class PolicyRun(BaseModel):
    """One policy's phase: the scheduler's metrics and what each engine did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: PhaseMetrics
    engines: list[SimEngineCounters]
    wall_s: float = Field(description="Real time the simulation took.")

    @property
    def recomputed_tokens(self) -> int:
        return sum(e.recomputed_tokens for e in self.engines)

    @property
    def prefill_tokens(self) -> int:
        return sum(e.prefill_tokens for e in self.engines)


class TargetCheck(BaseModel):
    """One benchmark target and whether the measured value meets it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    value: float
    target: str
    met: bool


class BenchReport(BaseModel):
    """Results of every policy on one workload, with the lower bound and the target checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: BenchConfig
    response_tokens_mean: float
    truncated_fraction: float
    turns_mean: float
    bound: LowerBound
    runs: dict[str, PolicyRun]

    def targets(self) -> list[TargetCheck]:
        """kv-aware (live) against each static baseline that ran, and against the lower bound."""
        if "kv-aware" not in self.runs:
            return []
        kv = self.runs["kv-aware"].metrics
        checks: list[TargetCheck] = []
        for baseline in BASELINES:
            if baseline not in self.runs:
                continue
            static = self.runs[baseline].metrics
            idle_cut = 1 - kv.idle_s / static.idle_s if static.idle_s else 0.0
            speedup = static.makespan_s / kv.makespan_s
            checks += [
                TargetCheck(
                    name=f"idle time cut vs {baseline}",
                    value=idle_cut,
                    target=f">= {TARGET_IDLE_REDUCTION:.0%}",
                    met=idle_cut >= TARGET_IDLE_REDUCTION,
                ),
                TargetCheck(
                    name=f"rollout-phase speed-up vs {baseline}",
                    value=speedup,
                    target=f">= {TARGET_SPEEDUP:.2f}x",
                    met=speedup >= TARGET_SPEEDUP,
                ),
            ]
        gap = kv.makespan_s / self.bound.bound_s - 1
        checks.append(
            TargetCheck(
                name="makespan above lower bound",
                value=gap,
                target=f"<= {TARGET_BOUND_GAP:.0%}",
                met=gap <= TARGET_BOUND_GAP,
            )
        )
        return checks


async def _run_phase(
    config: BenchConfig,
    spec: RunSpec,
    workload: Workload,
    on_result: Callable[[JobResult[RolloutPlan]], None] | None,
) -> PolicyRun:
    engines = [SimEngine(config.engine_config, name=f"engine-{i}") for i in range(config.engines)]
    lockstep = engine_barriers() if spec.lockstep else None
    jobs = [
        RolloutJob(
            run=partial(workload.run_rollout, plan, lockstep=lockstep),
            kv_tokens=workload.kv_tokens(plan),
            key=str(plan.index),
        )
        for plan in workload.plans
    ]
    scheduler = RolloutScheduler(
        engines,
        policy=spec.policy,
        reservation=spec.reservation,
        overcommit=config.overcommit,
        kv_headroom=config.kv_headroom,
        # The lockstep baseline runs each engine's whole share at once, as it did.
        max_concurrency=None if spec.lockstep else config.max_concurrency,
        kv_sample_interval_s=config.kv_sample_interval_s,
    )
    async with scheduler:
        phase = await scheduler.run(jobs, on_result=on_result)
    failures = [r for r in phase.results if not r.ok]
    if failures:
        raise RuntimeError(f"{len(failures)} simulated rollouts failed, first: {failures[0].error}")
    return PolicyRun(
        metrics=phase.metrics,
        engines=[engine.counters.model_copy() for engine in engines],
        wall_s=0.0,
    )


def run_benchmark(
    config: BenchConfig,
    *,
    on_result: Callable[[str, JobResult[RolloutPlan]], None] | None = None,
) -> BenchReport:
    """Run every configured policy on the workload; ``on_result`` sees each finished rollout
    with the name of its run."""
    workload = Workload(config.workload)
    plans = workload.plans
    runs: dict[str, PolicyRun] = {}
    for spec in config.runs():
        callback = None if on_result is None else (lambda r, n=spec.name: on_result(n, r))
        began = time.perf_counter()
        run = run_virtual(_run_phase(config, spec, workload, callback))
        runs[spec.name] = run.model_copy(update={"wall_s": time.perf_counter() - began})
    return BenchReport(
        config=config,
        response_tokens_mean=sum(p.response_tokens for p in plans) / len(plans),
        truncated_fraction=sum(p.truncated for p in plans) / len(plans),
        turns_mean=sum(len(p.turns) for p in plans) / len(plans),
        bound=lower_bound(plans, config.engine_config, config.engines),
        runs=runs,
    )


class SweepPoint(BaseModel):
    """static against kv-aware (live admission) on one workload of a sweep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engines: int
    prompts: int
    rollouts: int
    seed: int
    static_s: float = Field(description="Makespan under the static split.")
    kv_aware_s: float = Field(description="Makespan under kv-aware (live admission).")
    bound_s: float = Field(description="The workload's lower bound.")

    @property
    def speedup(self) -> float:
        """static makespan / kv-aware makespan: above 1, kv-aware is faster."""
        return self.static_s / self.kv_aware_s


def sweep_config(config: BenchConfig, prompts: int, seed: int) -> BenchConfig:
    """One point of a sweep: static against kv-aware (live) on ``config`` with ``prompts``
    prompts and workload ``seed``, checked as any ``BenchConfig``."""
    workload = config.workload.model_copy(update={"prompts": prompts, "seed": seed})
    return BenchConfig.model_validate(
        {
            **config.model_dump(),
            "workload": workload.model_dump(),
            "policies": ("static", "kv-aware"),
            "reservations": ("live",),
            "lockstep_baseline": False,
        }
    )


def run_sweep(
    config: BenchConfig,
    prompts: Sequence[int],
    seeds: Sequence[int],
    *,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """static and kv-aware on ``config``'s workload at every number of prompts and seed.

    Every point is checked before the first one runs.
    """
    configs = [sweep_config(config, count, seed) for count in prompts for seed in seeds]
    points: list[SweepPoint] = []
    for point_config in configs:
        report = run_benchmark(point_config)
        workload = point_config.workload
        point = SweepPoint(
            engines=point_config.engines,
            prompts=workload.prompts,
            rollouts=workload.rollouts,
            seed=workload.seed,
            static_s=report.runs["static"].metrics.makespan_s,
            kv_aware_s=report.runs["kv-aware"].metrics.makespan_s,
            bound_s=report.bound.bound_s,
        )
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points
