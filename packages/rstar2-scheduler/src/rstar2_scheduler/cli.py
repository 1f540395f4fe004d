"""The ``rstar2-scheduler`` command line."""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rstar2_data.cli_errors import OneLineErrors
from rstar2_data.cli_output import command_console, configure_logging
from rstar2_data.errors import describe_validation_error
from rstar2_data.jsonl import atomic_write_text
from rstar2_data.paths import checked_output_file
from rstar2_data.terminal import FittedTable
from rstar2_scheduler.policies import POLICY_NAMES, RESERVATIONS
from rstar2_scheduler.sim.bench import (
    BenchConfig,
    BenchReport,
    SweepPoint,
    run_benchmark,
    run_sweep,
)
from rstar2_scheduler.sim.engine import SimEngineConfig
from rstar2_scheduler.sim.rl_loop import (
    TARGET_SPEEDUP,
    RLSimConfig,
    RLSimReport,
    TrainerModel,
    benchmark_arms,
    check_steady_window,
    run_rl_benchmark,
)
from rstar2_scheduler.sim.workload import WorkloadConfig

app = typer.Typer(
    cls=OneLineErrors,
    help="rstar2 rollout scheduling: load balancing over inference engines.",
    # Plain help: it wraps between words at any width, where rich's option panels cut words.
    rich_markup_mode=None,
)

_DEFAULT_ENGINE = SimEngineConfig()


class PolicyChoice(StrEnum):
    static = "static"
    least_loaded = "least-loaded"
    kv_aware = "kv-aware"


class ReservationChoice(StrEnum):
    live = "live"
    max = "max"


_DEFAULT_WORKLOAD = WorkloadConfig()
# Sizes of the sweep: dense from 32 to 48 prompts on two engines, where the static split's queue
# stops fitting the cache; 38 is the largest phase kv-aware places at once, 39 the smallest it
# places by its forecast.
_SWEEP_PROMPTS = (1, 2, 4, 8, 16, 24, 32, 34, 36, 38, 39, 40, 44, 48, 64, 128)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
) -> None:
    """rstar2 rollout scheduling: load balancing over inference engines. Results on stdout,
    logs and progress on stderr."""
    configure_logging(logging.DEBUG if verbose else logging.WARNING, command_console(stderr=True))


def _print_report(report: BenchReport, console: Console) -> None:
    bound = report.bound
    table = Table(title="Rollout phase per policy (simulated time)")
    for column in (
        "policy",
        "makespan s",
        "vs bound",
        "idle",
        "idle engine-s",
        "preemptions",
        "prefill tokens",
        "recomputed",
        "KV usage",
        "tool gap s",
        "wall s",
    ):
        if column == "policy":
            table.add_column(column, no_wrap=True)
        else:
            table.add_column(column, justify="right")
    for name, run in report.runs.items():
        m = run.metrics
        table.add_row(
            name,
            f"{m.makespan_s:,.1f}",
            f"{m.makespan_s / bound.bound_s:.3f}x",
            f"{m.idle_fraction:.1%}",
            f"{m.idle_s:,.0f}",
            f"{m.preemptions:,}",
            f"{run.prefill_tokens:,}",
            f"{run.recomputed_tokens:,}",
            f"{m.kv_usage_mean:.1%}",
            f"{m.tool_latency.mean_s:.3f}",
            f"{run.wall_s:.1f}",
        )
    console.print(FittedTable(table))
    console.print(
        f"lower bound {bound.bound_s:,.1f} s = max(work / engines {bound.balanced_s:,.1f} s, "
        f"longest rollout alone {bound.critical_path_s:,.1f} s); workload: "
        f"{report.config.workload.rollouts:,} rollouts, mean response "
        f"{report.response_tokens_mean:,.0f} tokens, {report.turns_mean:.2f} turns, "
        f"{report.truncated_fraction:.1%} truncated"
    )
    checks = report.targets()
    if checks:
        targets = Table(title="kv-aware against the targets")
        for column in ("target", "measured", "required", "met"):
            targets.add_column(column)
        for check in checks:
            value = f"{check.value:.2f}x" if "speed-up" in check.name else f"{check.value:.1%}"
            targets.add_row(check.name, value, check.target, "yes" if check.met else "NO")
        console.print(FittedTable(targets))


KVHeadroomOption = Annotated[
    float,
    typer.Option(min=0.0, max=0.99, help="kv-aware 'live': fraction of each KV cache kept free."),
]
BudgetOption = Annotated[
    int, typer.Option(min=1, help="Response budget per rollout (tokens, all turns).")
]
KVTokensOption = Annotated[
    int, typer.Option(min=1, help="KV cache capacity of each engine, in tokens.")
]
MaxNumSeqsOption = Annotated[
    int, typer.Option(min=1, help="Most sequences an engine batches at once.")
]


def _engine_config(kv_tokens: int, max_num_seqs: int) -> SimEngineConfig:
    blocks = -(-kv_tokens // _DEFAULT_ENGINE.block_size)
    return _DEFAULT_ENGINE.model_copy(update={"num_blocks": blocks, "max_num_seqs": max_num_seqs})


def _rollouts_do_not_fit(
    error: ValidationError, param_hint: str = "'--budget' / '--kv-tokens'"
) -> typer.BadParameter:
    """A workload the config refuses (rollouts an engine cannot hold, too few steps), as the
    one-line error of the options that set it."""
    message = error.errors()[0]["msg"].removeprefix("Value error, ")
    return typer.BadParameter(message, param_hint=param_hint)


def _progress(description: str) -> Progress:
    """A progress bar on stderr that leaves no trace once done (results go to stdout)."""
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=command_console(stderr=True),
        transient=True,
    )


@app.command()
def bench(
    engines: Annotated[int, typer.Option(min=1, help="Simulated inference engines.")] = 8,
    prompts: Annotated[
        int, typer.Option(min=1, help="Problems in the rollout phase.")
    ] = _DEFAULT_WORKLOAD.prompts,
    rollouts_per_prompt: Annotated[
        int, typer.Option(min=1, help="Rollouts per problem.")
    ] = _DEFAULT_WORKLOAD.rollouts_per_prompt,
    budget: BudgetOption = _DEFAULT_WORKLOAD.response_budget,
    max_turns: Annotated[
        int, typer.Option(min=1, help="Most model turns per rollout.")
    ] = _DEFAULT_WORKLOAD.max_turns,
    kv_tokens: KVTokensOption = _DEFAULT_ENGINE.capacity_tokens,
    max_num_seqs: MaxNumSeqsOption = _DEFAULT_ENGINE.max_num_seqs,
    policy: Annotated[
        list[PolicyChoice] | None,
        typer.Option(help="Policy to run; repeat for several. Default: all three."),
    ] = None,
    reservation: Annotated[
        list[ReservationChoice] | None,
        typer.Option(
            help=(
                "kv-aware admission; repeat for both. 'live' (the scheduler's default): admit "
                "while an engine's reported KV usage and the forecast peak of its rollouts, "
                "learnt from the footprints seen so far, fit its cache. 'max': each rollout "
                "reserves prompt + max response, up to --overcommit x the cache. "
                "Default: both, as runs 'kv-aware' and 'kv-aware/max'."
            )
        ),
    ] = None,
    overcommit: Annotated[
        float,
        typer.Option(
            min=0.01, help="kv-aware 'max': reservations may reach this times the capacity."
        ),
    ] = 1 / 0.7,
    kv_headroom: KVHeadroomOption = 0.1,
    max_concurrency: Annotated[
        int | None, typer.Option(min=1, help="Most rollouts in flight; default: no cap.")
    ] = None,
    lockstep_baseline: Annotated[
        bool,
        typer.Option(
            help=(
                "With static among the policies, also run 'static/lockstep', the paper's "
                "baseline: the static split with each engine's rollouts generating every turn "
                "together and running its tool calls only once all of them have finished it."
            )
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 0,
    plot: Annotated[
        Path | None,
        typer.Option(
            callback=checked_output_file, help="Write a PNG timeline of engine utilization here."
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", callback=checked_output_file, help="Write the full report as JSON here."
        ),
    ] = None,
) -> None:
    """Run the placement policies side by side on simulated engines in virtual time.

    Every policy replays the same planned rollouts (multi-turn, long-tailed lengths, tool
    calls of ~0.3 s) through the production RolloutScheduler on fresh SimEngines.
    """
    chosen = tuple(p.value for p in policy) if policy else POLICY_NAMES
    modes = tuple(r.value for r in reservation) if reservation else RESERVATIONS
    try:
        config = BenchConfig(
            engines=engines,
            workload=_DEFAULT_WORKLOAD.model_copy(
                update={
                    "prompts": prompts,
                    "rollouts_per_prompt": rollouts_per_prompt,
                    "response_budget": budget,
                    "max_turns": max_turns,
                    "seed": seed,
                }
            ),
            engine=_engine_config(kv_tokens, max_num_seqs),
            policies=chosen,
            reservations=modes,
            overcommit=overcommit,
            kv_headroom=kv_headroom,
            max_concurrency=max_concurrency,
            lockstep_baseline=lockstep_baseline,
        )
    except ValidationError as error:
        raise _rollouts_do_not_fit(error) from None
    console = command_console()
    with _progress("{task.description:>13}") as progress:
        tasks = {
            name: progress.add_task(name, total=config.workload.rollouts)
            for name, *_ in config.runs()
        }
        report = run_benchmark(config, on_result=lambda name, _: progress.advance(tasks[name]))
    _print_report(report, console)
    if json_out is not None:
        atomic_write_text(json_out, report.model_dump_json(indent=1))
        console.print(f"report: {json_out}")
    if plot is not None:
        console.print(f"timeline: {_plot_report(report, plot)}")


def _plot_report(report: BenchReport, path: Path) -> Path:
    from rstar2_scheduler.sim.plot import plot_timelines

    config, workload = report.config, report.config.workload
    title = (
        f"{config.engines} simulated engines, {workload.rollouts:,} rollouts "
        f"({workload.prompts} prompts x {workload.rollouts_per_prompt}), "
        f"{workload.response_budget:,}-token budget\nkv-aware: live admission with "
        f"{config.kv_headroom:.0%} headroom, kv-aware/max: over-commit {config.overcommit:.2f}"
    )
    phases = {name: run.metrics for name, run in report.runs.items()}
    return plot_timelines(phases, path, bound_s=report.bound.bound_s, title=title)


@app.command()
def plot(
    report: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="A report from 'bench --json'.")
    ],
    out: Annotated[
        Path, typer.Option(callback=checked_output_file, help="Where to write the PNG timeline.")
    ] = Path("bench_timeline.png"),
) -> None:
    """Draw the engine-utilization timeline of a saved benchmark report."""
    try:
        loaded = BenchReport.model_validate_json(report.read_bytes())
    except ValidationError as error:
        raise typer.BadParameter(
            f"{report} is not a report of 'bench --json': {describe_validation_error(error)}",
            param_hint="report",
        ) from None
    command_console().print(f"timeline: {_plot_report(loaded, out)}")


@app.command()
def sweep(
    engines: Annotated[
        list[int] | None,
        typer.Option(min=1, help="Simulated engines; repeat for several. Default: 2."),
    ] = None,
    prompts: Annotated[
        list[int] | None,
        typer.Option(
            min=1,
            help="Problems in the phase (32 rollouts each); repeat for several. "
            f"Default: {' '.join(map(str, _SWEEP_PROMPTS))}.",
        ),
    ] = None,
    seed: Annotated[
        list[int] | None,
        typer.Option(help="Workload seed; repeat for several. Default: 0 1 2."),
    ] = None,
    budget: BudgetOption = _DEFAULT_WORKLOAD.response_budget,
    kv_tokens: KVTokensOption = _DEFAULT_ENGINE.capacity_tokens,
    max_num_seqs: MaxNumSeqsOption = _DEFAULT_ENGINE.max_num_seqs,
    kv_headroom: KVHeadroomOption = 0.1,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", callback=checked_output_file, help="Write every point as JSON here."
        ),
    ] = None,
) -> None:
    """static against kv-aware across workload sizes: the makespan of each, per size and seed.

    Every point is a 'bench' run of the two policies on the default workload and engines with
    the given number of prompts, seed, budget, cache and batch; the speed-up is static's
    makespan over kv-aware's.
    """
    counts = prompts or list(_SWEEP_PROMPTS)
    seeds = seed or [0, 1, 2]
    console = command_console()
    table = Table(title="static against kv-aware across workload sizes (simulated time)")
    for column in ("engines", "prompts", "rollouts", "seed", "static s", "kv-aware s", "speed-up"):
        table.add_column(column, justify="right")
    points: list[SweepPoint] = []
    with _progress("sweep") as progress:
        task = progress.add_task("sweep", total=len(counts) * len(seeds) * len(engines or [2]))
        # The first point's workload; run_sweep checks every point before it runs one, and the
        # check does not depend on the number of engines.
        workload = _DEFAULT_WORKLOAD.model_copy(
            update={"response_budget": budget, "prompts": counts[0], "seed": seeds[0]}
        )
        try:
            for engine_count in engines or [2]:
                config = BenchConfig(
                    engines=engine_count,
                    workload=workload,
                    engine=_engine_config(kv_tokens, max_num_seqs),
                    kv_headroom=kv_headroom,
                )
                points += run_sweep(
                    config, counts, seeds, on_point=lambda _: progress.advance(task)
                )
        except ValidationError as error:
            raise _rollouts_do_not_fit(error) from None
    for point in points:
        table.add_row(
            str(point.engines),
            str(point.prompts),
            f"{point.rollouts:,}",
            str(point.seed),
            f"{point.static_s:,.1f}",
            f"{point.kv_aware_s:,.1f}",
            f"{point.speedup:.3f}x",
        )
    console.print(FittedTable(table))
    worst = min(points, key=lambda p: p.speedup)
    console.print(
        f"lowest speed-up {worst.speedup:.3f}x ({worst.engines} engines, {worst.prompts} prompts, "
        f"seed {worst.seed})"
    )
    if json_out is not None:
        atomic_write_text(json_out, json.dumps([p.model_dump() for p in points], indent=1))
        console.print(f"points: {json_out}")


_DEFAULT_TRAINER = TrainerModel()


@app.command("rl-bench")
def rl_bench(
    engines: Annotated[
        int,
        typer.Option(
            min=1,
            help="Simulated inference engines, one GPU each; in the equal-hardware runs, the "
            "GPUs in all.",
        ),
    ] = 64,
    trainer_gpus: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Equal-hardware runs: GPUs out of --engines that train while the rest generate "
            "(the synchronous loop trains on all of them between phases). Default: a quarter "
            "of --engines; 0: split-hardware runs only.",
        ),
    ] = None,
    prompts: Annotated[
        int, typer.Option(min=1, help="Prompts per RL step (B).")
    ] = _DEFAULT_WORKLOAD.prompts,
    rollouts_per_prompt: Annotated[
        int, typer.Option(min=1, help="Rollouts per prompt (2G).")
    ] = _DEFAULT_WORKLOAD.rollouts_per_prompt,
    budget: BudgetOption = _DEFAULT_WORKLOAD.response_budget,
    kv_tokens: KVTokensOption = _DEFAULT_ENGINE.capacity_tokens,
    max_num_seqs: MaxNumSeqsOption = _DEFAULT_ENGINE.max_num_seqs,
    steps: Annotated[
        int,
        typer.Option(
            min=2,
            help="RL steps per run; the last max_staleness of them drain and are not measured.",
        ),
    ] = 6,
    warmup_steps: Annotated[
        int, typer.Option(min=0, help="First steps left out of the rates (the pipeline fills).")
    ] = 1,
    staleness: Annotated[
        list[int] | None,
        typer.Option(
            min=0,
            help="max_staleness (eta) to run; repeat for several; 0 is the synchronous loop. "
            "Default: 0 1 2.",
        ),
    ] = None,
    trainer_s_per_token: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Update seconds per trained token on 64 GPUs (default: a 14B model at 35%% "
            "MFU); on g GPUs it scales by 64 / g.",
        ),
    ] = _DEFAULT_TRAINER.s_per_token,
    trainer_fixed_s: Annotated[
        float, typer.Option(min=0.0, help="Update seconds per step, whatever its size.")
    ] = _DEFAULT_TRAINER.fixed_s,
    load_s: Annotated[
        float, typer.Option(min=0.0, help="Weight load per engine once its calls drained.")
    ] = _DEFAULT_TRAINER.load_s,
    seed: Annotated[int, typer.Option(help="Seed of the workload (each step's varies).")] = 0,
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json", callback=checked_output_file, help="Write the full report as JSON here."
        ),
    ] = None,
) -> None:
    """Synchronous RL against bounded staleness on simulated engines in virtual time.

    Each step's rollouts (the bench workload, a new seed per step) run through the production
    RolloutScheduler; admission under the staleness bound and weight swaps at turn boundaries
    are the production StalenessBuffer and TurnGate. The trainer is a cost model: an update
    takes fixed + per-token seconds, then every engine is held (its calls in flight finish) and
    loads the weights. Split hardware: the trainer has 64 GPUs of its own beside --engines.
    Equal hardware: --engines GPUs in all (see --trainer-gpus). Reports steady-state steps per
    hour (after the warm-up, before the drain) in all and per GPU, engine and trainer idle, and
    the token lag.
    """
    arms = sorted(set(staleness)) if staleness else [0, 1, 2]
    split_gpus = max(1, engines // 4) if trainer_gpus is None else trainer_gpus
    try:
        config = RLSimConfig(
            engines=engines,
            trainer_gpus=split_gpus if split_gpus and engines > 1 else None,
            workload=_DEFAULT_WORKLOAD.model_copy(
                update={
                    "prompts": prompts,
                    "rollouts_per_prompt": rollouts_per_prompt,
                    "response_budget": budget,
                    "seed": seed,
                }
            ),
            engine=_engine_config(kv_tokens, max_num_seqs),
            trainer=TrainerModel(
                fixed_s=trainer_fixed_s, s_per_token=trainer_s_per_token, load_s=load_s
            ),
            steps=steps,
            warmup_steps=warmup_steps,
        )
    except ValidationError as error:
        raise _rollouts_do_not_fit(
            error, "'--budget' / '--kv-tokens' / '--steps' / '--trainer-gpus'"
        ) from None
    try:
        check_steady_window(config, arms)
    except ValueError as short:
        raise typer.BadParameter(str(short), param_hint="'--steps'") from None
    console = command_console()
    with _progress("{task.description:>14}") as progress:
        tasks = {
            arm: progress.add_task(f"{arm[0]} eta {arm[1]}", total=steps)
            for arm in benchmark_arms(config, arms)
        }
        report = run_rl_benchmark(
            config, arms, on_step=lambda hardware, eta, _: progress.advance(tasks[hardware, eta])
        )
    _print_rl_report(report, console)
    if json_out is not None:
        atomic_write_text(json_out, report.model_dump_json(indent=1))
        console.print(f"report: {json_out}")


def _print_rl_report(report: RLSimReport, console: Console) -> None:
    config = report.config
    table = Table(
        title=f"{config.workload.rollouts:,} rollouts per step, steady state: steps "
        f"{config.warmup_steps + 1} to {config.steps} - max_staleness (simulated time)"
    )
    for column in (
        "hardware",
        "max_staleness",
        "GPUs: engines + trainer",
        "steps/hour",
        "per GPU x 1000",
        "vs sync",
        "with drain",
        "engine idle",
        "trainer idle",
        "sync share",
        "s/step",
        "lag mean",
        "lag max",
        "tokens by lag",
        "swaps mid-request",
    ):
        table.add_column(column, justify="right")
    for run in report.runs:
        speedup = report.speedup(run)
        histogram = run.lag_histogram()
        tokens = sum(histogram.values()) or 1
        colocated = run.gpus == run.engines and run.max_staleness == 0
        table.add_row(
            run.hardware,
            "0 (sync)" if run.max_staleness == 0 else str(run.max_staleness),
            f"{run.gpus}: {run.engines} + "
            + ("the same" if colocated else str(config.layout(run.hardware, run.max_staleness)[1])),
            f"{run.steps_per_hour:.2f}",
            f"{run.steps_per_hour_per_gpu * 1000:.1f}",
            "-" if speedup is None else f"{speedup:.2f}x",
            f"{run.steps_per_hour_with_drain:.2f}",
            f"{run.engine_idle:.1%}",
            f"{run.trainer_idle:.1%}",
            f"{run.sync_fraction:.1%}",
            f"{3600 / run.steps_per_hour:,.1f}",
            f"{run.lag_mean:.2f}",
            str(run.lag_max),
            " ".join(f"{lag}:{n / tokens:.0%}" for lag, n in histogram.items()),
            str(run.mid_request_swaps),
        )
    console.print(FittedTable(table))
    for hardware in ("split", "equal"):
        met = report.target_met(hardware)
        if met is not None:
            console.print(
                f"target ({hardware} hardware): max_staleness 1 at >= "
                f"{TARGET_SPEEDUP[hardware]:.1f}x the synchronous steady-state steps per hour: "
                f"{'met' if met else 'NOT met'}"
            )
