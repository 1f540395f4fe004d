"""rstar2-scheduler.

Agent protocol, multi-turn tool rollouts, inference engines and KV-cache-aware load balancing.
"""

from importlib.metadata import version

# Trajectories carry rstar2-algo's record; it stays importable from here too.
from rstar2_algo import TrajectoryQuality
from rstar2_scheduler.compute import device_executor, run_on_device
from rstar2_scheduler.engine import (
    Capability,
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
    SamplingParams,
    UnsupportedOperationError,
)
from rstar2_scheduler.engines import (
    OpenAIEngine,
    OpenAIEngineConfig,
    TransformersEngine,
    TransformersEngineConfig,
    VLLMEngine,
    VLLMEngineConfig,
)
from rstar2_scheduler.metrics import EngineMetrics, LatencySummary, PhaseMetrics
from rstar2_scheduler.policies import PolicyName
from rstar2_scheduler.protocol import (
    ChatConfig,
    ChatProtocol,
    EncodedTranscript,
    TemplateError,
    ToolCallParser,
    ToolOutputFormatter,
    TranscriptError,
    check_prefix_preserving,
    encode_transcript,
    install_chat_template,
    user_prompt,
)
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner
from rstar2_scheduler.scheduler import (
    JobResult,
    RolloutJob,
    RolloutPhase,
    RolloutScheduler,
    SchedulerConfig,
)
from rstar2_scheduler.sim import SimEngine, SimEngineConfig
from rstar2_scheduler.trajectory import StopReason, Trajectory, TurnRecord

__version__ = version("rstar2-scheduler")

__all__ = [
    "Capability",
    "ChatConfig",
    "ChatProtocol",
    "EncodedTranscript",
    "Engine",
    "EngineMetrics",
    "GenerationRequest",
    "GenerationResult",
    "JobResult",
    "KVStats",
    "LatencySummary",
    "NamedTensors",
    "OpenAIEngine",
    "OpenAIEngineConfig",
    "PhaseMetrics",
    "PolicyName",
    "RolloutConfig",
    "RolloutJob",
    "RolloutPhase",
    "RolloutRunner",
    "RolloutScheduler",
    "SamplingParams",
    "SchedulerConfig",
    "SimEngine",
    "SimEngineConfig",
    "StopReason",
    "TemplateError",
    "ToolCallParser",
    "ToolOutputFormatter",
    "Trajectory",
    "TrajectoryQuality",
    "TranscriptError",
    "TransformersEngine",
    "TransformersEngineConfig",
    "TurnRecord",
    "UnsupportedOperationError",
    "VLLMEngine",
    "VLLMEngineConfig",
    "__version__",
    "check_prefix_preserving",
    "device_executor",
    "encode_transcript",
    "install_chat_template",
    "run_on_device",
    "user_prompt",
]
