"""rstar2-scheduler.

Agent protocol, multi-turn tool rollouts, inference engines and KV-cache-aware load balancing.

Names are loaded on first use: the engines pull in torch and transformers, which the simulator
and the command line's help never need.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Trajectories carry rstar2-algo's record; it stays importable from here too.
    from rstar2_algo import TrajectoryQuality as TrajectoryQuality
    from rstar2_scheduler.compute import device_executor as device_executor
    from rstar2_scheduler.compute import run_on_device as run_on_device
    from rstar2_scheduler.engine import Capability as Capability
    from rstar2_scheduler.engine import Engine as Engine
    from rstar2_scheduler.engine import GenerationRequest as GenerationRequest
    from rstar2_scheduler.engine import GenerationResult as GenerationResult
    from rstar2_scheduler.engine import KVStats as KVStats
    from rstar2_scheduler.engine import NamedTensors as NamedTensors
    from rstar2_scheduler.engine import SamplingParams as SamplingParams
    from rstar2_scheduler.engine import UnsupportedOperationError as UnsupportedOperationError
    from rstar2_scheduler.engines import OpenAIEngine as OpenAIEngine
    from rstar2_scheduler.engines import OpenAIEngineConfig as OpenAIEngineConfig
    from rstar2_scheduler.engines import ProcessEngine as ProcessEngine
    from rstar2_scheduler.engines import ProcessEngineConfig as ProcessEngineConfig
    from rstar2_scheduler.engines import TransformersEngine as TransformersEngine
    from rstar2_scheduler.engines import TransformersEngineConfig as TransformersEngineConfig
    from rstar2_scheduler.engines import VLLMEngine as VLLMEngine
    from rstar2_scheduler.engines import VLLMEngineConfig as VLLMEngineConfig
    from rstar2_scheduler.metrics import EngineMetrics as EngineMetrics
    from rstar2_scheduler.metrics import LatencySummary as LatencySummary
    from rstar2_scheduler.metrics import PhaseMetrics as PhaseMetrics
    from rstar2_scheduler.policies import PolicyName as PolicyName
    from rstar2_scheduler.protocol import ChatConfig as ChatConfig
    from rstar2_scheduler.protocol import ChatProtocol as ChatProtocol
    from rstar2_scheduler.protocol import EncodedTranscript as EncodedTranscript
    from rstar2_scheduler.protocol import TemplateError as TemplateError
    from rstar2_scheduler.protocol import ToolCallParser as ToolCallParser
    from rstar2_scheduler.protocol import ToolOutputFormatter as ToolOutputFormatter
    from rstar2_scheduler.protocol import TranscriptError as TranscriptError
    from rstar2_scheduler.protocol import check_prefix_preserving as check_prefix_preserving
    from rstar2_scheduler.protocol import encode_transcript as encode_transcript
    from rstar2_scheduler.protocol import install_chat_template as install_chat_template
    from rstar2_scheduler.protocol import user_prompt as user_prompt
    from rstar2_scheduler.rollout import RolloutConfig as RolloutConfig
    from rstar2_scheduler.rollout import RolloutRunner as RolloutRunner
    from rstar2_scheduler.scheduler import JobResult as JobResult
    from rstar2_scheduler.scheduler import RolloutJob as RolloutJob
    from rstar2_scheduler.scheduler import RolloutPhase as RolloutPhase
    from rstar2_scheduler.scheduler import RolloutScheduler as RolloutScheduler
    from rstar2_scheduler.scheduler import SchedulerConfig as SchedulerConfig
    from rstar2_scheduler.sim import SimEngine as SimEngine
    from rstar2_scheduler.sim import SimEngineConfig as SimEngineConfig
    from rstar2_scheduler.staleness import StalenessBuffer as StalenessBuffer
    from rstar2_scheduler.staleness import TurnGate as TurnGate
    from rstar2_scheduler.staleness import produce as produce
    from rstar2_scheduler.trajectory import StopReason as StopReason
    from rstar2_scheduler.trajectory import Trajectory as Trajectory
    from rstar2_scheduler.trajectory import TurnRecord as TurnRecord

    __version__: str

_EXPORTS = {
    "TrajectoryQuality": "rstar2_algo",
    "device_executor": "rstar2_scheduler.compute",
    "run_on_device": "rstar2_scheduler.compute",
    "Capability": "rstar2_scheduler.engine",
    "Engine": "rstar2_scheduler.engine",
    "GenerationRequest": "rstar2_scheduler.engine",
    "GenerationResult": "rstar2_scheduler.engine",
    "KVStats": "rstar2_scheduler.engine",
    "NamedTensors": "rstar2_scheduler.engine",
    "SamplingParams": "rstar2_scheduler.engine",
    "UnsupportedOperationError": "rstar2_scheduler.engine",
    "OpenAIEngine": "rstar2_scheduler.engines",
    "OpenAIEngineConfig": "rstar2_scheduler.engines",
    "ProcessEngine": "rstar2_scheduler.engines",
    "ProcessEngineConfig": "rstar2_scheduler.engines",
    "TransformersEngine": "rstar2_scheduler.engines",
    "TransformersEngineConfig": "rstar2_scheduler.engines",
    "VLLMEngine": "rstar2_scheduler.engines",
    "VLLMEngineConfig": "rstar2_scheduler.engines",
    "EngineMetrics": "rstar2_scheduler.metrics",
    "LatencySummary": "rstar2_scheduler.metrics",
    "PhaseMetrics": "rstar2_scheduler.metrics",
    "PolicyName": "rstar2_scheduler.policies",
    "ChatConfig": "rstar2_scheduler.protocol",
    "ChatProtocol": "rstar2_scheduler.protocol",
    "EncodedTranscript": "rstar2_scheduler.protocol",
    "TemplateError": "rstar2_scheduler.protocol",
    "ToolCallParser": "rstar2_scheduler.protocol",
    "ToolOutputFormatter": "rstar2_scheduler.protocol",
    "TranscriptError": "rstar2_scheduler.protocol",
    "check_prefix_preserving": "rstar2_scheduler.protocol",
    "encode_transcript": "rstar2_scheduler.protocol",
    "install_chat_template": "rstar2_scheduler.protocol",
    "user_prompt": "rstar2_scheduler.protocol",
    "RolloutConfig": "rstar2_scheduler.rollout",
    "RolloutRunner": "rstar2_scheduler.rollout",
    "JobResult": "rstar2_scheduler.scheduler",
    "RolloutJob": "rstar2_scheduler.scheduler",
    "RolloutPhase": "rstar2_scheduler.scheduler",
    "RolloutScheduler": "rstar2_scheduler.scheduler",
    "SchedulerConfig": "rstar2_scheduler.scheduler",
    "SimEngine": "rstar2_scheduler.sim",
    "SimEngineConfig": "rstar2_scheduler.sim",
    "StalenessBuffer": "rstar2_scheduler.staleness",
    "TurnGate": "rstar2_scheduler.staleness",
    "produce": "rstar2_scheduler.staleness",
    "StopReason": "rstar2_scheduler.trajectory",
    "Trajectory": "rstar2_scheduler.trajectory",
    "TurnRecord": "rstar2_scheduler.trajectory",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("rstar2-scheduler")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_scheduler' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
