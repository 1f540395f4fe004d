"""The paper's generalization table (rStar2-Agent, Table 5) beside a run's own scores.

rStar2-Agent is trained on math only; its report checks that this carries over to science
reasoning, tool use, instruction following and open-ended chat. ``generalization_table`` lays
a run's scores for those benchmarks beside the paper's, and says for each column the run could
not fill why (not evaluated in this run, not supported by rstar2-eval, or needing a judge model).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from rstar2_eval.scoring import BenchmarkScore, ScoreReport


class PaperColumn(BaseModel):
    """One column of the paper's table and how a run fills it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    rstar2_agent: float
    after_sft: float
    benchmark: str | None = None
    metric: Literal["avg", "prompt_strict"] = "avg"
    unsupported: str | None = None

    def score(self, benchmark: BenchmarkScore) -> float | None:
        """The run's number for this column, in percent."""
        if self.metric == "avg":
            return 100 * benchmark.avg
        following = benchmark.instruction_following
        return None if following is None else 100 * following.prompt_strict


TABLE5 = (
    PaperColumn(title="GPQA-Diamond", rstar2_agent=60.9, after_sft=42.1, benchmark="gpqa-diamond"),
    PaperColumn(
        title="BFCL v3",
        rstar2_agent=60.8,
        after_sft=63.1,
        unsupported="function calling is not supported by rstar2-eval yet",
    ),
    PaperColumn(
        title="IFEval strict-prompt",
        rstar2_agent=83.4,
        after_sft=83.7,
        benchmark="ifeval",
        metric="prompt_strict",
    ),
    PaperColumn(
        title="Arena-Hard",
        rstar2_agent=86.6,
        after_sft=86.8,
        unsupported="needs a judge model; rstar2-eval scores only what needs none",
    ),
)
"""rStar2-Agent-14B and its SFT checkpoint (before RL) in the paper's Table 5, in percent."""


def covers(report: ScoreReport) -> bool:
    """Whether the run evaluated any benchmark of the paper's generalization table."""
    names = {column.benchmark for column in TABLE5 if column.benchmark is not None}
    return any(score.benchmark in names for score in report.benchmarks)


def generalization_table(report: ScoreReport, *, model: str = "this run") -> Table:
    """The paper's Table 5 columns as rows: the paper's two numbers, the run's, or why not."""
    table = Table(title="Generalization (rStar2-Agent Table 5)", title_justify="left")
    for heading in ("benchmark", "rStar2-Agent-14B", "after SFT", model):
        table.add_column(heading)
    scores = {score.benchmark: score for score in report.benchmarks}
    for column in TABLE5:
        if column.unsupported is not None:
            ours = f"not run: {column.unsupported}"
        elif column.benchmark not in scores:
            ours = f"not run: add {column.benchmark} to --benchmarks"
        else:
            value = column.score(scores[column.benchmark])
            ours = "-" if value is None else f"{value:.1f}"
        table.add_row(column.title, f"{column.rstar2_agent:.1f}", f"{column.after_sft:.1f}", ours)
    return table
