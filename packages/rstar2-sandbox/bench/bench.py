"""rstar2-sandbox benchmark: fork-servers against a fresh interpreter per call, in one run.

1. Executor level, same limits and slots: ``LocalSandbox`` vs ``FreshInterpreterSandbox`` on the
   trivial, numpy and sympy snippets through ``run_many``; prints the throughput ratio.
2. End to end: starts ``rstar2-sandbox serve`` on a free port and drives it over HTTP with
   ``SandboxClient``: latency at concurrency 1 (``/v1/run``) and throughput over ``/v1/run/batch``.

Run with ``uv run nox -s bench`` or ``uv run python packages/rstar2-sandbox/bench/bench.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Annotated

import typer
from rich.console import Console

from rstar2_sandbox import ExecutorSettings, LocalSandbox, SandboxClient
from rstar2_sandbox.baseline import FreshInterpreterSandbox
from rstar2_sandbox.bench import BenchRow, measure_batch, measure_sequential, run_suite, table
from rstar2_sandbox.models import RunRequest

console = Console(width=max(120, Console().width))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def compare(
    snippets: list[str], calls: int, baseline_calls: int, slots: int
) -> list[BenchRow]:
    settings = ExecutorSettings(slots=slots)
    rows: list[BenchRow] = []
    baseline = FreshInterpreterSandbox(settings)
    async with LocalSandbox(settings) as fork:
        for snippet in snippets:
            rows.append(await measure_batch(fork, "fork-server", snippet, calls, calls))
            rows.append(
                await measure_batch(
                    baseline, "fresh-interpreter", snippet, baseline_calls, baseline_calls
                )
            )
    await baseline.aclose()
    return rows


async def wait_healthy(url: str, deadline_s: float) -> None:
    client = SandboxClient(url, retries=0)
    deadline = time.monotonic() + deadline_s
    try:
        while True:
            try:
                await client.health()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await client.aclose()


async def end_to_end(url: str, snippets: list[str], calls: int, batch: int) -> list[BenchRow]:
    await wait_healthy(url, 120)
    async with SandboxClient(url, batch_size=batch, max_concurrency=8) as client:
        rows = await run_suite(
            client,
            "http",
            snippets,
            sequential_calls=max(50, calls // 10),
            batch_calls=calls,
            batch_chunk=batch * 8,
            console=console,
        )
        # Concurrency 1, trivial: the latency target.
        await client.run(RunRequest(code="1"))
        rows.append(await measure_sequential(client, "http", "trivial", max(100, calls // 5)))
    return rows


def main(
    calls: Annotated[int, typer.Option(help="Calls per measurement.")] = 1000,
    baseline_calls: Annotated[
        int, typer.Option(help="Calls per snippet for the (slow) fresh-interpreter baseline.")
    ] = 100,
    snippets: Annotated[str, typer.Option(help="Comma-separated snippets.")] = (
        "trivial,numpy,sympy"
    ),
    slots: Annotated[
        int | None, typer.Option(help="Concurrent runs per tier (default: 4 per core).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Calls per HTTP batch request.")] = 64,
    json_out: Annotated[str | None, typer.Option("--json", help="Write all rows here.")] = None,
) -> None:
    """Run both comparisons and print tables, ratios and the load they ran under."""
    names = [s.strip() for s in snippets.split(",") if s.strip()]
    cores = len(os.sched_getaffinity(0))
    slot_count = slots or 4 * cores
    load_before = os.getloadavg()[0]
    executor_rows = asyncio.run(compare(names, calls, baseline_calls, slot_count))
    console.print(table(executor_rows, f"executors, {slot_count} slots, {cores} cores"))
    if not FreshInterpreterSandbox(ExecutorSettings()).drop_uid:
        console.print("note: the fresh-interpreter baseline ran without a per-call uid")
    for snippet in names:
        fork = next(r for r in executor_rows if r.snippet == snippet and r.target == "fork-server")
        fresh = next(r for r in executor_rows if r.snippet == snippet and r.target != fork.target)
        ratio = fork.calls_per_s / fresh.calls_per_s if fresh.calls_per_s else float("inf")
        console.print(f"ratio {snippet}: fork-server / fresh-interpreter = {ratio:.1f}x")

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "rstar2_sandbox.cli", "serve", "--port", str(port),
         "--log-level", "WARNING"],
    )  # fmt: skip
    try:
        http_rows = asyncio.run(end_to_end(f"http://127.0.0.1:{port}", names, calls, batch_size))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    console.print(table(http_rows, "end to end over HTTP (rstar2-sandbox serve)"))
    load_after = os.getloadavg()[0]
    console.print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    if json_out:
        rows = [r.model_dump() for r in executor_rows + http_rows]
        payload = {"cores": cores, "load": [load_before, load_after], "rows": rows}
        tmp = json_out + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(payload, handle, indent=2)
        os.replace(tmp, json_out)


if __name__ == "__main__":
    typer.run(main)
