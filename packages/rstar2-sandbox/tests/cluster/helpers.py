"""Test helpers of the cluster tests: a scriptable sandbox, background workers, stats polling,
and real front-end and worker processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

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


# Leases of the worker processes: short, so that a killed worker's calls return soon.
LEASE_S = 1.5


class Processes:
    """rstar2-sandbox processes of one test; whatever is still running is killed at the end."""

    def __init__(self, redis_url: str, prefix: str, logs: Path) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "rstar2_sandbox.cli", *args]
        command += ["--redis", self.redis_url, "--redis-prefix", self.prefix]
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(proc)
        return proc

    def front_end(self, port: int) -> subprocess.Popen[bytes]:
        return self.spawn("front", "serve", "--port", str(port), "--log-level", "WARNING")

    def worker(self, name: str, preload: str = "") -> subprocess.Popen[bytes]:
        return self.spawn(
            name,
            "worker",
            *("--servers", "1", "--slots", "4", "--batch-size", "8", "--preload", preload),
            *("--lease-s", str(LEASE_S), "--log-level", "WARNING"),
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


async def cluster_info(url: str) -> dict[str, int] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/info") as response:
            info = await response.json()
            return dict(info["dispatcher"])
    except aiohttp.ClientError:
        return None


async def wait_for_workers(url: str, count: int, timeout_s: float = 90) -> None:
    """Until the front end answers and counts ``count`` live workers (start-up is slow here)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        info = await cluster_info(url)
        if info is not None and info["workers"] == count:
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"front end at {url} never counted {count} workers; last seen {info}")


async def completions(redis: Redis, prefix: str) -> dict[str, dict[str, object]]:
    """The completion markers in Redis: request id -> {worker, deliveries}."""
    keys = [key async for key in redis.scan_iter(f"{prefix}:done:*", count=1000)]
    values = await redis.mget(keys) if keys else []
    return {key: json.loads(value) for key, value in zip(keys, values, strict=True) if value}
