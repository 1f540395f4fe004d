"""Writing score results: JSON report, per-problem CSV, graded-sample JSONL, terminal table."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from rstar2_data.jsonl import atomic_write_text
from rstar2_data.terminal import FittedTable
from rstar2_eval.scoring import BenchmarkScore, ProblemScore, ScoredSample, ScoreReport


def write_report_json(report: ScoreReport, path: Path) -> None:
    """The full report as indented JSON."""
    atomic_write_text(path, report.model_dump_json(indent=2) + "\n")


def write_problems_csv(problems: Sequence[ProblemScore], path: Path) -> None:
    """One row per problem; a pass@k column for every k any problem has (blank where k > n)."""
    ks = sorted({k for problem in problems for k in problem.pass_at_k})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "benchmark",
            "problem_id",
            "gold",
            "samples",
            "correct",
            "accuracy",
            *(f"pass@{k}" for k in ks),
            "majority_answer",
            "majority_correct",
            "no_answer",
            "timeouts",
        ]
    )
    for problem in problems:
        writer.writerow(
            [
                problem.benchmark,
                problem.problem_id,
                problem.gold,
                problem.samples,
                problem.correct,
                f"{problem.accuracy:.6f}",
                *(f"{problem.pass_at_k[k]:.6f}" if k in problem.pass_at_k else "" for k in ks),
                "" if problem.majority_answer is None else problem.majority_answer,
                problem.majority_correct,
                problem.no_answer,
                problem.timeouts,
            ]
        )
    atomic_write_text(path, buffer.getvalue())


def write_graded_samples(samples: Sequence[ScoredSample], path: Path) -> None:
    """``rstar2_data.schemas.GradedSample`` lines, the input of the data filters."""
    lines = (sample.to_graded_sample().model_dump_json() for sample in samples)
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _largest(metric: dict[int, float]) -> tuple[int, float] | None:
    return max(metric.items()) if metric else None


def _at(metric: dict[int, float]) -> str:
    largest = _largest(metric)
    return "-" if largest is None else f"{100 * largest[1]:.1f} @{largest[0]}"


def score_table(report: ScoreReport, title: str = "rstar2-eval score") -> FittedTable:
    """Per-benchmark summary for the terminal (percentages), fitted to its width."""
    table = Table(title=title, title_justify="left")
    table.add_column("benchmark")
    table.add_column("problems", justify="right")
    table.add_column("samples", justify="right")
    table.add_column("avg@k %", justify="right")
    table.add_column("pass@k %", justify="right")
    table.add_column("maj@k %", justify="right")
    table.add_column("no answer", justify="right")
    table.add_column("timeout / ungradable", justify="right")
    table.add_column("fallback used (correct)", justify="right")
    table.add_column("resp tokens", justify="right")
    table.add_column("tool calls", justify="right")
    table.add_column("tool err %", justify="right")
    table.add_column("truncated %", justify="right")
    for score in report.benchmarks:
        table.add_row(*_row(score))
    return FittedTable(table)


def _row(score: BenchmarkScore) -> list[str]:
    problems = f"{score.problems}/{score.problems_in_benchmark}"
    samples = (
        f"{score.samples} (k={score.min_samples})"
        if score.min_samples == score.max_samples
        else f"{score.samples} (k={score.min_samples}..{score.max_samples})"
    )
    return [
        score.benchmark,
        problems,
        samples,
        _percent(score.avg),
        _at(score.pass_at_k),
        _at(score.maj_at_k),
        str(score.statuses.no_answer),
        f"{score.statuses.timeout} / {score.statuses.ungradable}",
        f"{score.boxed_fallback_used} ({score.boxed_fallback_correct})",
        _number(score.mean_response_tokens, 0),
        _number(score.tool_calls_per_response, 2),
        _percent(score.tool_error_ratio),
        _percent(score.truncation_rate),
    ]
