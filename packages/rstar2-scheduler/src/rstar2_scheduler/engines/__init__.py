"""``Engine`` implementations: in-process transformers (or in a child process), an
OpenAI-compatible server, vLLM.

``VLLMEngine`` imports vLLM only when started (extra ``rstar2-scheduler[vllm]``).
"""

from rstar2_scheduler.engines.openai import EndpointError, OpenAIEngine, OpenAIEngineConfig
from rstar2_scheduler.engines.openai_dialect import PromptFormat, ServerCapabilities
from rstar2_scheduler.engines.process import ProcessEngine, ProcessEngineConfig
from rstar2_scheduler.engines.server_metrics import parse_kv_metrics
from rstar2_scheduler.engines.transformers import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engines.vllm import (
    LogprobsMode,
    SyncPhase,
    VLLMEngine,
    VLLMEngineConfig,
    WeightSyncStats,
    logprobs_mode_for,
    temperature_logprobs,
)
from rstar2_scheduler.engines.vllm_worker import WeightSyncExtension

__all__ = [
    "EndpointError",
    "LogprobsMode",
    "OpenAIEngine",
    "OpenAIEngineConfig",
    "ProcessEngine",
    "ProcessEngineConfig",
    "PromptFormat",
    "ServerCapabilities",
    "SyncPhase",
    "TransformersEngine",
    "TransformersEngineConfig",
    "VLLMEngine",
    "VLLMEngineConfig",
    "WeightSyncExtension",
    "WeightSyncStats",
    "logprobs_mode_for",
    "parse_kv_metrics",
    "temperature_logprobs",
]
