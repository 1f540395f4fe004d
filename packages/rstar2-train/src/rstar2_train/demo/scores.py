"""Held-out figures of one checkpoint, from the rstar2-eval run that evaluated it.

rstar2-eval's report has accuracy, tool calls and the tool-error ratio over all rollouts; the
demo also needs the tool-error ratio among *correct* rollouts (what Resample-on-Correct acts on)
and format errors, which take each sample's grade: the run's ``generations.jsonl`` is scored
again with rstar2-eval's ``score_generations`` (what ``rstar2-eval score`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval import Grader, ProblemSet, ScoredSample, read_generations, score_generations
from rstar2_eval.evaluation import REPORT_STEM

GENERATIONS = f"{REPORT_STEM}.jsonl"


class HeldOutScores(BaseModel):
    """What the before/after table shows for one checkpoint."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str
    eval_dir: str
    problems: int
    rollouts: int
    accuracy: float = Field(description="Correct rollouts / rollouts (avg@k).")
    tool_calls_per_rollout: float
    no_tool_rate: float = Field(description="Rollouts that answer without calling the tool.")
    tool_error_ratio: float | None = Field(description="Failed tool calls / tool calls.")
    tool_error_ratio_correct: float | None = Field(
        description="Failed tool calls / tool calls, over the correct rollouts only."
    )
    format_error_rate: float = Field(
        description="Rollouts without exactly one answer block (none, or several)."
    )
    mean_response_tokens: float


def _ratio(failed: int, calls: int) -> float | None:
    return failed / calls if calls else None


def summarize(samples: Sequence[ScoredSample], *, checkpoint: str, eval_dir: Path) -> HeldOutScores:
    """The table's figures over graded samples."""
    if not samples:
        raise ValueError(f"{eval_dir / GENERATIONS} holds no samples")
    generations = [s.generation for s in samples]
    calls = [g.tool_calls or 0 for g in generations]
    errors = [g.tool_errors or 0 for g in generations]
    correct = [i for i, s in enumerate(samples) if s.grade.correct]
    return HeldOutScores(
        checkpoint=checkpoint,
        eval_dir=str(eval_dir),
        problems=len({g.problem_id for g in generations}),
        rollouts=len(samples),
        accuracy=len(correct) / len(samples),
        tool_calls_per_rollout=sum(calls) / len(samples),
        no_tool_rate=calls.count(0) / len(samples),
        tool_error_ratio=_ratio(sum(errors), sum(calls)),
        tool_error_ratio_correct=_ratio(
            sum(errors[i] for i in correct), sum(calls[i] for i in correct)
        ),
        format_error_rate=sum(s.grade.answer_blocks != 1 for s in samples) / len(samples),
        mean_response_tokens=sum(g.response_tokens or 0 for g in generations) / len(samples),
    )


def graded_samples(eval_dir: Path, problems: ProblemSet, grader: Grader) -> list[ScoredSample]:
    """Every sample of an rstar2-eval run directory, graded against ``problems``."""
    path = eval_dir / GENERATIONS
    result = score_generations(
        read_generations(path), {problems.name: problems}, grader, origin=str(path)
    )
    return result.samples


def held_out_scores(
    eval_dir: Path, problems: ProblemSet, grader: Grader, *, checkpoint: str
) -> tuple[HeldOutScores, list[ScoredSample]]:
    samples = graded_samples(eval_dir, problems, grader)
    return summarize(samples, checkpoint=checkpoint, eval_dir=eval_dir), samples
