"""Load through a real ``rstar2-sandbox serve``: nothing lost, memory bounded, clean exit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import aiohttp
import pytest

from rstar2_sandbox import RunRequest, RunStatus, SandboxClient

from .conftest import children_of, start_serve  # type: ignore[import-not-found]

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

CALLS = 10_000


def memory_kib(pid: int, field: str) -> int:
    """VmRSS / VmHWM (peak) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    found = [pid]
    for child in children_of(pid):
        found += tree(child)
    return found


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    url, server = start_serve("--log-level", "WARNING", timeout_s=120)
    yield url, server
    processes = tree(server.pid)
    server.send_signal(signal.SIGINT)
    assert server.wait(60) == 0
    time.sleep(0.5)
    survivors = [p for p in processes if os.path.exists(f"/proc/{p}")]
    assert survivors == [], f"processes outlived the server: {survivors}"


async def test_10k_concurrent_calls_nothing_lost_memory_bounded(
    served: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, server = served
    processes = tree(server.pid)
    rss_before = sum(memory_kib(p, "VmRSS") for p in processes)
    # Mostly stdlib code, every tenth with numpy: both fork-server tiers work under load.
    requests = [
        RunRequest(code=f"import numpy\nprint({i})" if i % 10 == 0 else f"print({i} * 2)")
        for i in range(CALLS)
    ]
    async with SandboxClient(url, batch_size=64, max_concurrency=32) as client:
        results = await client.run_many(requests)
    assert len(results) == CALLS
    failed = [(i, r.status, r.stderr[-200:]) for i, r in enumerate(results) if not r.ok]
    assert failed == []
    expected = [f"{i}\n" if i % 10 == 0 else f"{i * 2}\n" for i in range(CALLS)]
    assert [r.stdout for r in results] == expected
    # Bounded: the front end holds no per-call state after the calls, fork-servers stay lean.
    rss_after = sum(memory_kib(p, "VmRSS") for p in tree(server.pid))
    peak_front = memory_kib(server.pid, "VmHWM")
    assert peak_front < 600 * 1024, f"front end peaked at {peak_front} KiB"
    assert rss_after - rss_before < 150 * 1024, (rss_before, rss_after)


async def test_codejudge_batches_under_load(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = served
    batches = [
        {
            "type": "batch",
            "submissions": [
                {"type": "python", "solution": "print(int(input()) ** 2)",
                 "input": str(b * 100 + i), "sub_id": b * 100 + i}
                for i in range(100)
            ],
        }
        for b in range(10)
    ]  # fmt: skip
    async with aiohttp.ClientSession() as session:

        async def send(body: dict[str, object]) -> dict[str, object]:
            async with session.post(url + "/run/batch", json=body) as response:
                assert response.status == 200
                data: dict[str, object] = await response.json()
                return data

        replies = await asyncio.gather(*(send(b) for b in batches))
    results = [r for reply in replies for r in reply["results"]]  # type: ignore[attr-defined]
    assert len(results) == 1000
    assert all(r["success"] and r["reason"] == "" for r in results)
    assert [r["stdout"] for r in results] == [f"{n * n}\n" for n in range(1000)]


async def test_sandboxfusion_concurrent_calls(served: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, _ = served
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send(n: int) -> dict[str, object]:
            body = {"code": f"print({n} + 1)", "language": "python", "run_timeout": 30}
            async with session.post(url + "/run_code", json=body) as response:
                assert response.status == 200
                data: dict[str, object] = await response.json()
                return data

        replies = await asyncio.gather(*(send(n) for n in range(500)))
    assert all(r["status"] == "Success" for r in replies)
    outputs = [r["run_result"]["stdout"] for r in replies]  # type: ignore[index]
    assert outputs == [f"{n + 1}\n" for n in range(500)]


async def test_service_still_healthy_after_load(
    served: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, _ = served
    async with SandboxClient(url) as client:
        health = await client.health()
        result = await client.run(RunRequest(code="print('fine')"))
    assert health["status"] == "ok"
    assert result.status is RunStatus.SUCCESS
