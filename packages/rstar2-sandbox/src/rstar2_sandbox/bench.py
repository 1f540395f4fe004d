"""Benchmark driver: throughput and latency percentiles of any ``Sandbox`` on standard snippets.

Used by ``rstar2-sandbox bench`` (against a running service) and by ``bench/bench.py`` (which
also compares against a fresh interpreter per call).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import aiohttp
from pydantic import BaseModel, ConfigDict
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rstar2_sandbox.agent_template import rstar2_agent_wrap
from rstar2_sandbox.models import DEFAULT_TIMEOUT_S, RunRequest, RunStatus
from rstar2_sandbox.protocol import Sandbox

SNIPPETS: dict[str, str] = {
    "trivial": "print(1 + 1)",
    "stdlib": "import math\nprint(math.comb(40, 20))",
    "numpy": "import numpy as np\nprint(np.linalg.det(np.eye(3) * 2))",
    "sympy": "import sympy as sp\nx = sp.Symbol('x')\nprint(sp.factor(x**4 - 1))",
}


class BenchRow(BaseModel):
    """One measurement."""

    model_config = ConfigDict(extra="forbid")

    target: str
    snippet: str
    mode: str  # "sequential" (one call at a time) or "batch" (run_many)
    concurrency: int
    calls: int
    failed: int
    seconds: float
    calls_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


def memory_mib(pid: int, field: str) -> float:
    """A process's ``VmRSS`` (now) or ``VmHWM`` (its peak), in MiB (Linux)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(f"{field} is not in /proc/{pid}/status")


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index] * 1000


def _row(
    target: str,
    snippet: str,
    mode: str,
    concurrency: int,
    latencies: list[float],
    failed: int,
    seconds: float,
) -> BenchRow:
    ordered = sorted(latencies)
    return BenchRow(
        target=target,
        snippet=snippet,
        mode=mode,
        concurrency=concurrency,
        calls=len(latencies),
        failed=failed,
        seconds=seconds,
        calls_per_s=len(latencies) / seconds if seconds > 0 else 0.0,
        p50_ms=_percentile(ordered, 0.50),
        p90_ms=_percentile(ordered, 0.90),
        p99_ms=_percentile(ordered, 0.99),
    )


async def measure_sequential(
    sandbox: Sandbox, target: str, snippet: str, calls: int, concurrency: int = 1
) -> BenchRow:
    """``concurrency`` workers, each running one call at a time: per-call latency."""
    request = RunRequest(code=SNIPPETS[snippet])
    latencies: list[float] = []
    failed = 0
    remaining = calls

    async def worker() -> None:
        nonlocal remaining, failed
        while remaining > 0:
            remaining -= 1
            began = time.perf_counter()
            result = await sandbox.run(request)
            latencies.append(time.perf_counter() - began)
            failed += result.status is not RunStatus.SUCCESS

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _row(
        target, snippet, "sequential", concurrency, latencies, failed, time.perf_counter() - started
    )


async def measure_batch(
    sandbox: Sandbox,
    target: str,
    snippet: str,
    calls: int,
    chunk: int,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> BenchRow:
    """``run_many`` over ``calls`` requests (each with ``timeout_s``) in chunks of ``chunk``:
    throughput."""
    request = RunRequest(code=SNIPPETS[snippet], timeout_s=timeout_s)
    latencies: list[float] = []
    failed = 0
    started = time.perf_counter()
    for offset in range(0, calls, chunk):
        size = min(chunk, calls - offset)
        began = time.perf_counter()
        results = await sandbox.run_many([request] * size)
        latencies.extend([time.perf_counter() - began] * size)
        failed += sum(r.status is not RunStatus.SUCCESS for r in results)
    return _row(target, snippet, "batch", chunk, latencies, failed, time.perf_counter() - started)


async def measure_codejudge(
    url: str,
    snippet: str,
    calls: int,
    *,
    batch: int = 64,
    concurrency: int = 8,
    wrap: bool = False,
) -> BenchRow:
    """Code Judge API throughput: ``calls`` submissions of a snippet to ``/run/long-batch`` in
    batches of ``batch``, ``concurrency`` batches in flight; ``wrap``: as rStar2-Agent's client
    sends them (``rstar2_agent_wrap``)."""
    code = rstar2_agent_wrap(SNIPPETS[snippet]) if wrap else SNIPPETS[snippet]
    latencies: list[float] = []
    failed = 0
    limit = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=None)

    async def send(session: aiohttp.ClientSession, size: int) -> None:
        nonlocal failed
        body = {"type": "batch", "submissions": [{"type": "python", "solution": code}] * size}
        async with limit:
            began = time.perf_counter()
            async with session.post(f"{url}/run/long-batch", json=body) as response:
                response.raise_for_status()
                results = (await response.json())["results"]
            latencies.extend([time.perf_counter() - began] * size)
            failed += sum(not r["success"] for r in results)

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        sizes = [min(batch, calls - offset) for offset in range(0, calls, batch)]
        await asyncio.gather(*(send(session, size) for size in sizes))
    name = f"{snippet} (rStar2-Agent template)" if wrap else snippet
    return _row("codejudge", name, "batch", batch, latencies, failed, time.perf_counter() - started)


async def measure_mixed_batch(
    url: str, items: int = 4096, *, big_every: int = 16, big_bytes: int = 1 << 20
) -> BenchRow:
    """One Code Judge batch of ``items`` calls, every ``big_every``-th printing ``big_bytes``
    (the rest trivial), sent whole as rStar2-Agent's client sends a step's tool calls."""
    big = f"import sys\nsys.stdout.write('x' * {big_bytes})"
    submissions = [
        {"type": "python", "solution": big if i % big_every == 0 else f"print({i})"}
        for i in range(items)
    ]
    failed = 0
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(
            f"{url}/run/long-batch", json={"type": "batch", "submissions": submissions}
        ) as response,
    ):
        response.raise_for_status()
        results = (await response.json())["results"]
    seconds = time.perf_counter() - started
    for i, result in enumerate(results):
        expected = big_bytes if i % big_every == 0 else len(f"{i}\n")
        failed += not result["success"] or len(result["stdout"]) != expected
    failed += items - len(results)
    return _row("codejudge", "mixed", "one batch", items, [seconds] * items, failed, seconds)


async def run_suite(
    sandbox: Sandbox,
    target: str,
    snippets: Sequence[str],
    *,
    sequential_calls: int,
    batch_calls: int,
    batch_chunk: int,
    console: Console | None = None,
) -> list[BenchRow]:
    """For each snippet: latency at concurrency 1, then batch throughput; one progress bar."""
    unknown = [s for s in snippets if s not in SNIPPETS]
    if unknown:
        raise ValueError(f"unknown snippets {unknown}; choose from {sorted(SNIPPETS)}")
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"benchmarking {target}", total=2 * len(snippets))
        for snippet in snippets:
            await sandbox.run(RunRequest(code=SNIPPETS[snippet]))  # warm-up
            if sequential_calls:
                rows.append(await measure_sequential(sandbox, target, snippet, sequential_calls))
            progress.advance(task)
            if batch_calls:
                rows.append(await measure_batch(sandbox, target, snippet, batch_calls, batch_chunk))
            progress.advance(task)
    return rows


def table(rows: Sequence[BenchRow], title: str, *, target_column: bool = True) -> Table:
    """The rows as a rich table; without ``target_column`` the title names the one target.

    Rules under the header only, and one space between columns: without the target column the
    table fits 80 columns with every header and value whole.
    """
    out = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False)
    columns = ["target"] * target_column + ["snippet", "mode", "conc.", "calls", "failed",
               "calls/s", "p50 ms", "p90 ms", "p99 ms"]  # fmt: skip
    for column in columns:
        textual = column in ("target", "snippet", "mode")
        out.add_column(column, justify="left" if textual else "right")
    for r in rows:
        cells = [r.target] * target_column + [
            r.snippet, r.mode, str(r.concurrency), str(r.calls), str(r.failed),
            f"{r.calls_per_s:.0f}", f"{r.p50_ms:.1f}", f"{r.p90_ms:.1f}", f"{r.p99_ms:.1f}",
        ]  # fmt: skip
        out.add_row(*cells)
    return out
