"""rstar2-sandbox benchmark: fork-servers against a fresh interpreter per call, in one run.

1. Executor level, same limits and slots: ``LocalSandbox`` vs ``FreshInterpreterSandbox`` on the
   trivial, numpy and sympy snippets through ``run_many``; prints the throughput ratio.
2. End to end: starts ``rstar2-sandbox serve`` on a free port and drives it over HTTP with
   ``SandboxClient``: latency at concurrency 1 (``/v1/run``) and throughput over ``/v1/run/batch``.
3. Code Judge API on the same service: stdlib code sent plain and wrapped as rStar2-Agent's client
   wraps it, in alternating rounds; prints the templated / plain ratio.
4. On a fresh service: one 4,096-item Code Judge batch, every 16th item printing 1 MiB; prints the
   front end's peak RSS.
5. ``bodies``: on a fresh service, the latency of one-at-a-time calls while four clients each send
   a 250 MB body (declared, then chunked, then slowed as over a shared 1 Gb/s link), against the
   same calls on the idle service; prints the front end's peak RSS growth. The control: the same
   calls while four local processes only spin (no bodies), what four busy processes cost other
   callers on this many cores by themselves. ``window``: a native batch of 8 runs printing 24 MiB
   each, and a 300-item batch of 1 MiB results whose client stops reading: the front end's peak
   RSS growth and how many calls ran while the client did not read.
6. ``step``: a paper-scale RL step (``--step-calls``, default 45,000) through the cluster mode on
   this machine (Redis, ``--step-workers`` workers, one front end): rStar2-Agent's template,
   mixed trivial / numpy / sympy / failing code (``rstar2_sandbox.step``); every call must be
   answered exactly once. Then the same on a fresh cluster with one worker killed halfway.
   Prints throughput, latency, the accounting, and the peak memory of front end, workers and
   Redis. Needs ``redis-server``.

Run with ``uv run nox -s bench`` or ``uv run python packages/rstar2-sandbox/bench/bench.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Annotated

import typer
from front_end import BODY_MODES, measure_big_results, measure_bodies, measure_stalled_client
from processes import memory_mib, served, wait_healthy
from rich.console import Console
from step_bench import cluster_step

from rstar2_sandbox import ExecutorSettings, LocalSandbox, SandboxClient
from rstar2_sandbox.baseline import FreshInterpreterSandbox
from rstar2_sandbox.bench import (
    BenchRow,
    measure_batch,
    measure_codejudge,
    measure_mixed_batch,
    measure_sequential,
    run_suite,
    table,
)
from rstar2_sandbox.models import RunRequest

console = Console(width=max(120, Console().width))
BASELINE_TIMEOUT_S = 120.0
SECTIONS = ("executor", "http", "codejudge", "mixed", "bodies", "window", "step")


async def compare(
    snippets: list[str], calls: int, baseline_calls: int, slots: int
) -> tuple[list[BenchRow], bool]:
    """Executor rows, and whether the baseline ran with a per-call uid."""
    settings = ExecutorSettings(slots=slots)
    rows: list[BenchRow] = []
    baseline = FreshInterpreterSandbox(settings)
    async with LocalSandbox(settings) as fork:
        for snippet in snippets:
            rows.append(await measure_batch(fork, "fork-server", snippet, calls, calls))
            # A fresh interpreter importing sympy takes seconds under load: a long timeout, so
            # that the baseline's figure is its speed, not its timeouts (failures are counted).
            rows.append(
                await measure_batch(
                    baseline,
                    "fresh-interpreter",
                    snippet,
                    baseline_calls,
                    baseline_calls,
                    timeout_s=BASELINE_TIMEOUT_S,
                )
            )
    await baseline.aclose()
    return rows, baseline.drop_uid


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


async def codejudge_template(url: str, calls: int, rounds: int) -> list[BenchRow]:
    """Plain and rStar2-Agent-templated stdlib code over the Code Judge API, rounds alternating
    so that drift in the machine's speed hits both alike; one row each, over all rounds."""
    await wait_healthy(url, 120)
    per_round = max(64, calls // rounds)
    rows: dict[bool, list[BenchRow]] = {False: [], True: []}
    await measure_codejudge(url, "stdlib", 64, wrap=True)  # warm-up
    for _ in range(rounds):
        for wrap in (False, True):
            rows[wrap].append(await measure_codejudge(url, "stdlib", per_round, wrap=wrap))
    merged = []
    for measured in rows.values():
        seconds = sum(r.seconds for r in measured)
        done = sum(r.calls for r in measured)
        merged.append(
            measured[0].model_copy(
                update={
                    "calls": done,
                    "failed": sum(r.failed for r in measured),
                    "seconds": seconds,
                    "calls_per_s": done / seconds,
                }
            )
        )
    return merged


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
    sections: Annotated[
        str,
        typer.Option(
            help="Comma-separated parts to run: executor (fork-servers vs fresh interpreter), "
            "http (native API), codejudge (plain vs rStar2-Agent-templated stdlib code), mixed "
            "(one 4,096-item Code Judge batch with 1 MiB outputs: the front end's peak RSS), "
            "bodies (four clients sending 250 MB bodies: other callers' latency, the front "
            "end's memory; four spinning processes as the control), window (big batch results, "
            "a client that stops reading), step (a paper-scale RL step through a local cluster, "
            "then with a worker killed halfway; needs redis-server)."
        ),
    ] = ",".join(SECTIONS),
    codejudge_rounds: Annotated[
        int, typer.Option(min=1, help="Alternating plain/templated rounds (codejudge).")
    ] = 4,
    mixed_items: Annotated[int, typer.Option(min=1, help="Items of the mixed batch.")] = 4096,
    server_pythonpath: Annotated[
        str | None,
        typer.Option(
            help="Run the served parts (http, codejudge, mixed) on the rstar2_sandbox found in "
            "this source directory, e.g. another checkout's packages/rstar2-sandbox/src, to "
            "compare versions on one machine."
        ),
    ] = None,
    step_calls: Annotated[
        int, typer.Option(min=1, help="Tool calls of the RL step (step); the paper's: 45,000.")
    ] = 45_000,
    step_workers: Annotated[
        int, typer.Option(min=2, help="Workers of the local cluster (step), one fork-server each.")
    ] = 2,
    body_calls: Annotated[
        int, typer.Option(min=10, help="One-at-a-time calls timed idle and under the bodies.")
    ] = 300,
    json_out: Annotated[str | None, typer.Option("--json", help="Write all rows here.")] = None,
) -> None:
    """Run the chosen comparisons and print tables, ratios and the load they ran under."""
    names = [s.strip() for s in snippets.split(",") if s.strip()]
    chosen = {s.strip() for s in sections.split(",") if s.strip()}
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise typer.BadParameter(f"unknown sections {sorted(unknown)}", param_hint="--sections")
    cores = len(os.sched_getaffinity(0))
    slot_count = slots or 4 * cores
    load_before = os.getloadavg()[0]
    rows: list[BenchRow] = []
    extra: dict[str, object] = {}

    if "executor" in chosen:
        executor_rows, baseline_uid = asyncio.run(compare(names, calls, baseline_calls, slot_count))
        rows += executor_rows
        console.print(table(executor_rows, f"executors, {slot_count} slots, {cores} cores"))
        if not baseline_uid:
            console.print("note: the fresh-interpreter baseline ran without a per-call uid")
        for snippet in names:
            fork = next(
                r for r in executor_rows if r.snippet == snippet and r.target == "fork-server"
            )
            fresh = next(
                r for r in executor_rows if r.snippet == snippet and r.target != fork.target
            )
            ratio = fork.calls_per_s / fresh.calls_per_s if fresh.calls_per_s else float("inf")
            console.print(f"ratio {snippet}: fork-server / fresh-interpreter = {ratio:.1f}x")

    if chosen & {"http", "codejudge"}:
        with served(server_pythonpath) as (url, _):
            if "http" in chosen:
                http_rows = asyncio.run(end_to_end(url, names, calls, batch_size))
                rows += http_rows
                console.print(table(http_rows, "end to end over HTTP (rstar2-sandbox serve)"))
            if "codejudge" in chosen:
                judge_rows = asyncio.run(codejudge_template(url, calls, codejudge_rounds))
                rows += judge_rows
                console.print(table(judge_rows, "Code Judge API, /run/long-batch"))
                plain, templated = judge_rows
                extra["template_ratio"] = templated.calls_per_s / plain.calls_per_s
                console.print(
                    f"ratio stdlib: rStar2-Agent template / plain = {extra['template_ratio']:.2f}"
                )

    if "mixed" in chosen:
        # A fresh server: its peak RSS is then this batch's.
        with served(server_pythonpath) as (url, pid):
            asyncio.run(wait_healthy(url, 120))
            extra["idle_rss_mib"] = memory_mib(pid, "VmHWM")
            mixed = asyncio.run(measure_mixed_batch(url, mixed_items))
            extra["peak_rss_mib"] = memory_mib(pid, "VmHWM")
        rows.append(mixed)
        console.print(table([mixed], "one Code Judge batch, every 16th item printing 1 MiB"))
        console.print(
            f"front end peak RSS: {extra['peak_rss_mib']:.0f} MiB "
            f"(after start-up: {extra['idle_rss_mib']:.0f} MiB)"
        )

    if "bodies" in chosen:
        bodies = {}
        for mode in BODY_MODES:  # each on a fresh server: its peak RSS is then this mode's
            with served(server_pythonpath) as (url, pid):
                asyncio.run(wait_healthy(url, 120))
                bodies[mode] = asyncio.run(measure_bodies(url, pid, body_calls, mode))
        extra["bodies"] = bodies
        console.print_json(data={"bodies (one-at-a-time /v1/run; 4 x 250 MB bodies)": bodies})

    if "window" in chosen:
        window = {}
        # Each on a fresh server: its peak RSS is then this measurement's.
        for name, measure in (
            ("eight_24mib_results", measure_big_results),
            ("stalled_client", measure_stalled_client),
        ):
            with served(server_pythonpath) as (url, pid):
                asyncio.run(wait_healthy(url, 120))
                window[name] = asyncio.run(measure(url, pid))
        extra["window"] = window
        console.print_json(data={"window (native batches, --response-buffer-mb 64)": window})

    if "step" in chosen and shutil.which("redis-server") is None:
        console.print("step: skipped, redis-server is not installed (apt-get install redis-server)")
    elif "step" in chosen:
        steps = [
            asyncio.run(
                cluster_step(
                    step_calls,
                    step_workers,
                    kill_one=kill_one,
                    pythonpath=server_pythonpath,
                    console=console,
                )
            )
            for kill_one in (False, True)
        ]
        extra["step"] = steps
        for step in steps:
            title = "with a worker killed halfway" if step["killed_worker"] else "all workers up"
            console.print_json(data={f"RL step through the cluster, {title}": step})

    load_after = os.getloadavg()[0]
    console.print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    if json_out:
        payload = {
            "cores": cores,
            "load": [load_before, load_after],
            "rows": [r.model_dump() for r in rows],
            **extra,
        }
        tmp = json_out + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(payload, handle, indent=2)
        os.replace(tmp, json_out)


if __name__ == "__main__":
    typer.run(main)
