"""``Engine`` implementations: in-process transformers (or in a child process), an
OpenAI-compatible server, vLLM.

``VLLMEngine`` imports vLLM only when started (extra ``rstar2-scheduler[vllm]``).
"""

from rstar2_scheduler.engines.openai import EndpointError, OpenAIEngine, OpenAIEngineConfig
from rstar2_scheduler.engines.openai_dialect import PromptFormat, ServerCapabilities
from rstar2_scheduler.engines.process import ProcessEngine, ProcessEngineConfig
from rstar2_scheduler.engines.server_metrics import parse_kv_metrics
from rstar2_scheduler.engines.transformers import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig, WeightSyncStats
from rstar2_scheduler.engines.vllm_worker import WeightSyncExtension

__all__ = [
    "EndpointError",
    "OpenAIEngine",
    "OpenAIEngineConfig",
    "ProcessEngine",
    "ProcessEngineConfig",
    "PromptFormat",
    "ServerCapabilities",
    "TransformersEngine",
    "TransformersEngineConfig",
    "VLLMEngine",
    "VLLMEngineConfig",
    "WeightSyncExtension",
    "WeightSyncStats",
    "parse_kv_metrics",
]
