"""``Engine`` implementations: in-process transformers, an OpenAI-compatible server, vLLM.

``VLLMEngine`` imports vLLM only when started (extra ``rstar2-scheduler[vllm]``).
"""

from rstar2_scheduler.engines.transformers import TransformersEngine, TransformersEngineConfig

__all__ = ["TransformersEngine", "TransformersEngineConfig"]
