"""Simulation for scheduler benchmarks: a virtual-time event loop, ``SimEngine``, workloads."""

from rstar2_scheduler.sim.bench import (
    BenchConfig,
    BenchReport,
    PolicyRun,
    TargetCheck,
    run_benchmark,
)
from rstar2_scheduler.sim.bounds import LowerBound, lower_bound
from rstar2_scheduler.sim.clock import VirtualTimeEventLoop, run_virtual
from rstar2_scheduler.sim.distributions import LogNormal
from rstar2_scheduler.sim.engine import SimEngine, SimEngineConfig, SimEngineCounters
from rstar2_scheduler.sim.lockstep import LockstepError, TurnBarrier, engine_barriers
from rstar2_scheduler.sim.rl_loop import (
    RLSimConfig,
    RLSimReport,
    RLSimRun,
    StepRecord,
    TrainerModel,
    run_rl_benchmark,
    simulate_rl,
)
from rstar2_scheduler.sim.workload import PlannedTurn, RolloutPlan, Workload, WorkloadConfig

__all__ = [
    "BenchConfig",
    "BenchReport",
    "LockstepError",
    "LogNormal",
    "LowerBound",
    "PlannedTurn",
    "PolicyRun",
    "RLSimConfig",
    "RLSimReport",
    "RLSimRun",
    "RolloutPlan",
    "SimEngine",
    "SimEngineConfig",
    "SimEngineCounters",
    "StepRecord",
    "TargetCheck",
    "TrainerModel",
    "TurnBarrier",
    "VirtualTimeEventLoop",
    "Workload",
    "WorkloadConfig",
    "engine_barriers",
    "lower_bound",
    "run_benchmark",
    "run_rl_benchmark",
    "run_virtual",
    "simulate_rl",
]
