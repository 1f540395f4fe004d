"""rstar2-eval benchmarks: grading throughput, and the evaluation harness's cost per rollout.

Run from the repository root (``uv run nox -s bench`` runs both):

    uv run python packages/rstar2-eval/bench/bench.py            # both
    uv run python packages/rstar2-eval/bench/bench.py grading    # grading.py
    uv run python packages/rstar2-eval/bench/bench.py harness    # harness.py

Each prints a table with the machine's load average before and after: figures taken on a busy
machine say so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grading import grading  # the bench folder is not a package
from harness import measure

app = typer.Typer(
    help="rstar2-eval benchmarks (no command: run all).",
    invoke_without_command=True,
    add_completion=False,
)
app.command("grading")(grading)


@app.command()
def harness(
    rollouts: Annotated[int, typer.Option(min=1, help="Rollouts to run (one per problem).")] = 2000,
    turns: Annotated[
        int, typer.Option(min=2, help="Turns per rollout: turns - 1 tool calls, then an answer.")
    ] = 4,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts in flight at most.")] = 256,
    json_out: Annotated[
        Path | None, typer.Option(help="Also write the figures as JSON to this file.")
    ] = None,
) -> None:
    """Rollouts/s of the evaluation harness against an instant stub server (separate process),
    with real sandbox calls, grading and writing; CPU per rollout by process."""
    logging.basicConfig(level=logging.WARNING)
    figures = asyncio.run(measure(rollouts, turns, concurrency))
    table = Table(title="rstar2-eval harness (instant stub server)", title_justify="left")
    for column in (
        "rollouts",
        "turns",
        "rollouts/s",
        "harness CPU ms",
        "stub CPU ms",
        "other CPU ms",
        "harness-bound rollouts/s",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        str(figures["rollouts"]),
        str(figures["turns"]),
        f"{figures['rollouts_per_s']:.1f}",
        f"{figures['harness_cpu_ms_per_rollout']:.2f}",
        f"{figures['stub_cpu_ms_per_rollout']:.2f}",
        f"{figures['other_cpu_ms_per_rollout']:.2f}",
        f"{figures['harness_bound_rollouts_per_s']:.0f}",
    )
    console = Console()
    console.print(table)
    console.print(
        f"cpus={len(os.sched_getaffinity(0))} placement={figures['reservation']} "
        f"load before={figures['load_before']} after={figures['load_after']}; CPU is per "
        "rollout; 'other' is the rest of the machine (the sandbox's fork-servers and their "
        "programs, and any other jobs)",
        highlight=False,
    )
    if json_out is not None:
        json_out.write_text(json.dumps(figures, indent=2) + "\n")


@app.callback()
def everything(ctx: typer.Context) -> None:
    """Run every benchmark when no command is given."""
    if ctx.invoked_subcommand is None:
        grading()
        harness()


if __name__ == "__main__":
    app()
