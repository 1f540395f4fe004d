"""A minimal OpenAI-compatible completions server on top of any rstar2 ``Engine``.

It speaks vLLM's dialect of ``/v1/completions`` (token-id prompts, ``stop_token_ids``,
``return_token_ids``, ``return_tokens_as_token_ids``, sampled-token log-probs) and serves vLLM's
``/metrics`` names from the engine's ``kv_stats``, and counts the generated tokens in
``usage.completion_tokens``. With ``token_ids=False`` it behaves like a text-only server: string
prompts only, stop strings stripped from the returned text unless ``keep_stop`` (as vLLM's
``include_stop_str_in_output`` keeps them). ``create_transformers_like_app`` behaves as
``transformers serve`` does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from transformers import PreTrainedTokenizerBase

from rstar2_scheduler.engine import Engine, GenerationRequest, SamplingParams

BLOCK_SIZE = 16
BODIES = web.AppKey("bodies", list)  # every request body, for tests to inspect


def create_app(
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    *,
    token_ids: bool = True,
    metrics: bool = True,
    keep_stop: bool = False,
) -> web.Application:
    counter = iter(range(1 << 62))

    async def completions(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        request.app[BODIES].append(body)
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if not token_ids:
                return web.json_response({"error": "prompt must be a string"}, status=400)
            ids = [int(t) for t in prompt]
        else:
            ids = tokenizer.encode(prompt, add_special_tokens=False)
        stops = list(body.get("stop_token_ids") or [])
        if not token_ids:  # a text server knows stop strings only
            encoded = [
                tokenizer.encode(s, add_special_tokens=False) for s in body.get("stop") or []
            ]
            stops = [ids[0] for ids in encoded if len(ids) == 1]
        result = await engine.generate(
            GenerationRequest(
                request_id=f"cmpl-{next(counter)}",
                prompt_ids=tuple(ids),
                sampling=SamplingParams(
                    max_new_tokens=body.get("max_tokens", 16),
                    temperature=body.get("temperature", 1.0),
                    top_p=body.get("top_p", 1.0),
                    stop_token_ids=tuple(stops),
                    seed=body.get("seed"),
                ),
            )
        )
        if result.finish_reason == "error":
            return web.json_response({"error": result.error}, status=400)
        out, logprobs = list(result.token_ids), list(result.logprobs)
        generated = len(out)
        if not token_ids and not keep_stop and result.finish_reason == "stop":
            out, logprobs = out[:-1], logprobs[:-1]  # the stop string is not returned
        text = tokenizer.decode(out, skip_special_tokens=False)
        if token_ids and body.get("return_tokens_as_token_ids"):
            tokens = [f"token_id:{t}" for t in out]
        else:
            tokens = [tokenizer.decode([t]) for t in out]
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "finish_reason": result.finish_reason,
            "logprobs": {"tokens": tokens, "token_logprobs": logprobs}
            if body.get("logprobs") is not None
            else None,
        }
        if token_ids and body.get("return_token_ids"):
            choice["token_ids"] = out
        usage = {"prompt_tokens": len(ids), "completion_tokens": generated}
        return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})

    async def metrics_page(request: web.Request) -> web.Response:
        stats = engine.kv_stats()
        blocks = stats.capacity_tokens // BLOCK_SIZE
        page = (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {stats.usage}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {stats.running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {stats.waiting}\n'
            "# TYPE vllm:num_preemptions counter\n"
            f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {stats.preemptions}\n'
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",'
            f'num_gpu_blocks="{blocks}"}} 1.0\n'
        )
        return web.Response(text=page, content_type="text/plain")

    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/completions", completions)
    if metrics:
        app.router.add_get("/metrics", metrics_page)
    return app


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free local port; yields the API root URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


# The request fields ``transformers serve`` (5.19 to 5.24) accepts on /v1/completions: the OpenAI
# API's, plus its own generation_config; anything else is answered with HTTP 422.
TRANSFORMERS_SERVE_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
        "generation_config",
    }
)


def create_transformers_like_app(
    engine: Engine, tokenizer: PreTrainedTokenizerBase, *, checkpoint_samples: bool = False
) -> web.Application:
    """``transformers serve``'s /v1/completions as its source behaves, on any rstar2 engine.

    Fields outside the OpenAI API (but ``generation_config``) get HTTP 422 and non-string prompts
    HTTP 400. It samples only when the checkpoint's generation config says so
    (``checkpoint_samples``) or the request's ``generation_config`` sets ``do_sample``; otherwise
    ``temperature`` is ignored and decoding is greedy. Stop strings end generation; the text is
    decoded with special tokens skipped; ``usage.completion_tokens`` counts every generated token
    and no log-probs come back.
    """
    counter = iter(range(1 << 62))

    async def completions(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        request.app[BODIES].append(body)
        unexpected = set(body) - TRANSFORMERS_SERVE_FIELDS
        if unexpected:
            detail = f"Unexpected fields in the request: {unexpected}"
            return web.json_response({"detail": detail}, status=422)
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            return web.json_response({"detail": "prompt must be a string."}, status=400)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        encoded = [tokenizer.encode(s, add_special_tokens=False) for s in body.get("stop") or []]
        asked = json.loads(body["generation_config"]) if "generation_config" in body else {}
        sample = asked.get("do_sample", checkpoint_samples)
        result = await engine.generate(
            GenerationRequest(
                request_id=f"cmpl-{next(counter)}",
                prompt_ids=tuple(ids),
                sampling=SamplingParams(
                    max_new_tokens=body.get("max_tokens", 16),
                    temperature=body.get("temperature", 1.0) if sample else 0.0,
                    top_p=body.get("top_p", 1.0),
                    stop_token_ids=tuple(stop[0] for stop in encoded if len(stop) == 1),
                    seed=body.get("seed"),
                ),
            )
        )
        if result.finish_reason == "error":
            return web.json_response({"detail": result.error}, status=500)
        out = list(result.token_ids)
        choice = {
            "index": 0,
            "text": tokenizer.decode(out, skip_special_tokens=True),
            "finish_reason": "length" if result.finish_reason == "length" else "stop",
            "logprobs": None,
        }
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out)}
        return web.json_response({"object": "text_completion", "choices": [choice], "usage": usage})

    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/completions", completions)
    return app
