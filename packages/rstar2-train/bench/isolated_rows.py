"""Benchmark rows that each run in a process of their own, under a time cap, so that a row
that stalls, runs out of memory or crashes costs that row only (``scale_gpu.py``'s runner).

No torch here: rows fork from a server process (``multiprocessing``'s forkserver) that imports
what they need once; a row writes its progress and its result as JSON lines to a file of its
own, which survives the row being killed, so an unfinished row says how far it got.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    """One measurement, run in a process of its own."""

    id: str
    """``shape/name``, e.g. ``0.6b/rstar2``."""
    kind: str
    """naive, rstar2 (in-process), rstar2-fsdp (one trainer rank), generate, engine or
    weight-sync."""
    label: str
    cap_s: float
    attention: str = "auto"
    packing: bool = True
    checkpointing: bool = False
    plan: bool = False
    """Fit micro-batch tokens and checkpointing to the GPU's free memory (a stage's plan)."""
    skip: str | None = None
    """Why the row cannot run on this machine (recorded, not run)."""
    weights: str = "float32"
    """naive rows: the parameters' dtype (float32 under bf16 autocast, or bfloat16)."""
    compile: bool = False
    """engine rows: compile the decode step."""

    @property
    def shape(self) -> str:
        return self.id.split("/")[0]


class Events:
    """A row's progress, appended to a file as JSON lines (kept when the row is killed) and
    echoed to stderr with a timestamp."""

    def __init__(self, path: str, row: Row) -> None:
        self.path = path
        self.row = row
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self, **record: Any) -> None:
        record = {"t": round(self.elapsed(), 3), **record}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def progress(self, stage: str) -> None:
        self.write(stage=stage)
        log(f"  {self.row.id}: {stage} (+{self.elapsed():.1f}s)")


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            break
    return records


def run_isolated(
    target: Callable[[Row, dict[str, Any], str], None],
    row: Row,
    settings: dict[str, Any],
    cap_s: float,
    folder: Path,
) -> dict[str, Any]:
    """``target(row, settings, events file)`` in a process of its own, killed (with its
    process group) after ``cap_s``: the row's outcome."""
    events_path = folder / (row.id.replace("/", "_") + ".jsonl")
    context = multiprocessing.get_context("forkserver")
    process = context.Process(target=target, args=(row, settings, str(events_path)))
    started = time.perf_counter()
    process.start()
    process.join(cap_s)
    timed_out = process.is_alive()
    if timed_out:
        assert process.pid is not None
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # killed before it made its own group
            process.kill()
        process.join()
    seconds = time.perf_counter() - started
    events = read_events(events_path)
    stages = [e for e in events if "stage" in e]
    outcome: dict[str, Any] = {
        "id": row.id,
        "label": row.label,
        "seconds": round(seconds, 2),
        "pid": process.pid,
    }
    outcome["reached"] = f"{stages[-1]['stage']} (+{stages[-1]['t']:.1f}s)" if stages else None
    found = next((e for e in events if "result" in e), None)
    failed = next((e for e in events if "error" in e), None)
    if found is not None:
        outcome.update(found["result"], status="ok")
    elif timed_out:
        outcome.update(status="timed out", error=f"stopped at its cap of {duration(cap_s)}")
    elif failed is not None:
        outcome.update(status="failed", error=failed["error"])
    else:
        outcome.update(status="failed", error=f"the process ended with code {process.exitcode}")
    return outcome


def ready() -> None:
    """A row that does nothing (``start_forkserver`` waits for it)."""


def start_forkserver(preload: list[str]) -> None:
    """Start the server the rows fork from, with ``preload`` imported, and wait until it
    serves: its imports count against the run's budget, not against the first row's cap.
    (Python 3.11's forkserver does not preload the ``__main__`` script, so modules are
    named.)"""
    multiprocessing.set_forkserver_preload(preload)
    process = multiprocessing.get_context("forkserver").Process(target=ready)
    process.start()
    process.join()


def run_rows(
    rows: list[Row],
    settings: dict[str, Any],
    *,
    budget_s: float,
    target: Callable[[Row, dict[str, Any], str], None],
    preload: list[str],
    caps: dict[str, float] | None = None,
    min_start_s: float = 10.0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every row in turn, each as ``target(row, settings, events file)`` in a process forked
    from a server that imported ``preload``, under ``min(its cap, what is left of
    budget_s)``; a row with less than ``min_start_s`` (or its cap, if smaller) left is recorded
    as not run, a row with a ``skip`` reason as skipped. ``on_row`` gets each outcome as soon as
    it is known, so a run killed midway has reported the rows it finished."""
    caps = caps or {}
    started = time.perf_counter()
    start_forkserver(preload)
    outcomes: list[dict[str, Any]] = []

    def record(outcome: dict[str, Any]) -> None:
        outcomes.append(outcome)
        if on_row is not None:
            on_row(outcome)

    with tempfile.TemporaryDirectory(prefix="scale-gpu-") as folder:
        for row in rows:
            left = budget_s - (time.perf_counter() - started)
            cap = caps.get(row.id, row.cap_s)
            if row.skip is not None:
                log(f"skip  {row.id}: {row.skip}")
                record({"id": row.id, "label": row.label, "status": "skipped", "error": row.skip})
                continue
            if left < min(cap, min_start_s):
                log(f"skip  {row.id}: {left:.0f} s of the budget left")
                record(
                    {
                        "id": row.id,
                        "label": row.label,
                        "status": "not run",
                        "error": f"budget spent ({left:.0f} s left)",
                    }
                )
                continue
            cap = min(cap, left)
            log(f"start {row.id}: {row.label} (cap {duration(cap)}, {left:.0f} s of budget left)")
            outcome = run_isolated(target, row, settings, cap, Path(folder))
            log(f"end   {row.id}: {summary(outcome)}")
            record(outcome)
    return outcomes


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def summary(outcome: dict[str, Any]) -> str:
    """One line on how a row ended."""
    status = f"{outcome['status']} in {outcome.get('seconds', 0):.1f} s"
    if outcome["status"] != "ok":
        reached = outcome.get("reached")
        return f"{status}: {outcome.get('error')}" + (f"; last: {reached}" if reached else "")
    parts = [status]
    if "time_to_first_step_s" in outcome:
        parts.append(f"first step at {outcome['time_to_first_step_s']:.1f} s")
    if "tokens_per_s" in outcome:
        parts.append(f"{outcome['tokens_per_s']:,.0f} tok/s")
    if outcome.get("peak_memory_gib") is not None:
        parts.append(f"peak {outcome['peak_memory_gib']:.1f} GiB")
    return ", ".join(parts)
