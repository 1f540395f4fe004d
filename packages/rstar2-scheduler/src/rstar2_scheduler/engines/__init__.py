"""``Engine`` implementations: in-process transformers, an OpenAI-compatible server, vLLM.

``VLLMEngine`` imports vLLM only when started (extra ``rstar2-scheduler[vllm]``).
"""

from rstar2_scheduler.engines.openai import OpenAIEngine, OpenAIEngineConfig, PromptFormat
from rstar2_scheduler.engines.server_metrics import parse_kv_metrics
from rstar2_scheduler.engines.transformers import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig

__all__ = [
    "OpenAIEngine",
    "OpenAIEngineConfig",
    "PromptFormat",
    "TransformersEngine",
    "TransformersEngineConfig",
    "VLLMEngine",
    "VLLMEngineConfig",
    "parse_kv_metrics",
]
