"""``rstar2-train demo --ablation-async``: the demo's RL stage synchronous and with bounded
staleness (max_staleness 1 and 2), three seeds each, the same steps and so the same consumed
samples, engine and trainer on disjoint cores.

Every run is ``demo-rl`` from the demo's SFT checkpoint with its engine in a child process
pinned to the last CPU core (``rl.engines.process``) and the trainer's compute thread pinned to
the others with one torch thread, in both the synchronous and the asynchronous runs, so the
arms differ only in the loop. A checkpoint every 10 steps is evaluated on the held-out split
afterwards (evaluation does not slow training down); its wall-clock is the run's
``time/elapsed_s`` at that step. Reported per arm: held-out accuracy against wall-clock, the
wall-clock to reach the synchronous runs' final accuracy, final accuracy (mean and spread over
seeds), steps per hour, trainer and engine idle fractions, and the ideal overlap the
synchronous runs' own phase times allow.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import statistics
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from rstar2_data.jsonl import atomic_write_text
from rstar2_data.terminal import FittedTable
from rstar2_scheduler import device_executor
from rstar2_train.checkpoint import list_checkpoints
from rstar2_train.metrics import read_metrics

logger = logging.getLogger(__name__)

ARMS: tuple[int, ...] = (0, 1, 2)
"""rl.max_staleness of each arm; 0 is the synchronous loop."""
SEEDS = 3
EVAL_EVERY = 10
QUICK_EVAL_EVERY = 1


def arm_name(max_staleness: int) -> str:
    return "sync" if max_staleness == 0 else f"eta{max_staleness}"


def cores() -> tuple[list[int], list[int]]:
    """(trainer cores, engine cores): the engine gets the last core, the trainer the rest."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        raise ValueError(
            "`ablation_async` puts the engine and the trainer on disjoint cores: it needs at "
            f"least 2 CPU cores, this process may use {len(available)}"
        )
    return available[:-1], available[-1:]


def run_overrides(max_staleness: int, *, quick: bool) -> list[str]:
    """What an ablation run changes in the demo's RL config."""
    _, engine_cores = cores()
    every = QUICK_EVAL_EVERY if quick else EVAL_EVERY
    return [
        f"rl.max_staleness={max_staleness}",
        "rl.engines.process=true",
        f"rl.engines.cpus={engine_cores}",
        f"checkpoint.every_steps={every}",
        "checkpoint.keep_last=1000",  # every evaluated checkpoint is kept
    ]


@contextlib.contextmanager
def trainer_pinned() -> Iterator[None]:
    """The trainer's compute thread on the trainer cores with one torch thread, restored after
    (the held-out evaluations run on every core)."""
    trainer_cores, _ = cores()
    executor = device_executor("cpu")
    before = executor.submit(os.sched_getaffinity, 0).result()
    threads = torch.get_num_threads()
    executor.submit(os.sched_setaffinity, 0, trainer_cores).result()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        executor.submit(os.sched_setaffinity, 0, before).result()
        torch.set_num_threads(threads)


class RunLoad(BaseModel):
    """The machine's 1-minute load average while a run trained."""

    model_config = ConfigDict(extra="forbid")

    start: float
    end: float
    mean: float = Field(description="Mean of samples every few seconds, start and end included.")


LOAD_FILE = "load.json"


@contextlib.contextmanager
def measured_load(run_dir: Path, *, every_s: float = 5.0) -> Iterator[None]:
    """Sample the 1-minute load average while the block runs (a run training) and write it to
    ``run_dir/load.json`` when the block ends without an error."""
    samples = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, name="load-sampler", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()
    samples.append(os.getloadavg()[0])
    load = RunLoad(start=samples[0], end=samples[-1], mean=statistics.fmean(samples))
    atomic_write_text(run_dir / LOAD_FILE, load.model_dump_json() + "\n")


class CurvePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    elapsed_s: float = Field(description="Training wall-clock at the end of this step.")
    accuracy: float = Field(description="Held-out accuracy of the step's checkpoint.")


class AblationRun(BaseModel):
    """One run of one arm."""

    model_config = ConfigDict(extra="forbid")

    max_staleness: int
    seed: int
    run_dir: str
    steps: int
    elapsed_s: float = Field(description="Training wall-clock, first step to last.")
    curve: list[CurvePoint] = Field(description="From the SFT checkpoint (step 0) on.")
    trainer_idle: float = Field(description="Fraction of the wall-clock the trainer waited.")
    engine_idle: float = Field(description="Fraction of the wall-clock the engine had no call.")
    rollout_s: float = Field(description="Sum of the steps' rollout phases (with grading).")
    update_s: float = Field(description="Sum of the steps' updates and weight syncs.")
    lag_mean: float | None = Field(description="Mean version lag of trained tokens.")
    load: RunLoad | None = Field(
        default=None, description="The load while it trained (None: not recorded)."
    )

    @property
    def final_accuracy(self) -> float:
        return self.curve[-1].accuracy

    @property
    def steps_per_hour(self) -> float:
        return self.steps / self.elapsed_s * 3600


def run_record(
    run_dir: Path, max_staleness: int, seed: int, accuracies: dict[int, float]
) -> AblationRun:
    """A finished run's figures from its metrics and its checkpoints' held-out accuracy."""
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step", 0) > 0]
    if not records:
        raise ValueError(f"{run_dir}: no RL steps logged")
    elapsed = {int(r["step"]): float(r["time/elapsed_s"]) for r in records}
    total = records[-1]["time/elapsed_s"]
    weights = [float(r["time/step_s"]) for r in records]

    def total_of(*keys: str) -> float:
        return sum(float(r.get(key) or 0.0) for r in records for key in keys)

    engine_idle = sum(
        float(r["engines/idle_fraction"]) * w for r, w in zip(records, weights, strict=True)
    ) / sum(weights)
    lags = [r["staleness/lag_mean"] for r in records if r.get("staleness/lag_mean") is not None]
    curve = [
        CurvePoint(step=step, elapsed_s=0.0 if step == 0 else elapsed[step], accuracy=accuracy)
        for step, accuracy in sorted(accuracies.items())
    ]
    return AblationRun(
        max_staleness=max_staleness,
        seed=seed,
        run_dir=str(run_dir),
        steps=len(records),
        elapsed_s=total,
        curve=curve,
        trainer_idle=total_of("trainer/idle_s") / total,
        engine_idle=engine_idle,
        rollout_s=total_of("time/rollout_s", "time/reward_s"),
        update_s=total_of("time/update_s", "time/sync_s"),
        lag_mean=statistics.fmean(lags) if lags else None,
        load=_read_load(run_dir / LOAD_FILE),
    )


def _read_load(path: Path) -> RunLoad | None:
    return RunLoad.model_validate_json(path.read_text()) if path.is_file() else None


def crossing(curve: Sequence[CurvePoint], target: float) -> float | None:
    """The wall-clock at which ``curve`` first reaches ``target`` (linear between points)."""
    for before, point in itertools.pairwise(curve):
        if point.accuracy >= target:
            if before.accuracy >= target:
                return before.elapsed_s
            share = (target - before.accuracy) / (point.accuracy - before.accuracy)
            return before.elapsed_s + share * (point.elapsed_s - before.elapsed_s)
    return None


def mean_curve(runs: Sequence[AblationRun]) -> list[CurvePoint]:
    """The arm's curve: at each evaluated step, mean wall-clock and mean accuracy over seeds."""
    steps = sorted(set.intersection(*({p.step for p in run.curve} for run in runs)))
    points = []
    for step in steps:
        at = [next(p for p in run.curve if p.step == step) for run in runs]
        points.append(
            CurvePoint(
                step=step,
                elapsed_s=statistics.fmean(p.elapsed_s for p in at),
                accuracy=statistics.fmean(p.accuracy for p in at),
            )
        )
    return points


class ArmSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_staleness: int
    seeds: int
    final_accuracy_mean: float
    final_accuracy_spread: tuple[float, float] = Field(description="Lowest and highest seed.")
    steps_per_hour: float = Field(description="Mean over seeds.")
    elapsed_s: float = Field(description="Mean training wall-clock over seeds.")
    time_to_target_s: float | None = Field(
        description="When the arm's mean curve first reaches the synchronous runs' mean final "
        "accuracy (None: never within the run)."
    )
    speedup_to_target: float | None = Field(
        description="The synchronous arm's time_to_target_s over this arm's (both the first "
        "time the mean curve reaches the target)."
    )
    trainer_idle: float
    engine_idle: float
    lag_mean: float | None


class AsyncAblationResult(BaseModel):
    """``ablation-async.json``."""

    model_config = ConfigDict(extra="forbid")

    runs: list[AblationRun]
    arms: list[ArmSummary]
    target_accuracy: float = Field(description="The synchronous runs' mean final accuracy.")
    ideal_overlap: float = Field(
        description="(rollouts + updates) / max(rollouts, updates), summed over the synchronous "
        "runs' steps: the speed-up of overlapping the two perfectly."
    )
    cpu_cores: dict[str, list[int]]
    plot: str | None = None


def summarize(
    runs: Sequence[AblationRun], *, trainer: list[int], engine: list[int]
) -> AsyncAblationResult:
    sync = [run for run in runs if run.max_staleness == 0]
    if not sync:
        raise ValueError("the ablation needs the synchronous runs")
    target = statistics.fmean(run.final_accuracy for run in sync)
    # The synchronous mean curve ends at the target, so it always reaches it.
    sync_reached = crossing(mean_curve(sync), target)
    assert sync_reached is not None
    rollouts = sum(run.rollout_s for run in sync)
    updates = sum(run.update_s for run in sync)
    arms = []
    for arm in sorted({run.max_staleness for run in runs}):
        mine = [run for run in runs if run.max_staleness == arm]
        finals = [run.final_accuracy for run in mine]
        reached = crossing(mean_curve(mine), target)
        lags = [run.lag_mean for run in mine if run.lag_mean is not None]
        arms.append(
            ArmSummary(
                max_staleness=arm,
                seeds=len(mine),
                final_accuracy_mean=statistics.fmean(finals),
                final_accuracy_spread=(min(finals), max(finals)),
                steps_per_hour=statistics.fmean(run.steps_per_hour for run in mine),
                elapsed_s=statistics.fmean(run.elapsed_s for run in mine),
                time_to_target_s=reached,
                speedup_to_target=None if not reached else sync_reached / reached,
                trainer_idle=statistics.fmean(run.trainer_idle for run in mine),
                engine_idle=statistics.fmean(run.engine_idle for run in mine),
                lag_mean=statistics.fmean(lags) if lags else None,
            )
        )
    return AsyncAblationResult(
        runs=list(runs),
        arms=arms,
        target_accuracy=target,
        ideal_overlap=(rollouts + updates) / max(rollouts, updates),
        cpu_cores={"trainer": trainer, "engine": engine},
    )


def plot_curves(result: AsyncAblationResult, path: Path) -> Path | None:
    """Held-out accuracy against training wall-clock, one line per arm (mean over seeds, the
    seeds faint); None without matplotlib (the plot extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("no plot of the ablation: pip install 'rstar2-train[plot]'")
        return None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, arm in enumerate(sorted({run.max_staleness for run in result.runs})):
        color = f"C{index}"
        mine = [run for run in result.runs if run.max_staleness == arm]
        for run in mine:
            axes.plot(
                [p.elapsed_s for p in run.curve],
                [100 * p.accuracy for p in run.curve],
                color=color,
                alpha=0.25,
                linewidth=1,
            )
        curve = mean_curve(mine)
        label = "synchronous" if arm == 0 else f"max_staleness {arm}"
        axes.plot(
            [p.elapsed_s for p in curve],
            [100 * p.accuracy for p in curve],
            color=color,
            marker="o",
            label=f"{label} (mean of {len(mine)} seeds)",
        )
    axes.axhline(100 * result.target_accuracy, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("training wall-clock (s)")
    axes.set_ylabel("held-out accuracy (%)")
    axes.set_title("demo RL: synchronous vs bounded staleness")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def ablation_table(result: AsyncAblationResult) -> FittedTable:
    table = Table(
        title=f"Ablation: synchronous vs bounded staleness (target: the synchronous runs' mean "
        f"final accuracy, {_percent(result.target_accuracy)})"
    )
    for column in (
        "arm",
        "seeds",
        "final accuracy",
        "spread",
        "time to target",
        "speed-up",
        "steps/hour",
        "trainer idle",
        "engine idle",
        "lag",
    ):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm in result.arms:
        low, high = arm.final_accuracy_spread
        table.add_row(
            "synchronous" if arm.max_staleness == 0 else f"max_staleness {arm.max_staleness}",
            str(arm.seeds),
            _percent(arm.final_accuracy_mean),
            f"{100 * low:.1f}-{100 * high:.1f}%",
            "not reached" if arm.time_to_target_s is None else f"{arm.time_to_target_s:.0f} s",
            "-" if arm.speedup_to_target is None else f"{arm.speedup_to_target:.2f}x",
            f"{arm.steps_per_hour:.0f}",
            _percent(arm.trainer_idle),
            _percent(arm.engine_idle),
            "-" if arm.lag_mean is None else f"{arm.lag_mean:.2f}",
        )
    return FittedTable(table)


def print_result(result: AsyncAblationResult, console: Console) -> None:
    console.print(ablation_table(result))
    console.print(
        f"ideal overlap from the synchronous runs' phase times: {result.ideal_overlap:.2f}x; "
        f"trainer on cores {result.cpu_cores['trainer']}, engine on {result.cpu_cores['engine']}"
    )
    for run in result.runs:
        load = (
            "load not recorded"
            if run.load is None
            else f"load {run.load.start:.1f} -> {run.load.end:.1f}, mean {run.load.mean:.1f}"
        )
        console.print(
            f"  {arm_name(run.max_staleness)} seed {run.seed}: {run.steps} steps in "
            f"{run.elapsed_s:.0f} s ({load}), final accuracy {_percent(run.final_accuracy)}",
            highlight=False,
        )
    if result.plot:
        console.print(f"plot: {result.plot}")


def evaluated_steps(run_dir: Path, every: int) -> list[tuple[int, Path]]:
    """The run's checkpoints at every ``every`` steps (the last one included)."""
    found = [
        (int(path.name.split("-")[-1]), path) for path in list_checkpoints(run_dir / "checkpoints")
    ]
    last = max(step for step, _ in found)
    return [(step, path) for step, path in found if step % every == 0 or step == last]


def write_result(result: AsyncAblationResult, folder: Path) -> None:
    """``ablation-async.json`` (every figure) and ``ablation-async.txt`` (what was printed)."""
    atomic_write_text(folder / "ablation-async.json", result.model_dump_json(indent=2) + "\n")
    console = Console(record=True, width=120, file=io.StringIO())
    print_result(result, console)
    atomic_write_text(folder / "ablation-async.txt", console.export_text())
