"""Test helpers of the cluster tests: a scriptable sandbox, background workers, stats polling."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from rstar2_sandbox.cluster import (
    ClusterQueue,
    ClusterSettings,
    ClusterWorker,
    RedisDispatcher,
    connect,
)
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.protocol import Sandbox


class EchoSandbox:
    """Answers each call with its code as stdout ('explode' raises); ``gate`` holds calls.

    It stands in for the executor so that the queue logic is tested on its own.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.running = 0
        self._started = asyncio.Condition()

    async def wait_running(self, count: int) -> None:
        async with self._started:
            await asyncio.wait_for(self._started.wait_for(lambda: self.running >= count), 5)

    async def run(self, request: RunRequest) -> RunResult:
        self.calls.append(request.code)
        self.running += 1
        async with self._started:
            self._started.notify_all()
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        if request.code == "explode":
            raise RuntimeError("executor crashed")
        return RunResult(status=RunStatus.SUCCESS, stdout=request.code)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        return [await self.run(request) for request in requests]

    async def aclose(self) -> None:
        return None


class BackgroundWorker:
    """A ``ClusterWorker`` serving in the background until ``close``."""

    def __init__(
        self,
        queue: ClusterQueue,
        sandbox: Sandbox,
        *,
        slots: int = 2,
        batch_size: int = 64,
        drain_timeout_s: float = 5.0,
        own_connection: bool = False,
    ) -> None:
        self.queue = queue
        self.sandbox = sandbox
        self.worker = ClusterWorker(
            queue,
            sandbox,
            slots=slots,
            batch_size=batch_size,
            drain_timeout_s=drain_timeout_s,
            poll_s=0.05,
        )
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.worker.run(self.stop))
        self._own_connection = own_connection

    @classmethod
    def connected(
        cls,
        redis_url: str,
        settings: ClusterSettings,
        sandbox: Sandbox,
        *,
        slots: int = 2,
        drain_timeout_s: float = 5.0,
    ) -> BackgroundWorker:
        """One with a Redis connection of its own, like a worker on another node."""
        queue = ClusterQueue(connect(redis_url), settings)
        return cls(
            queue, sandbox, slots=slots, drain_timeout_s=drain_timeout_s, own_connection=True
        )

    async def close(self) -> None:
        """Stop it (it finishes or hands back its calls) and wait until it has."""
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        if self._own_connection:
            self._own_connection = False
            await self.queue.redis.aclose()


async def wait_for_stats(dispatcher: RedisDispatcher, **expected: int) -> None:
    """Stats refresh from Redis periodically: poll until they show ``expected``."""
    for _ in range(100):
        if {key: getattr(dispatcher.stats(), key) for key in expected} == expected:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"stats never reached {expected}: {dispatcher.stats()}")
