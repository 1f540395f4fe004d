"""OpenAIEngine beyond the conformance suite: the one probe of what a server accepts, text
servers (re-encoded completions, restored stop tokens, the server's token counts), servers that
refuse vLLM's extensions or return no log-probs, special tokens a text server drops, /metrics."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math

import pytest
from aiohttp import web
from openai_server import BODIES, create_app, create_transformers_like_app, serve
from scripted import FakeSandbox, ScriptedEngine
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

from rstar2_data import PYTHON_TOOL_NAME, MathProblem
from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.engines import (
    EndpointError,
    OpenAIEngine,
    OpenAIEngineConfig,
    parse_kv_metrics,
)
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner

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

PROBLEM = MathProblem(
    id="p1", source="test", problem="What is 6 * 7?", answer="42", answer_kind="integer"
)
MARKERS = ("<tool_call>", "</tool_call>")


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


def ask(
    n: int = 32, *, stop: tuple[int, ...] = (2,), temperature: float = 1.0
) -> GenerationRequest:
    return GenerationRequest(
        request_id="t",
        prompt_ids=(5, 6, 7),
        sampling=SamplingParams(
            max_new_tokens=n, stop_token_ids=stop, seed=1, temperature=temperature
        ),
    )


def end_id(tokenizer: PreTrainedTokenizerFast) -> int:
    return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))


def with_special_markers(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The test tokenizer with the tool-call tags as special tokens (as some checkpoints ship)."""
    special = copy.deepcopy(tokenizer)
    special.add_tokens(
        [AddedToken(marker, special=True, normalized=False) for marker in MARKERS],
        special_tokens=True,
    )
    return special


def tool_turn(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    arguments = {"code": "print(6 * 7)", "input": ""}
    call = json.dumps({"name": PYTHON_TOOL_NAME, "arguments": arguments})
    ids: list[int] = tokenizer.encode(
        f"Let me run it.\n<tool_call>\n{call}\n</tool_call>", add_special_tokens=False
    )
    return [*ids, end_id(tokenizer)]


@pytest.mark.asyncio
async def test_text_server_is_probed_once_and_its_stop_token_is_not_trained_on(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    end = end_id(tokenizer)
    words = tokenizer.encode("The program printed 42.", add_special_tokens=False)
    probe = [end]  # the probe's one-token completion
    backend = ScriptedEngine([probe, [*words, end], [*words, end]])
    app = create_app(backend, tokenizer, token_ids=False, metrics=False)
    caplog.set_level(logging.INFO, logger="rstar2_scheduler")
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="tiny", capacity_tokens=999)
        async with OpenAIEngine(config, tokenizer) as engine:
            request = ask(stop=(end,))
            first = await engine.generate(request)
            second = await engine.generate(request)
            stats = engine.kv_stats()
            capabilities = engine.server_capabilities
    assert first.finish_reason == "stop"
    # The server dropped the stop string and its log-prob: the stop token is restored with loss
    # mask 0, so neither a trainer nor a TIS ratio reads a made-up log-prob.
    assert first.token_ids == (*words, end)
    assert first.logprobs == pytest.approx([-(i + 1) / 100 for i in range(len(words))] + [0.0])
    assert first.loss_mask == (*[1] * len(words), 0)
    assert first.reencoded
    assert first.counted_tokens == len(words) + 1
    assert second.token_ids == first.token_ids
    assert capabilities is not None
    assert (capabilities.prompt, capabilities.completion_ids) == ("text", "reencoded")
    assert capabilities.stop_token_logprob == "masked"
    assert capabilities.token_counts == "server"
    prompts = [body["prompt"] for body in app[BODIES]]
    # The probe tried token ids (three shapes, rejected) then text, once; then one request each.
    assert [isinstance(p, list) for p in prompts] == [True, True, True, False, False, False]
    assert backend.requests[1].prompt_ids == (5, 6, 7)
    assert (stats.capacity_tokens, stats.used_tokens, stats.running) == (999, 0, 0)
    assert "token-id prompts with vLLM/SGLang extension fields: rejected (HTTP 400" in caplog.text


@pytest.mark.asyncio
async def test_stop_token_log_prob_is_taken_from_a_server_that_returns_it(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    end = end_id(tokenizer)
    words = tokenizer.encode("The program printed 42.", add_special_tokens=False)
    backend = ScriptedEngine([[end], [*words, end]])
    app = create_app(backend, tokenizer, token_ids=False, metrics=False, keep_stop=True)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="tiny", metrics_url="")
        async with OpenAIEngine(config, tokenizer) as engine:
            result = await engine.generate(ask(stop=(end,)))
    assert result.token_ids == (*words, end)
    assert result.logprobs == pytest.approx([-(i + 1) / 100 for i in range(len(words) + 1)])
    assert result.loss_mask is None  # every token has the server's log-prob: all trained on


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


@pytest.mark.parametrize(
    ("body", "version"),
    [
        ({"metadata": {"weight_version": "step-3"}}, "step-3"),  # SGLang's OpenAI responses
        ({"meta_info": {"weight_version": 4}}, "4"),  # on the choice
        ({}, None),  # vLLM reports none
    ],
)
@pytest.mark.asyncio
async def test_a_servers_weights_version_reaches_the_result(
    body: dict[str, object], version: str | None
) -> None:
    async def versioned(request: web.Request) -> web.Response:
        choice: dict[str, object] = {
            "text": "hi",
            "finish_reason": "length",
            "token_ids": [1, 2],
            "logprobs": {"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-0.1, -0.2]},
        }
        data: dict[str, object] = {"choices": [choice]}
        if "meta_info" in body:
            choice["meta_info"] = body["meta_info"]
        else:
            data.update(body)
        return web.json_response(data)

    app = web.Application()
    app.router.add_post("/v1/completions", versioned)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="")
        async with OpenAIEngine(config) as engine:
            result = await engine.generate(ask())
    assert result.token_ids == (1, 2)
    assert result.weights_version == version


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
    # Evaluation reads no log-probs; placeholders that cannot pass for real ones, not trained on.
    assert all(math.isnan(value) for value in result.logprobs)
    assert result.loss_mask == (0, 0)


@pytest.mark.asyncio
async def test_transformers_serve_is_probed_once_and_asked_to_sample(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that refuses vLLM's fields (422) and token-id prompts (400), as transformers
    serve does: found once before the first rollouts, explained rightly, asked to sample through
    its generation_config."""
    end = end_id(tokenizer)
    words = tokenizer.encode("The program printed 42.", add_special_tokens=False)
    backend = ScriptedEngine([[end]] + [[*words, end]] * 5)
    app = create_transformers_like_app(backend, tokenizer)
    caplog.set_level(logging.INFO, logger="rstar2_scheduler")
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="", require_logprobs=False)
        async with OpenAIEngine(config, tokenizer) as engine:
            probes = len(app[BODIES])
            # Concurrent first requests, as a scheduler starts them: no rejected request each.
            results = await asyncio.gather(
                *(engine.generate(ask(stop=(end,))) for _ in range(4)),
                engine.generate(ask(stop=(end,), temperature=0.0)),
            )
    assert probes == 5  # ids + extensions, ids + generation_config, ids, text + extensions, text
    assert len(app[BODIES]) == probes + 5  # then one request per generation
    for result in results:
        assert result.finish_reason == "stop"
        assert result.token_ids == (*words, end)
        assert result.counted_tokens == len(words) + 1
    bodies = app[BODIES][probes:]
    assert all(isinstance(body["prompt"], str) for body in bodies)
    sampled = json.loads(bodies[0]["generation_config"])
    assert sampled == {
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    assert json.loads(bodies[-1]["generation_config"]) == {"do_sample": False}
    # The backend sampled as asked, not greedily.
    assert [r.sampling.temperature for r in backend.requests[1:]] == [1.0] * 4 + [0.0]
    # The log says what was rejected and why: token ids by their prompt, not by the fields.
    assert "token-id prompts with OpenAI fields only: rejected (HTTP 400: prompt must be" in (
        caplog.text
    )
    assert "text prompts with vLLM/SGLang extension fields: rejected (HTTP 422" in caplog.text
    assert "sampling via generation_config" in caplog.text


@pytest.mark.asyncio
async def test_budget_counts_the_servers_tokens_not_the_reencoded_text(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A server whose text re-encodes into more tokens than it generated (bytes of a split
    character decoded to U+FFFD): the rollout's budget spends the server's count."""
    end = end_id(tokenizer)
    generated = 6
    text = "\ufffd\ufffd 42 \ufffd\ufffd"
    seen: list[int] = []

    async def lossy(request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body["prompt"], str) or "generation_config" not in body:
            return web.json_response({"detail": "no"}, status=422)
        seen.append(body["max_tokens"])
        choice = {"text": text, "finish_reason": "stop", "logprobs": None}
        return web.json_response(
            {"choices": [choice], "usage": {"completion_tokens": generated + 1}}
        )

    app = web.Application()
    app.router.add_post("/v1/completions", lossy)
    sandbox = FakeSandbox()
    runner = RolloutRunner(tokenizer, sandbox, RolloutConfig(max_response_tokens=64))
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="", require_logprobs=False)
        async with OpenAIEngine(config, tokenizer) as engine:
            result = await engine.generate(ask(stop=(end,)))
            trajectory = await runner.rollout(PROBLEM, engine)
    reencoded = len(tokenizer.encode(text, add_special_tokens=False)) + 1
    assert reencoded > generated + 1  # the case: the text is longer than what was generated
    assert (result.generated_tokens, len(result.token_ids)) == (generated + 1, reencoded)
    turn = trajectory.turns[0]
    assert (turn.model_tokens, turn.reencoded_tokens) == (generated + 1, reencoded)
    assert trajectory.response_tokens == generated + 1
    assert seen[-1] == 64  # the whole budget was offered to the only turn


@pytest.mark.asyncio
async def test_budget_of_later_turns_follows_the_servers_count(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    end = end_id(tokenizer)
    budget = 400
    first = tool_turn(tokenizer)
    answer = [*tokenizer.encode("It is \\boxed{42}.", add_special_tokens=False), end]
    backend = ScriptedEngine([[end], first, answer])
    app = create_transformers_like_app(backend, tokenizer)
    runner = RolloutRunner(tokenizer, FakeSandbox(), RolloutConfig(max_response_tokens=budget))
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="", require_logprobs=False)
        async with OpenAIEngine(config, tokenizer) as engine:
            trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "no_tool_call"
    turn = trajectory.turns[0]
    assert turn.tool_call is not None  # the markers are ordinary tokens here: the call survives
    assert turn.model_tokens == len(first)
    asked = [body["max_tokens"] for body in app[BODIES][-2:]]
    assert asked == [budget, budget - len(first) - turn.glue_tokens]


@pytest.mark.asyncio
async def test_special_tool_call_markers_on_a_server_that_drops_them_stop_the_engine(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    special = with_special_markers(tokenizer)
    end = end_id(special)
    backend = ScriptedEngine([[end], tool_turn(special)])
    app = create_transformers_like_app(backend, special)
    async with serve(app) as url:
        config = OpenAIEngineConfig(
            base_url=url, model="m", metrics_url="", require_logprobs=False, text_markers=MARKERS
        )
        engine = OpenAIEngine(config, special)
        with pytest.raises(EndpointError) as raised:
            await engine.start()
        result = await engine.generate(ask(stop=(end,)))
        await engine.close()
    message = str(raised.value)
    assert "'<tool_call>', '</tool_call>' are special tokens of this tokenizer" in message
    assert "refuses skip_special_tokens=false" in message
    assert "vLLM or SGLang" in message
    assert "special=False" in message
    assert result.finish_reason == "error"
    assert result.error == message
    assert len(backend.requests) == 1  # only the probe generated anything


@pytest.mark.asyncio
async def test_hidden_tokens_in_a_completion_fail_it_when_markers_are_special(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that accepts skip_special_tokens=false but drops special tokens anyway: its own
    token count shows what the text lost."""
    special = with_special_markers(tokenizer)
    end = end_id(special)
    turn = tool_turn(special)

    async def ignoring(request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body["prompt"], str):
            return web.json_response({"detail": "prompt must be a string"}, status=400)
        out = [end] if body["max_tokens"] == 1 else turn
        choice = {
            "text": special.decode(out, skip_special_tokens=True),
            "finish_reason": "stop",
            "logprobs": None,
        }
        return web.json_response({"choices": [choice], "usage": {"completion_tokens": len(out)}})

    app = web.Application()
    app.router.add_post("/v1/completions", ignoring)
    async with serve(app) as url:
        base = {"base_url": url, "model": "m", "metrics_url": "", "require_logprobs": False}
        config = OpenAIEngineConfig(**base, text_markers=MARKERS)
        async with OpenAIEngine(config, special) as engine:
            lost = await engine.generate(ask(stop=(end,)))
        # Without markers to protect, the count mismatch is reported once and budgets follow it.
        caplog.set_level(logging.WARNING, logger="rstar2_scheduler")
        async with OpenAIEngine(OpenAIEngineConfig(**base), special) as engine:
            kept = await engine.generate(ask(stop=(end,)))
    assert lost.finish_reason == "error"
    assert f"the server counted {len(turn)} completion tokens but its text shows" in (
        lost.error or ""
    )
    assert "'<tool_call>', '</tool_call>' are special tokens" in (lost.error or "")
    assert kept.finish_reason == "stop"
    assert kept.generated_tokens == len(turn)
    assert "tokens the text does not show" in caplog.text


@pytest.mark.asyncio
async def test_a_rejected_request_after_the_probe_does_not_change_the_dialect(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A 400 for one request (a prompt too long, say) is that request's error; the next still
    goes as token ids (an undecided client used to fall back to text for good)."""
    end = end_id(tokenizer)
    backend = ScriptedEngine([[end], [5, end], [6, end]])
    app = create_app(backend, tokenizer, metrics=False)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="")
        async with OpenAIEngine(config, tokenizer) as engine:
            first = await engine.generate(ask(stop=(end,)))
            backend.script.insert(2, first.model_copy(update={"finish_reason": "error"}))
            failed = await engine.generate(ask(stop=(end,)))
            third = await engine.generate(ask(stop=(end,)))
    assert first.token_ids == (5, end)
    assert not first.reencoded
    assert failed.finish_reason == "error"
    assert "HTTP 400" in (failed.error or "")
    assert third.token_ids == (6, end)
    assert all(isinstance(body["prompt"], list) for body in app[BODIES])


@pytest.mark.asyncio
async def test_server_accepting_nothing_is_an_endpoint_error(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"detail": "nope"}, status=422)

    app = web.Application()
    app.router.add_post("/v1/completions", refuse)
    async with serve(app) as url:
        config = OpenAIEngineConfig(base_url=url, model="m", metrics_url="")
        engine = OpenAIEngine(config, tokenizer)
        with pytest.raises(EndpointError, match="accepts none of the request shapes"):
            await engine.start()
        await engine.close()
