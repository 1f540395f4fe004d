"""``rstar2-train demo``: the whole loop on a laptop CPU (data, SFT, GRPO-RoC, evaluation)."""

from rstar2_train.demo.pipeline import DemoRunner, run_async_ablation, run_demo
from rstar2_train.demo.plan import DemoOptions, DemoPaths
from rstar2_train.demo.report import (
    AblationResult,
    AblationRun,
    DemoSummary,
    Invocation,
    PhaseTime,
)
from rstar2_train.demo.scores import HeldOutScores
from rstar2_train.demo.staleness import AsyncAblationResult

__all__ = [
    "AblationResult",
    "AblationRun",
    "AsyncAblationResult",
    "DemoOptions",
    "DemoPaths",
    "DemoRunner",
    "DemoSummary",
    "HeldOutScores",
    "Invocation",
    "PhaseTime",
    "run_async_ablation",
    "run_demo",
]
