"""rstar2-scheduler.

Agent protocol, multi-turn tool rollouts, inference engines and KV-cache-aware load balancing.
"""

from importlib.metadata import version

from rstar2_scheduler.engine import (
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    SamplingParams,
)
from rstar2_scheduler.metrics import EngineMetrics, LatencySummary, PhaseMetrics
from rstar2_scheduler.policies import PolicyName
from rstar2_scheduler.scheduler import (
    JobResult,
    RolloutJob,
    RolloutPhase,
    RolloutScheduler,
    SchedulerConfig,
)
from rstar2_scheduler.sim import SimEngine, SimEngineConfig

__version__ = version("rstar2-scheduler")

__all__ = [
    "Engine",
    "EngineMetrics",
    "GenerationRequest",
    "GenerationResult",
    "JobResult",
    "KVStats",
    "LatencySummary",
    "PhaseMetrics",
    "PolicyName",
    "RolloutJob",
    "RolloutPhase",
    "RolloutScheduler",
    "SamplingParams",
    "SchedulerConfig",
    "SimEngine",
    "SimEngineConfig",
    "__version__",
]
