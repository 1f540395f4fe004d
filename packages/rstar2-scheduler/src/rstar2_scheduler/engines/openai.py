"""Any OpenAI-compatible server (vLLM, SGLang, ``transformers serve``, ...) behind ``Engine``.

Requests go to the legacy ``/completions`` endpoint. Before the first request the engine probes
the server once (``start``): it tries the request shapes of ``openai_dialect.candidates``, most
exact first (token-id prompts with vLLM/SGLang extension fields, whose completions come back as
token ids: nothing is re-tokenized), keeps the first the server accepts and logs what it found
(``capabilities``). A server that takes only text gets the decoded prompt, and its completion text
is re-encoded with the local tokenizer; the server's ``usage.completion_tokens`` stays the count
that response budgets spend.

A server that reports the version of its weights (SGLang's ``weight_version``, set by its
weight-update endpoints) has it copied into ``GenerationResult.weights_version``.

Sampling log-probs are required by default (RL trains on them): a server that returns none fails
the request. Evaluation needs none: with ``require_logprobs=False`` such completions are accepted
and their log-probs are NaN placeholders (loss mask 0). A token without a log-prob (a stop token
the server dropped and the client restored) gets loss mask 0: it is not trained on.

vLLM reports raw-model log-probs unless started with ``--logprobs-mode processed_logprobs``; start
it so for temperature-scaled log-probs matching what the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar
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
    SamplingParams,
)
from rstar2_scheduler.engines.openai_dialect import (
    TOKEN_ID_PREFIX,
    Dialect,
    PromptFormat,
    ServerCapabilities,
    candidates,
)
from rstar2_scheduler.engines.server_metrics import parse_kv_metrics

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_REJECTED = (400, 422)  # the server refuses the request's shape
_FATAL = (401, 403, 404, 405)  # no retry mends these


class OpenAIEngineConfig(BaseModel):
    """Where the server is and how to talk to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="API root, e.g. http://localhost:8000/v1.")
    model: str = Field(min_length=1, description="Model name the server serves.")
    name: str = Field(default="openai", min_length=1)
    api_key: str | None = None
    prompt_format: PromptFormat = Field(
        default="auto",
        description="auto: token-id prompts where the server takes them, else text; token_ids "
        "or text to allow only one.",
    )
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
    text_markers: tuple[str, ...] = Field(
        default=(),
        description="Strings the caller parses out of completion text (e.g. tool-call tags). A "
        "text server that drops special tokens drops those the tokenizer holds as special "
        "tokens: the engine then refuses to start, and fails a completion whose token count "
        "shows tokens its text does not.",
    )


class EndpointError(RuntimeError):
    """The server cannot serve these requests: it accepts none of the request shapes, or its
    text would lose markers the caller parses. Retrying does not help; the message says what
    does."""


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
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None
        self._stats: KVStats | None = None
        self._in_flight = 0
        self._dialect: Dialect | None = None
        self._capabilities: ServerCapabilities | None = None
        self._probe_lock = asyncio.Lock()
        self._probe_error: str | None = None
        self._fatal: EndpointError | None = None
        self._warned: set[str] = set()
        self._url = config.base_url.rstrip("/") + "/completions"
        root = urlsplit(config.base_url)
        default_metrics = f"{root.scheme}://{root.netloc}/metrics"
        self._metrics_url = (
            default_metrics if config.metrics_url is None else config.metrics_url or None
        )
        self._special_markers = self._markers_a_text_server_drops()

    @property
    def server_capabilities(self) -> ServerCapabilities | None:
        """What the server was found to accept and return; None until a probe succeeded."""
        return self._capabilities

    async def start(self) -> None:
        """Open the connection pool and probe the server (once). Raises ``EndpointError`` when
        the server accepts no request shape or would drop ``text_markers``; a server that cannot
        be reached is probed again by the next ``generate``."""
        if self._session is None:
            headers = (
                {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            )
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
            )
            if self._metrics_url is not None and await self._read_metrics(self._metrics_url):
                # The first reading is awaited, so kv_stats is meaningful as soon as start returns.
                self._poller = asyncio.create_task(self._poll_metrics(self._metrics_url))
        if self._fatal is not None:
            raise self._fatal
        if self._dialect is None:
            async with self._probe_lock:  # concurrent first requests wait for one probe
                if self._dialect is None and self._fatal is None:
                    await self._probe()
            if self._fatal is not None:
                raise self._fatal

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
        self._in_flight += 1
        try:
            await self.start()
            if self._dialect is None:
                return GenerationResult.failed(
                    request.request_id, f"the server could not be probed: {self._probe_error}"
                )
            body = self._dialect.body(
                self.config.model, request.prompt_ids, request.sampling, self._decoder()
            )
            status, data = await self._post(body)
            if status != 200:
                return GenerationResult.failed(request.request_id, f"HTTP {status}: {data}")
            return self._result(request, data)
        except EndpointError as failure:
            return GenerationResult.failed(request.request_id, str(failure))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as failure:
            return GenerationResult.failed(
                request.request_id, f"{type(failure).__name__}: {failure}"
            )
        finally:
            self._in_flight -= 1

    async def _post(self, body: dict[str, Any]) -> tuple[int, Any]:
        """Status and parsed JSON (or, on an error status, the start of the body's text)."""
        assert self._session is not None  # set by start()
        async with self._session.post(self._url, json=body) as response:
            if response.status != 200:
                return response.status, (await response.text())[:300]
            return 200, await response.json(content_type=None)

    async def _probe(self) -> None:
        """Find the first request shape the server accepts, with a one-token greedy request."""
        decode = self._decoder()
        prompt = self._probe_prompt()
        sampling = SamplingParams(max_new_tokens=1, temperature=0.0)
        notes: list[str] = []
        for dialect in candidates(self.config.prompt_format, has_tokenizer=decode is not None):
            try:
                status, data = await self._post(
                    dialect.body(self.config.model, prompt, sampling, decode)
                )
            except (aiohttp.ClientError, TimeoutError, ValueError) as failure:
                self._probe_error = f"{type(failure).__name__}: {failure}"
                logger.warning("%s: probing %s failed: %s", self.name, self._url, self._probe_error)
                return
            if status in _FATAL:
                self._fatal = EndpointError(f"{self._url} answered HTTP {status}: {data}")
                return
            if status in _REJECTED:
                notes.append(f"{dialect.describe()}: rejected (HTTP {status}: {_squash(data)})")
                continue
            if status != 200:  # a server error: try again with the next request
                self._probe_error = f"HTTP {status}: {data}"
                logger.warning("%s: probing %s failed: %s", self.name, self._url, self._probe_error)
                return
            try:
                choice = _choice(data)
            except ValueError as failure:
                notes.append(f"{dialect.describe()}: answered without a completion ({failure})")
                continue
            if dialect.token_ids and dialect.extensions and _completion_ids(choice) is None:
                if decode is not None:  # the fields were ignored: use what else the server takes
                    notes.append(f"{dialect.describe()}: accepted but no token ids came back")
                    continue
                self._fatal = EndpointError(
                    f"{self._url} returns no completion token ids (return_token_ids); "
                    "give the engine the served model's tokenizer to use text completions"
                )
                return
            notes.append(f"{dialect.describe()}: accepted")
            self._accept(dialect, choice, data, notes)
            return
        self._fatal = EndpointError(
            f"{self._url} accepts none of the request shapes rstar2 sends: " + "; ".join(notes)
        )

    def _accept(
        self, dialect: Dialect, choice: dict[str, Any], data: dict[str, Any], notes: list[str]
    ) -> None:
        ids_back = _completion_ids(choice) is not None
        logprobs = _token_logprobs(choice) is not None
        kept = ids_back or dialect.extensions
        capabilities = ServerCapabilities(
            url=self.config.base_url,
            prompt="token_ids" if dialect.token_ids else "text",
            extension_fields=dialect.extensions,
            sampling_switch="generation_config" if dialect.generation_config else "temperature",
            completion_ids="server" if ids_back else "reencoded",
            token_counts="server" if ids_back or _usage_tokens(data) is not None else "reencoded",
            logprobs=logprobs,
            special_tokens_kept=kept,
            stop_token_logprob="server" if logprobs and ids_back else "masked",
            notes=notes,
        )
        if not kept and self._special_markers:
            self._fatal = EndpointError(self._vanishing_message(capabilities))
            return
        self._dialect, self._capabilities, self._probe_error = dialect, capabilities, None
        for note in notes[:-1]:
            logger.info("%s: %s", self.name, note)
        logger.info("%s (%s): %s", self.name, self.config.base_url, capabilities.summary())

    def _result(self, request: GenerationRequest, data: dict[str, Any]) -> GenerationResult:
        choice = _choice(data)
        reported = _token_logprobs(choice)
        if reported is None and self.config.require_logprobs:
            return GenerationResult.failed(
                request.request_id, "the server returned no log-probs (request logprobs=0)"
            )
        server_ids = _completion_ids(choice)
        reencoded = server_ids is None
        if server_ids is not None:
            token_ids = server_ids
        else:
            if self.tokenizer is None:
                return GenerationResult.failed(
                    request.request_id, "the server returned text only and no tokenizer was given"
                )
            token_ids = list(self.tokenizer.encode(str(choice["text"]), add_special_tokens=False))
        reason = _FINISH.get(str(choice.get("finish_reason")))
        if reason is None:
            return GenerationResult.failed(
                request.request_id, f"unknown finish_reason {choice.get('finish_reason')!r}"
            )
        logprobs: list[float | None] = list(reported) if reported is not None else []
        stops = request.sampling.stop_token_ids
        if reason == "stop" and stops and (not token_ids or token_ids[-1] not in stops):
            # The server dropped the stop string; the turn still ended with a stop token (the
            # one SGLang names in matched_stop, else the first).
            matched = choice.get("matched_stop")
            token_ids.append(matched if isinstance(matched, int) and matched in stops else stops[0])
            if reported is not None and len(logprobs) == len(token_ids) - 1:
                logprobs.append(None)  # no log-prob: not trained on
        if reported is None:
            logprobs = [math.nan] * len(token_ids)
        if len(logprobs) != len(token_ids):
            source = "re-encodes to" if reencoded else "has"
            return GenerationResult.failed(
                request.request_id,
                f"the completion {source} {len(token_ids)} tokens but the server returned "
                f"{len(logprobs)} log-probs",
            )
        counted = _usage_tokens(data) if reencoded else None
        if counted is not None and counted != len(token_ids):
            hidden = self._uncounted(counted, len(token_ids))
            if hidden is not None:
                return GenerationResult.failed(request.request_id, hidden)
        mask = tuple(0 if value is None or reported is None else 1 for value in logprobs)
        return GenerationResult(
            request_id=request.request_id,
            token_ids=tuple(token_ids),
            logprobs=tuple(0.0 if value is None else float(value) for value in logprobs),
            finish_reason=reason,
            loss_mask=mask if 0 in mask else None,
            counted_tokens=counted,
            reencoded=reencoded,
            weights_version=_weights_version(data, choice),
        )

    def _uncounted(self, counted: int, shown: int) -> str | None:
        """Explain a server count that differs from the re-encoded text's: an error when the text
        may have lost markers the caller parses, else a warning (once); budgets follow the
        server's count either way."""
        if counted > shown and self._special_markers:
            assert self._capabilities is not None
            return (
                f"the server counted {counted} completion tokens but its text shows {shown}: "
                + self._vanishing_message(self._capabilities)
            )
        kind = "hidden" if counted > shown else "longer"
        if kind not in self._warned:
            self._warned.add(kind)
            why = (
                "tokens the text does not show (special tokens dropped), or text that re-encodes "
                "into fewer tokens"
                if counted > shown
                else "text that re-encodes into more tokens (bytes of a split character decoded "
                "to U+FFFD, or another tokenization)"
            )
            logger.warning(
                "%s: the server counted %d completion tokens, its text re-encodes to %d: %s; "
                "response budgets follow the server's count (reported once)",
                self.name,
                counted,
                shown,
                why,
            )
        return None

    def _vanishing_message(self, capabilities: ServerCapabilities) -> str:
        markers = ", ".join(repr(marker) for marker in self._special_markers)
        refused = (
            ""
            if capabilities.extension_fields
            else " (it refuses skip_special_tokens=false, so it cannot be asked to keep them)"
        )
        return (
            f"{markers} are special tokens of this tokenizer and {capabilities.url} drops special "
            f"tokens from its completion text{refused}, so these markers vanish from the text and "
            "a tool call or answer is silently lost. Serve the model with a server that keeps "
            "them (vLLM or SGLang: rstar2 sends skip_special_tokens=false, or returns token ids), "
            "or use a tokenizer that holds these markers as ordinary added tokens (special=False)"
        )

    def _markers_a_text_server_drops(self) -> tuple[str, ...]:
        """``text_markers`` that decoding with special tokens skipped would remove."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return ()
        dropped = []
        for marker in self.config.text_markers:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if tokenizer.decode(ids, skip_special_tokens=True) != marker:
                dropped.append(marker)
        return tuple(dropped)

    def _probe_prompt(self) -> list[int]:
        if self.tokenizer is None:
            return [0]
        ids: list[int] = self.tokenizer.encode("1 + 1 =", add_special_tokens=False)
        return ids or [0]

    def _decoder(self) -> Callable[[Sequence[int]], str] | None:
        tokenizer = self.tokenizer
        if tokenizer is None:
            return None

        def decode(ids: Sequence[int]) -> str:
            return str(
                tokenizer.decode(
                    list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            )

        return decode

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


def _choice(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not data.get("choices"):
        raise ValueError(f"not a completion: {str(data)[:200]}")
    choice: dict[str, Any] = data["choices"][0]
    return choice


def _completion_ids(choice: dict[str, Any]) -> list[int] | None:
    """The completion's token ids: vLLM's/SGLang's ``token_ids``, or vLLM's ``token_id:N``
    log-prob tokens; None when the server returned text only."""
    token_ids = choice.get("token_ids")
    if isinstance(token_ids, list):
        return [int(token) for token in token_ids]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if tokens and all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [int(t.removeprefix(TOKEN_ID_PREFIX)) for t in tokens]
    return None


def _token_logprobs(choice: dict[str, Any]) -> list[float | None] | None:
    values = (choice.get("logprobs") or {}).get("token_logprobs")
    return list(values) if isinstance(values, list) else None


def _weights_version(data: dict[str, Any], choice: dict[str, Any]) -> str | None:
    """The version label of the weights that served the completion, where the server reports
    one (SGLang: ``weight_version`` in the response's ``metadata`` or the choice's
    ``meta_info``, set by its weight-update endpoints); None otherwise."""
    for holder in (data.get("metadata"), choice.get("meta_info")):
        if isinstance(holder, dict) and holder.get("weight_version") is not None:
            return str(holder["weight_version"])
    return None


def _usage_tokens(data: dict[str, Any]) -> int | None:
    count = (data.get("usage") or {}).get("completion_tokens")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _squash(text: Any) -> str:
    """A server's error body in one short line: the message of a JSON error, else the text."""
    try:
        body = json.loads(text)
    except (TypeError, ValueError):
        body = text
    if isinstance(body, dict):
        for key in ("detail", "message", "error"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message", value)
            if value:
                body = value
                break
    return " ".join(str(body).split())[:200]
