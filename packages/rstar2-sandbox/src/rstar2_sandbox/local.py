"""``LocalSandbox``: the ``Sandbox`` interface in-process, on an ``ExecutorPool`` (no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from rstar2_sandbox.executor.pool import ExecutorPool
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.isolation import IsolationReport
from rstar2_sandbox.models import RunRequest, RunResult


class LocalSandbox:
    """Runs code on this machine's fork-servers; starts them on first use.

    >>> async with LocalSandbox() as sandbox:
    ...     result = await sandbox.run(RunRequest(code="print(6 * 7)"))
    """

    def __init__(self, settings: ExecutorSettings | None = None) -> None:
        self.pool = ExecutorPool(settings)
        self._started = False
        self._closed = False
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the fork-servers (idempotent; ``run`` calls it when needed)."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("LocalSandbox is closed")
            if not self._started:
                await self.pool.start()
                self._started = True

    @property
    def isolation(self) -> IsolationReport:
        """Which isolation features are active."""
        return self.pool.isolation

    async def run(self, request: RunRequest) -> RunResult:
        """Run one request."""
        if not self._started:
            await self.start()
        return await self.pool.run(request)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Run requests concurrently (bounded by the pool's slots); results in request order."""
        if not self._started:
            await self.start()
        return list(await asyncio.gather(*(self.pool.run(r) for r in requests)))

    async def aclose(self) -> None:
        """Stop the fork-servers; runs in flight are killed."""
        async with self._lock:
            self._closed = True
            if self._started:
                await self.pool.close()
                self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
