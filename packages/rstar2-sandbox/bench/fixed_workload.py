"""One fixed workload through ``LocalSandbox``, timed section by section: for comparing two
versions of rstar2-sandbox on the same machine (run this script with each version's ``src`` on
``PYTHONPATH``, alternating, several times; compare ratios of means).

The workload: 3,000 trivial, 1,000 numpy and 500 sympy calls (``--scale`` multiplies the counts)
through ``LocalSandbox(ExecutorSettings(slots=...))`` after 200 trivial calls to warm it. Prints
one JSON line: the start-up time, each section's seconds, the total, and the CPU time of this
process and everything it waited for (the fork-servers and, through them, the runs). Uses only
the public API that every version has, so an older checkout's code runs it unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from typing import Annotated

import typer

from rstar2_sandbox import ExecutorSettings, LocalSandbox, RunRequest
from rstar2_sandbox.bench import SNIPPETS

WORKLOAD = (("trivial", 3000), ("numpy", 1000), ("sympy", 500))
WARM_UP_CALLS = 200


async def _timed(slots: int, scale: float) -> dict[str, float]:
    began = time.perf_counter()
    seconds: dict[str, float] = {}
    async with LocalSandbox(ExecutorSettings(slots=slots)) as sandbox:
        warm_up = [RunRequest(code=SNIPPETS["trivial"])] * WARM_UP_CALLS
        if not all(r.ok for r in await sandbox.run_many(warm_up)):
            raise RuntimeError("a warm-up call failed")
        seconds["start_s"] = time.perf_counter() - began
        for name, calls in WORKLOAD:
            requests = [RunRequest(code=SNIPPETS[name])] * max(1, round(calls * scale))
            section = time.perf_counter()
            results = await sandbox.run_many(requests)
            seconds[f"{name}_s"] = time.perf_counter() - section
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"{len(failed)} {name} calls failed, first: {failed[0]}")
    seconds["total_s"] = time.perf_counter() - began
    return seconds


def main(
    slots: Annotated[int, typer.Option(min=1, help="Slots of the sandbox (concurrent runs).")] = 8,
    scale: Annotated[
        float,
        typer.Option(
            min=0.001, help="Multiplies every section's call count (0.1 for a smoke run)."
        ),
    ] = 1.0,
) -> None:
    """Time the fixed workload once and print one JSON line."""
    seconds = asyncio.run(_timed(slots, scale))
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds["user_s"] = own.ru_utime + waited.ru_utime
    seconds["system_s"] = own.ru_stime + waited.ru_stime
    seconds["load_1m"] = os.getloadavg()[0]
    print(json.dumps({k: round(v, 3) for k, v in seconds.items()}))


if __name__ == "__main__":
    typer.run(main)
