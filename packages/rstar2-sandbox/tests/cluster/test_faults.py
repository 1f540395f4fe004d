"""Faults with real processes: a front end and two workers on a private Redis.

A worker killed with SIGKILL mid-load and a front end killed and restarted mid-load must cost no
call: every call completes exactly once and reaches its client.
"""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest
from redis.asyncio import Redis

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.models import RunRequest, RunStatus

from .conftest import free_port
from .helpers import Processes, completions, wait_for_workers

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster, pytest.mark.slow]


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
