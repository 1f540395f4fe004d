"""Any OpenAI-compatible server (vLLM, SGLang, ...) behind the ``Engine`` interface.

Requests go to the legacy ``/completions`` endpoint. With ``prompt_format="token_ids"`` the prompt
is sent as a list of token ids and the completion comes back as token ids (vLLM's
``return_token_ids``, or ``return_tokens_as_token_ids`` log-prob tokens), so nothing is
re-tokenized. Servers that only take text get the decoded prompt and their completion text is
re-encoded with the local tokenizer (``prompt_format="text"``); ``"auto"`` tries token ids first
and falls back to text when the server rejects them. A text request the server rejects is retried
once with the fields of the OpenAI API alone (no vLLM extensions such as ``stop_token_ids``), for
servers that refuse unknown fields (``transformers serve``); that choice is remembered too.

Sampling log-probs are required by default (RL trains on them): a server that returns none fails
the request. Evaluation needs none: with ``require_logprobs=False`` such completions are accepted
and their log-probs are NaN placeholders.

vLLM reports raw-model log-probs unless started with ``--logprobs-mode processed_logprobs``; start
it so for temperature-scaled log-probs matching what the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedTokenizerBase

from rstar2_scheduler.engine import (
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    KVStats,
)
from rstar2_scheduler.engines.server_metrics import parse_kv_metrics

logger = logging.getLogger(__name__)

PromptFormat = Literal["auto", "token_ids", "text"]
_TOKEN_ID_PREFIX = "token_id:"
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class OpenAIEngineConfig(BaseModel):
    """Where the server is and how to talk to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="API root, e.g. http://localhost:8000/v1.")
    model: str = Field(min_length=1, description="Model name the server serves.")
    name: str = Field(default="openai", min_length=1)
    api_key: str | None = None
    prompt_format: PromptFormat = "auto"
    metrics_url: str | None = Field(
        default=None,
        description="Prometheus page with KV statistics; default <root>/metrics; '' for none.",
    )
    metrics_interval_s: float = Field(default=1.0, gt=0)
    capacity_tokens: int | None = Field(
        default=None, gt=0, description="KV capacity when /metrics does not report it."
    )
    request_timeout_s: float = Field(default=3600.0, gt=0)
    max_connections: int = Field(default=512, gt=0)
    require_logprobs: bool = Field(
        default=True,
        description="Fail completions without sampling log-probs (RL needs them); False accepts "
        "them with NaN log-probs (evaluation reads none).",
    )


class _RejectedError(Exception):
    """The server refused the request's prompt format (HTTP 400/422)."""


class OpenAIEngine(Engine):
    """Generates through an OpenAI-compatible completions endpoint.

    ``tokenizer`` (the served model's) is needed for text prompts; token-id servers need none.
    """

    unsupported_reason: ClassVar[str] = (
        "a remote OpenAI-compatible server takes no weights or memory commands from a client; "
        "run the model in-process (VLLMEngine or TransformersEngine) to train it"
    )

    def __init__(
        self, config: OpenAIEngineConfig, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> None:
        if config.prompt_format == "text" and tokenizer is None:
            raise ValueError("prompt_format='text' needs the served model's tokenizer")
        self.config = config
        self.name = config.name
        self.tokenizer = tokenizer
        self._format: PromptFormat = config.prompt_format
        self._openai_fields_only = False
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stats: KVStats | None = None
        self._in_flight = 0
        root = urlsplit(config.base_url)
        default_metrics = f"{root.scheme}://{root.netloc}/metrics"
        self._metrics_url = (
            default_metrics if config.metrics_url is None else config.metrics_url or None
        )

    async def start(self) -> None:
        if self._session is not None:
            return
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
            connector=aiohttp.TCPConnector(limit=self.config.max_connections),
        )
        if self._metrics_url is not None and await self._read_metrics(self._metrics_url):
            # The first reading is awaited, so kv_stats is meaningful as soon as start returns.
            self._poller = asyncio.create_task(self._poll_metrics(self._metrics_url))

    async def close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def kv_stats(self) -> KVStats:
        """The last ``/metrics`` reading; without one, the capacity and own in-flight count."""
        if self._stats is not None:
            return self._stats
        return KVStats(
            capacity_tokens=self.config.capacity_tokens or 0, used_tokens=0, running=self._in_flight
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self.start()
        self._in_flight += 1
        try:
            return await self._generate(request)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as failure:
            return GenerationResult.failed(
                request.request_id, f"{type(failure).__name__}: {failure}"
            )
        finally:
            self._in_flight -= 1

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if self._format == "text":
            return await self._text(request)
        try:
            data = await self._complete(request, text=False)
        except _RejectedError as rejected:
            if self._format == "token_ids" or self.tokenizer is None:
                return GenerationResult.failed(request.request_id, f"server rejected: {rejected}")
            # "auto" and undecided: the server may only take text prompts.
            result = await self._text(request)
            if result.finish_reason != "error":
                logger.info("%s: token-id prompts rejected (%s); using text", self.name, rejected)
                self._format = "text"
            return result
        self._format = "token_ids"
        return self._token_result(request, data)

    async def _text(self, request: GenerationRequest) -> GenerationResult:
        openai_only = self._openai_fields_only
        try:
            data = await self._complete(request, text=True, openai_only=openai_only)
        except _RejectedError as rejected:
            if openai_only:
                return GenerationResult.failed(request.request_id, f"server rejected: {rejected}")
            # The server may refuse vLLM's extension fields: retry with the OpenAI API's alone.
            try:
                data = await self._complete(request, text=True, openai_only=True)
            except _RejectedError as again:
                return GenerationResult.failed(request.request_id, f"server rejected: {again}")
            if not self._openai_fields_only:
                logger.info(
                    "%s: extension fields rejected (%s); sending OpenAI fields only",
                    self.name,
                    rejected,
                )
                self._openai_fields_only = True
        return self._text_result(request, data)

    async def _complete(
        self, request: GenerationRequest, *, text: bool, openai_only: bool = False
    ) -> dict[str, Any]:
        assert self._session is not None  # set by start()
        sampling = request.sampling
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": self._decode(request.prompt_ids) if text else list(request.prompt_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
        }
        if not openai_only:
            body.update(
                stop_token_ids=list(sampling.stop_token_ids),
                skip_special_tokens=False,
                include_stop_str_in_output=True,
                return_tokens_as_token_ids=True,
                return_token_ids=True,
            )
        if text:
            body["stop"] = [self._decode([token]) for token in sampling.stop_token_ids] or None
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        url = self.config.base_url.rstrip("/") + "/completions"
        async with self._session.post(url, json=body) as response:
            if response.status in (400, 422):
                raise _RejectedError(f"HTTP {response.status}: {(await response.text())[:300]}")
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {(await response.text())[:300]}")
            data: dict[str, Any] = await response.json()
        return data

    def _token_result(self, request: GenerationRequest, data: dict[str, Any]) -> GenerationResult:
        choice = data["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if logprobs is None and self.config.require_logprobs:
            return GenerationResult.failed(
                request.request_id, "the server returned no log-probs (request logprobs=0)"
            )
        token_ids = choice.get("token_ids")
        if token_ids is None:
            tokens = (choice.get("logprobs") or {}).get("tokens") or []
            if not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
                return GenerationResult.failed(
                    request.request_id, "the server returned neither token_ids nor token-id tokens"
                )
            token_ids = [int(t.removeprefix(_TOKEN_ID_PREFIX)) for t in tokens]
        if logprobs is None:
            logprobs = [math.nan] * len(token_ids)
        return _result(request, token_ids, logprobs, choice.get("finish_reason"))

    def _text_result(self, request: GenerationRequest, data: dict[str, Any]) -> GenerationResult:
        assert self.tokenizer is not None
        choice = data["choices"][0]
        reported = (choice.get("logprobs") or {}).get("token_logprobs")
        if reported is None and self.config.require_logprobs:
            return GenerationResult.failed(
                request.request_id, "the server returned no log-probs (request logprobs=0)"
            )
        token_ids: list[int] = self.tokenizer.encode(choice["text"], add_special_tokens=False)
        logprobs = list(reported) if reported is not None else []
        stops = request.sampling.stop_token_ids
        ended = bool(token_ids) and token_ids[-1] in stops
        if choice.get("finish_reason") == "stop" and stops and not ended:
            # Text servers drop the stop string; the turn still ended with a stop token. Its
            # log-prob is kept when the server reported it, else 0.0 (it is not trained on
            # differently: the rollout masks nothing by log-prob).
            token_ids.append(stops[0])
            if reported is not None and len(logprobs) == len(token_ids) - 1:
                logprobs.append(0.0)
        if reported is None:
            logprobs = [math.nan] * len(token_ids)
        if len(logprobs) != len(token_ids):
            return GenerationResult.failed(
                request.request_id,
                f"text completion re-encodes to {len(token_ids)} tokens but the server returned "
                f"{len(logprobs)} log-probs",
            )
        return _result(request, token_ids, logprobs, choice.get("finish_reason"))

    def _decode(self, ids: Any) -> str:
        assert self.tokenizer is not None
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return str(text)

    async def _poll_metrics(self, url: str) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_interval_s)
            if not await self._read_metrics(url):
                return

    async def _read_metrics(self, url: str) -> bool:
        """Refresh the KV statistics; False when the server has no metrics page."""
        assert self._session is not None
        try:
            async with self._session.get(url) as response:
                if response.status == 404:
                    logger.info("%s: %s not found; no KV statistics", self.name, url)
                    return False
                page = await response.text()
            self._stats = parse_kv_metrics(page, capacity_tokens=self.config.capacity_tokens)
        except (aiohttp.ClientError, TimeoutError, ValueError) as failure:
            logger.debug("%s: reading %s failed: %r", self.name, url, failure)
        return True


def _result(
    request: GenerationRequest, token_ids: list[int], logprobs: list[float], finish: Any
) -> GenerationResult:
    if len(token_ids) != len(logprobs):
        return GenerationResult.failed(
            request.request_id,
            f"the server returned {len(token_ids)} tokens and {len(logprobs)} log-probs",
        )
    reason = _FINISH.get(str(finish))
    if reason is None:
        return GenerationResult.failed(request.request_id, f"unknown finish_reason {finish!r}")
    return GenerationResult(
        request_id=request.request_id,
        token_ids=tuple(token_ids),
        logprobs=tuple(float(value) for value in logprobs),
        finish_reason=reason,
    )
