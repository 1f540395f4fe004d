"""The demo's outputs: the before/after table, the ablation table, sample rollouts, summary.json."""

from __future__ import annotations

import io
import json
import logging
import statistics
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.table import Table

from rstar2_data.jsonl import atomic_write_text
from rstar2_data.protocol import ANSWER_OPEN
from rstar2_data.schemas import MathProblem
from rstar2_data.terminal import FittedTable
from rstar2_eval import ScoredSample
from rstar2_train.demo.scores import HeldOutScores
from rstar2_train.metrics import read_metrics

logger = logging.getLogger(__name__)


class PhaseTime(BaseModel):
    """Wall time of one phase of this invocation, with the machine's load beside it."""

    model_config = ConfigDict(extra="forbid")

    phase: str
    seconds: float
    skipped: bool = Field(description="Already finished by an earlier invocation.")
    load_avg_1m: float = Field(description="1-minute load average at the end of the phase.")


class Invocation(BaseModel):
    """The phase times of one ``rstar2-train demo`` invocation that reached its summary."""

    model_config = ConfigDict(extra="forbid")

    started: datetime | None = Field(description="When it started (absent in older summaries).")
    timings: list[PhaseTime]
    total_seconds: float


class AblationRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: str
    seed: int
    run_dir: str
    scores: HeldOutScores
    train_tool_error_ratio_kept_positives: float | None = Field(
        description="Mean over the run's RL steps of the tool-error ratio among the positives "
        "that RoC kept for the update."
    )


class AblationResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runs: list[AblationRun]
    mean_tool_error_ratio_correct: dict[str, float | None]
    roc_lower: bool | None = Field(
        description="Whether RoC (sample) has the lower mean held-out tool-error ratio among "
        "correct rollouts than plain GRPO (none); None when either has no correct rollout."
    )


class DemoSummary(BaseModel):
    """``summary.json``: every figure the demo printed, and where its outputs are."""

    model_config = ConfigDict(extra="forbid")

    quick: bool
    seed: int
    sft: HeldOutScores
    rl: HeldOutScores
    rl_reward_first: float | None = Field(
        description="Mean reward of the first quarter of the RL steps."
    )
    rl_reward_last: float | None = Field(
        description="Mean reward of the last quarter of the RL steps."
    )
    started: datetime | None = Field(default=None, description="When this invocation started.")
    timings: list[PhaseTime] = Field(description="This invocation's phases.")
    total_seconds: float
    earlier_invocations: list[Invocation] = Field(
        default_factory=list,
        description="The timings of earlier invocations on the same folder, oldest first: a "
        "re-run that skips finished phases keeps the times of the run that did them.",
    )
    plots: list[str]
    samples: list[str]
    ablation: AblationResult | None = None

    def invocation(self) -> Invocation:
        return Invocation(
            started=self.started, timings=self.timings, total_seconds=self.total_seconds
        )

    def invocations(self) -> list[Invocation]:
        """Every invocation's timings, this one last."""
        return [*self.earlier_invocations, self.invocation()]


def earlier_invocations(path: Path) -> list[Invocation]:
    """The invocations an existing ``summary.json`` recorded (none when there is none)."""
    if not path.is_file():
        return []
    try:
        return DemoSummary.model_validate_json(path.read_text(encoding="utf-8")).invocations()
    except (OSError, ValidationError) as error:
        logger.warning("%s: unreadable, its timings are not kept in the new one: %s", path, error)
        return []


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _change(before: float | None, after: float | None, *, percent: bool) -> str:
    if before is None or after is None:
        return "-"
    delta = after - before
    return f"{100 * delta:+.1f} pts" if percent else f"{delta:+.2f}"


_ROWS: Sequence[tuple[str, Callable[[HeldOutScores], float | None], bool]] = (
    ("held-out accuracy", lambda s: s.accuracy, True),
    ("tool calls per rollout", lambda s: s.tool_calls_per_rollout, False),
    ("rollouts without a tool call", lambda s: s.no_tool_rate, True),
    ("tool-error ratio, correct rollouts", lambda s: s.tool_error_ratio_correct, True),
    ("tool-error ratio, all rollouts", lambda s: s.tool_error_ratio, True),
    (f"format errors (not one {ANSWER_OPEN})", lambda s: s.format_error_rate, True),
    ("mean response length (tokens)", lambda s: s.mean_response_tokens, False),
)


def before_after_table(summary: DemoSummary) -> FittedTable:
    sft, rl = summary.sft, summary.rl
    table = Table(
        title=f"Held-out split: {rl.problems} problems x {rl.rollouts // max(rl.problems, 1)} "
        "sample(s), temperature 0.6"
    )
    table.add_column("metric")
    table.add_column("SFT", justify="right")
    table.add_column("SFT + GRPO-RoC", justify="right")
    table.add_column("change", justify="right")
    for label, get, percent in _ROWS:
        show = _percent if percent else _number
        table.add_row(
            label, show(get(sft)), show(get(rl)), _change(get(sft), get(rl), percent=percent)
        )
    if summary.rl_reward_first is not None and summary.rl_reward_last is not None:
        table.add_row(
            "RL training reward (first -> last quarter)",
            f"{summary.rl_reward_first:.3f}",
            f"{summary.rl_reward_last:.3f}",
            f"{summary.rl_reward_last - summary.rl_reward_first:+.3f}",
        )
    return FittedTable(table)


def ablation_table(result: AblationResult) -> FittedTable:
    table = Table(title="Ablation: tool-error ratio among correct held-out rollouts")
    table.add_column("roc.strategy")
    table.add_column("seed", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("tool-error ratio, correct", justify="right")
    table.add_column("train: kept positives", justify="right")
    for run in result.runs:
        table.add_row(
            run.strategy,
            str(run.seed),
            _percent(run.scores.accuracy),
            _percent(run.scores.tool_error_ratio_correct),
            _percent(run.train_tool_error_ratio_kept_positives),
        )
    for strategy, mean in result.mean_tool_error_ratio_correct.items():
        table.add_row(f"[bold]{strategy}: mean", "", "", f"[bold]{_percent(mean)}", "")
    return FittedTable(table)


def mean_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def reward_trend(run_dir: Path) -> tuple[float | None, float | None]:
    """Mean ``reward/mean`` over the first and over the last quarter of the RL steps (one
    step's 64 rollouts are too few to compare single steps)."""
    rewards = [
        r["reward/mean"] for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r
    ]
    if not rewards:
        return None, None
    window = max(1, len(rewards) // 4)
    return mean_of(rewards[:window]), mean_of(rewards[-window:])


def metric_mean(run_dir: Path, key: str) -> float | None:
    """Mean of one metric over a stage's logged steps."""
    return mean_of([r.get(key) for r in read_metrics(run_dir / "metrics.jsonl")])


def write_samples(
    path: Path, samples: Sequence[ScoredSample], problems: Sequence[MathProblem], count: int = 4
) -> None:
    """A few held-out rollouts as readable text, each under its problem and gold answer:
    correct ones first, then failures."""
    chosen = [s for s in samples if s.grade.correct][: count // 2]
    chosen += [s for s in samples if not s.grade.correct][: count - len(chosen)]
    by_id = {problem.id: problem for problem in problems}
    parts = ["# Held-out rollouts of the RL checkpoint\n"]
    for sample in chosen:
        g = sample.generation
        problem = by_id.get(g.problem_id)
        verdict = "correct" if sample.grade.correct else f"{sample.grade.status}"
        gold = f"`{problem.answer}`" if problem is not None else "unknown"
        statement = problem.problem if problem is not None else "(not in the held-out split)"
        parts.append(
            f"## {g.benchmark}/{g.problem_id} sample {g.sample_index}: {verdict}\n\n"
            f"- gold answer {gold}; graded answer `{sample.grade.answer}`\n"
            f"- {g.tool_calls} tool calls, {g.tool_errors} failed\n\n"
            f"**Problem**\n\n{statement}\n\n**Response**\n\n```text\n{g.response}\n```\n"
        )
    atomic_write_text(path, "\n".join(parts))


def write_summary(summary: DemoSummary, json_path: Path, text_path: Path) -> None:
    atomic_write_text(json_path, json.dumps(summary.model_dump(mode="json"), indent=2) + "\n")
    console = Console(record=True, width=110, file=io.StringIO())
    print_summary(summary, console)
    atomic_write_text(text_path, console.export_text())


def _timings(invocation: Invocation) -> str:
    phases = ", ".join(
        f"{t.phase} {'done before' if t.skipped else f'{t.seconds:.0f}s'} "
        f"(load {t.load_avg_1m:.1f})"
        for t in invocation.timings
    )
    return f"{invocation.total_seconds:.0f}s in all: {phases}"


def print_summary(summary: DemoSummary, console: Console) -> None:
    console.print(before_after_table(summary))
    if summary.ablation is not None:
        console.print(ablation_table(summary.ablation))
        verdict = {True: "yes", False: "no", None: "undetermined"}[summary.ablation.roc_lower]
        console.print(f"RoC lower than plain GRPO on the mean over seeds: [bold]{verdict}")
    invocations = summary.invocations()
    for number, invocation in enumerate(invocations, start=1):
        label = "time"
        if len(invocations) > 1:
            when = f"{invocation.started:%Y-%m-%d %H:%M} UTC" if invocation.started else "-"
            label = f"time, run {number} of {len(invocations)} ({when})"
        console.print(f"{label}: {_timings(invocation)}", highlight=False)
    console.print("plots:")
    for plot in summary.plots:
        console.print(f"  {plot}")
    console.print("sample rollouts:")
    for sample in summary.samples:
        console.print(f"  {sample}")
