"""VLLMEngine: the missing extra is named; where vLLM is installed, its API is what we call.

No GPU runs these tests, so no model is loaded: they check the import error, the sampling
parameters built for vLLM, and the stat logger that feeds ``kv_stats``.
"""

from __future__ import annotations

import importlib.util

import pytest

from rstar2_scheduler.engine import SamplingParams
from rstar2_scheduler.engines import VLLMEngine, VLLMEngineConfig
from rstar2_scheduler.engines.vllm import _stat_logger_factory, vllm_sampling_params

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
@pytest.mark.asyncio
async def test_missing_extra_is_named() -> None:
    engine = VLLMEngine(VLLMEngineConfig(model="some/model"))
    with pytest.raises(ImportError, match=r'pip install "rstar2-scheduler\[vllm\]"'):
        await engine.start()
    with pytest.raises(RuntimeError, match="call start"):
        _ = engine.llm


@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra")
def test_sampling_params_for_installed_vllm() -> None:
    from vllm.sampling_params import RequestOutputKind

    params = vllm_sampling_params(
        SamplingParams(max_new_tokens=7, temperature=0.5, top_p=0.9, stop_token_ids=(2, 3), seed=4)
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (7, 0.5, 0.9, 4)
    assert params.stop_token_ids == [2, 3]
    assert params.logprobs == 0
    assert params.output_kind is RequestOutputKind.FINAL_ONLY
    assert not params.detokenize


@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra")
def test_stat_logger_feeds_kv_stats() -> None:
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    engine = VLLMEngine(VLLMEngineConfig(model="some/model"))
    engine._capacity = 1000  # set by start() from vLLM's cache config
    factory = _stat_logger_factory(engine._stats)
    stat_logger = factory(None, 0)
    assert isinstance(stat_logger, StatLoggerBase)
    iteration = IterationStats()
    iteration.num_preempted_reqs = 2
    scheduler = SchedulerStats(num_running_reqs=3, num_waiting_reqs=5, kv_cache_usage=0.25)
    stat_logger.record(scheduler, iteration)
    stat_logger.record(None, iteration)
    stats = engine.kv_stats()
    assert (stats.capacity_tokens, stats.used_tokens) == (1000, 250)
    assert (stats.running, stats.waiting, stats.preemptions) == (3, 5, 4)
