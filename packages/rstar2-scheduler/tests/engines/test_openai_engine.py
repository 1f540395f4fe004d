"""OpenAIEngine beyond the conformance suite: text fallback, /metrics parsing, server faults,
servers that refuse vLLM's extensions or return no log-probs."""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web
from openai_server import BODIES, create_app, serve
from scripted import ScriptedEngine
from transformers import PreTrainedTokenizerFast

from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.engines import OpenAIEngine, OpenAIEngineConfig, parse_kv_metrics

VLLM_PAGE = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 5.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"""

SGLANG_PAGE = """# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.5
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 6.0
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 4096.0
"""


def test_parse_vllm_metrics() -> None:
    stats = parse_kv_metrics(VLLM_PAGE)
    assert stats is not None
    assert (stats.capacity_tokens, stats.used_tokens) == (32000, 16000)
    assert (stats.running, stats.waiting, stats.preemptions) == (7, 1, 5)


def test_parse_sglang_metrics_and_missing_usage() -> None:
    stats = parse_kv_metrics(SGLANG_PAGE)
    assert stats is not None
    assert (stats.capacity_tokens, stats.used_tokens, stats.running, stats.waiting) == (
        4096,
        2048,
        2,
        6,
    )
    assert parse_kv_metrics("# TYPE other gauge\nother 1.0\n") is None
    fallback = parse_kv_metrics('vllm:kv_cache_usage_perc{engine="0"} 0.5\n', capacity_tokens=100)
    assert fallback is not None
    assert fallback.used_tokens == 50


def ask(n: int = 32) -> GenerationRequest:
    return GenerationRequest(
        request_id="t",
        prompt_ids=(5, 6, 7),
        sampling=SamplingParams(max_new_tokens=n, stop_token_ids=(2,), seed=1),
    )


@pytest.mark.asyncio
async def test_text_only_server_falls_back_to_text(tokenizer: PreTrainedTokenizerFast) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    words = tokenizer.encode("The program printed 42.", add_special_tokens=False)
    backend = ScriptedEngine([[*words, end], [*words, end]])
    app = create_app(backend, tokenizer, token_ids=False, metrics=False)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="tiny", capacity_tokens=999)
        async with OpenAIEngine(config, tokenizer) as engine:
            request = ask().model_copy(
                update={"sampling": SamplingParams(max_new_tokens=32, stop_token_ids=(end,))}
            )
            first = await engine.generate(request)
            second = await engine.generate(request)
            stats = engine.kv_stats()
    assert first.finish_reason == "stop"
    # The server dropped the stop string and its log-prob: the stop token is restored, at 0.0.
    assert first.token_ids == (*words, end)
    assert first.logprobs == pytest.approx([-(i + 1) / 100 for i in range(len(words))] + [0.0])
    assert second.token_ids == first.token_ids
    prompts = [body["prompt"] for body in app[BODIES]]
    assert isinstance(prompts[0], list)  # tried token ids first (rejected)...
    assert all(isinstance(p, str) for p in prompts[1:])  # ...then text, remembered
    assert len(prompts) == 3
    assert backend.requests[0].prompt_ids == (5, 6, 7)
    assert (stats.capacity_tokens, stats.used_tokens, stats.running) == (999, 0, 0)


@pytest.mark.asyncio
async def test_token_id_server_without_logprobs_fails_the_request() -> None:
    async def bare(request: web.Request) -> web.Response:
        choice = {"text": "hi", "finish_reason": "stop", "token_ids": [1, 2], "logprobs": None}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", bare)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="")
        async with OpenAIEngine(config) as engine:
            result = await engine.generate(ask())
    assert result.finish_reason == "error"
    assert "no log-probs" in (result.error or "")


@pytest.mark.asyncio
async def test_unreachable_server_is_an_error_result() -> None:
    config = OpenAIEngineConfig(base_url="http://127.0.0.1:9/v1", model="m", metrics_url="")
    async with OpenAIEngine(config) as engine:
        result = await engine.generate(ask())
    assert result.finish_reason == "error"
    assert "ClientConnectorError" in (result.error or "")


def test_text_prompts_need_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="needs the served model's tokenizer"):
        OpenAIEngine(OpenAIEngineConfig(base_url="http://x/v1", model="m", prompt_format="text"))


@pytest.mark.asyncio
async def test_completions_without_logprobs_are_accepted_when_not_required() -> None:
    async def bare(request: web.Request) -> web.Response:
        choice = {"text": "hi", "finish_reason": "stop", "token_ids": [1, 2], "logprobs": None}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", bare)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="", require_logprobs=False)
        async with OpenAIEngine(config) as engine:
            result = await engine.generate(ask())
    assert (result.finish_reason, result.token_ids) == ("stop", (1, 2))
    # Evaluation reads no log-probs; placeholders that cannot pass for real ones.
    assert all(math.isnan(value) for value in result.logprobs)
    assert len(result.logprobs) == 2


OPENAI_FIELDS = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "logprobs",
    "stop",
    "seed",
}


@pytest.mark.asyncio
async def test_server_refusing_unknown_fields_gets_openai_fields_only(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """Like `transformers serve`: 422 for any field outside the OpenAI API, 400 for token-id
    prompts, completion text with the stop string removed and no log-probs."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    words = tokenizer.encode("The program printed 42.", add_special_tokens=False)
    bodies: list[dict[str, object]] = []

    async def strict(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        unexpected = set(body) - OPENAI_FIELDS
        if unexpected:
            return web.json_response({"detail": f"Unexpected fields {unexpected}"}, status=422)
        if not isinstance(body["prompt"], str):
            return web.json_response({"detail": "prompt must be a string."}, status=400)
        choice = {"text": tokenizer.decode(words), "finish_reason": "stop", "logprobs": None}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", strict)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="", require_logprobs=False)
        async with OpenAIEngine(config, tokenizer) as engine:
            request = ask().model_copy(
                update={"sampling": SamplingParams(max_new_tokens=32, stop_token_ids=(end,))}
            )
            # Concurrent first requests all find their way while the engine learns the dialect.
            results = await asyncio.gather(*(engine.generate(request) for _ in range(4)))
            later = len(bodies)
            await engine.generate(request)
    for result in results:
        assert result.finish_reason == "stop"
        assert result.token_ids == (*words, end)
    assert set(bodies[-1]) <= OPENAI_FIELDS
    assert isinstance(bodies[-1]["prompt"], str)
    assert len(bodies) == later + 1  # once learnt, one request per generation
