"""``SandboxClient``: the ``Sandbox`` interface over HTTP, with batching, bounded concurrency and
retries; ``SyncSandboxClient`` wraps it for synchronous code."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from rstar2_sandbox.models import BatchRequest, BatchResponse, RunRequest, RunResult

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_STATUSES = frozenset({502, 503, 504})


class SandboxClientError(Exception):
    """The service refused a call for good (a 4xx): retrying the same call cannot help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"sandbox service answered {status}: {body[:500]}")
        self.status = status
        self.body = body


class SandboxUnavailableError(Exception):
    """The service stayed unreachable or overloaded through every retry."""


class SandboxClient:
    """Async client of an rstar2-sandbox service (``rstar2-sandbox serve``).

    ``run_many`` sends requests in batches of ``batch_size`` over at most ``max_concurrency``
    connections at once. A 502/503/504 or a connection error is retried up to ``retries`` times
    with exponential backoff (a 503's Retry-After is honoured); a call may therefore run twice when
    a connection drops after the server accepted it, which is harmless for side-effect-free code.
    """

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 64,
        max_concurrency: int = 16,
        retries: int = 8,
        backoff_s: float = 0.1,
        max_backoff_s: float = 10.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        if batch_size < 1 or max_concurrency < 1 or retries < 0:
            raise ValueError("batch_size and max_concurrency must be >= 1, retries >= 0")
        self.url = url.rstrip("/")
        self.batch_size = batch_size
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self._limit = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_concurrency)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self._session

    async def _post(self, path: str, body: BaseModel) -> str:
        """POST with retries; the response text of the first 2xx."""
        payload = body.model_dump_json().encode()
        headers = {"Content-Type": "application/json"}
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            wait: float | None
            try:
                async with (
                    self._limit,
                    self._get_session().post(
                        self.url + path, data=payload, headers=headers
                    ) as response,
                ):
                    text = await response.text()
                    if response.status < 300:
                        return text
                    if response.status not in RETRY_STATUSES:
                        raise SandboxClientError(response.status, text)
                    retry_after = response.headers.get("Retry-After")
                    wait = float(retry_after) if retry_after else None
                    problem = f"HTTP {response.status}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                wait, problem = None, f"{type(exc).__name__}: {exc}"
            if attempt == self.retries:
                raise SandboxUnavailableError(
                    f"{self.url}{path} failed {self.retries + 1} times; last: {problem}"
                )
            pause = min(self.max_backoff_s, wait if wait is not None else delay)
            # Jitter keeps many clients from retrying in lockstep.
            pause *= 0.5 + random.random()
            log.debug("retrying %s in %.2fs after %s", path, pause, problem)
            await asyncio.sleep(pause)
            delay = min(self.max_backoff_s, delay * 2)
        raise AssertionError("unreachable")

    async def run(self, request: RunRequest) -> RunResult:
        """Run one request."""
        text = await self._post("/v1/run", request)
        return RunResult.model_validate_json(text)

    async def _run_batch(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        text = await self._post("/v1/run/batch", BatchRequest(requests=list(requests)))
        try:
            results = BatchResponse.model_validate_json(text).results
        except ValidationError as exc:
            raise SandboxClientError(200, f"malformed batch response: {exc}") from exc
        if len(results) != len(requests):
            raise SandboxClientError(200, f"{len(results)} results for {len(requests)} requests")
        return results

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Run requests in concurrent batches; results in request order."""
        chunks = [
            requests[i : i + self.batch_size] for i in range(0, len(requests), self.batch_size)
        ]
        batches = await asyncio.gather(*(self._run_batch(chunk) for chunk in chunks))
        return [result for batch in batches for result in batch]

    async def health(self) -> dict[str, Any]:
        """``GET /healthz`` as a dict (raises on a non-200)."""
        async with self._get_session().get(self.url + "/healthz") as response:
            body: dict[str, Any] = await response.json()
            if response.status != 200:
                raise SandboxUnavailableError(f"{self.url}/healthz answered {response.status}")
            return body

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncSandboxClient:
    """Blocking wrapper of ``SandboxClient`` (its event loop runs on a private thread)."""

    def __init__(self, url: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rstar2-sandbox-client", daemon=True
        )
        self._thread.start()
        self._client = self._call(self._make(url, options))

    @staticmethod
    async def _make(url: str, options: dict[str, Any]) -> SandboxClient:
        # Created on the loop's thread: its semaphore and session belong to that loop.
        return SandboxClient(url, **options)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def run(self, request: RunRequest) -> RunResult:
        """Run one request."""
        return self._call(self._client.run(request))

    def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Run requests in concurrent batches; results in request order."""
        return self._call(self._client.run_many(requests))

    def close(self) -> None:
        """Close connections and stop the private loop."""
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
