"""Faults with real processes: a front end and two workers on a private Redis.

A worker killed with SIGKILL mid-load and a front end killed and restarted mid-load must cost no
call: every call completes exactly once and reaches its client.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.models import RunRequest, RunStatus

from .conftest import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster, pytest.mark.slow]

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

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return self.spawn(
            name,
            "worker",
            *("--servers", "1", "--slots", "4", "--batch-size", "8", "--preload", ""),
            *("--lease-s", str(LEASE_S), "--log-level", "WARNING"),
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def processes(redis_url: str, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(redis_url, f"faults:{uuid.uuid4().hex[:8]}", tmp_path)
    yield procs
    procs.kill_all()


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


async def wait_until_written(redis: Redis, prefix: str, count: int) -> None:
    for _ in range(600):
        if len(await completions(redis, prefix)) >= count:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"fewer than {count} results written in 30 s")


def tagged_calls(count: int, sleep_s: float) -> tuple[list[str], list[RunRequest]]:
    """Calls that each print their own token, so a result can be matched to its call."""
    tokens = [uuid.uuid4().hex for _ in range(count)]
    code = "import time\ntime.sleep({sleep})\nprint({token!r})"
    requests = [RunRequest(code=code.format(sleep=sleep_s, token=t)) for t in tokens]
    return tokens, requests


async def stream_drained(redis: Redis, prefix: str) -> bool:
    for _ in range(200):
        pending = await redis.xpending(f"{prefix}:tasks", "workers")
        if await redis.xlen(f"{prefix}:tasks") == 0 and pending["pending"] == 0:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_worker_killed_mid_load_loses_and_doubles_nothing(
    processes: Processes, redis: Redis
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes.front_end(port)
    doomed = processes.worker("doomed")
    survivor = processes.worker("survivor")
    await wait_for_workers(url, 2)

    tokens, requests = tagged_calls(240, sleep_s=0.1)
    async with SandboxClient(url, batch_size=8, max_concurrency=16) as client:
        load = asyncio.create_task(client.run_many(requests))
        await wait_until_written(redis, processes.prefix, 40)
        doomed.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(load, 120)

    # Every call came back once, with its own output.
    assert len(results) == len(tokens)
    for token, result in zip(tokens, results, strict=True):
        assert result.status is RunStatus.SUCCESS, result
        assert result.stdout == f"{token}\n"
    # One completion per call, and the killed worker's calls were rerun by the survivor.
    done = await completions(redis, processes.prefix)
    assert len(done) == len(tokens)
    assert any(d["deliveries"] == 2 for d in done.values()), "no call was reclaimed"
    assert await stream_drained(redis, processes.prefix)
    await wait_for_workers(url, 1)

    # SIGTERM stops the survivor cleanly; the front end sees no worker left.
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, processes.log("survivor")
    await wait_for_workers(url, 0)


async def test_front_end_restarted_mid_load_loses_nothing(
    processes: Processes, redis: Redis
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = processes.front_end(port)
    processes.worker("w1")
    processes.worker("w2")
    await wait_for_workers(url, 2)

    tokens, requests = tagged_calls(240, sleep_s=0.05)
    async with SandboxClient(url, batch_size=8, max_concurrency=16, retries=12) as client:
        load = asyncio.create_task(client.run_many(requests))
        await wait_until_written(redis, processes.prefix, 40)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        processes.front_end(port)
        results = await asyncio.wait_for(load, 120)

    assert len(results) == len(tokens)
    for token, result in zip(tokens, results, strict=True):
        assert result.status is RunStatus.SUCCESS, result
        assert result.stdout == f"{token}\n"
    # Calls of the killed front end were finished or dropped, none left in the queue.
    assert await stream_drained(redis, processes.prefix)
    await wait_for_workers(url, 2)  # the new front end sees the same cluster
