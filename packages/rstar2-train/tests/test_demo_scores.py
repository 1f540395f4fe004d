"""The demo's held-out figures over graded samples (what the before/after table shows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar2_eval import Grade, ScoredSample
from rstar2_eval.generations import Generation
from rstar2_train.demo.scores import summarize


def _sample(problem: str, *, correct: bool, calls: int, errors: int, blocks: int) -> ScoredSample:
    generation = Generation(
        benchmark="heldout",
        problem_id=problem,
        sample_index=0,
        response="...",
        response_tokens=10 * (calls + 1),
        tool_calls=calls,
        tool_errors=errors,
        truncated=False,
    )
    grade = Grade(
        correct=correct,
        status="correct" if correct else "incorrect",
        answer="1",
        answer_blocks=blocks,
    )
    return ScoredSample(generation=generation, grade=grade)


def test_summary_counts_tool_use_errors_and_format_per_rollout() -> None:
    samples = [
        _sample("a", correct=True, calls=2, errors=1, blocks=1),  # failed call, then fixed
        _sample("b", correct=True, calls=1, errors=0, blocks=1),
        _sample("c", correct=False, calls=0, errors=0, blocks=1),  # answered without the tool
        _sample("d", correct=False, calls=1, errors=1, blocks=0),  # no <answer>
    ]
    scores = summarize(samples, checkpoint="ckpt", eval_dir=Path("eval"))
    assert scores.problems == scores.rollouts == 4
    assert scores.accuracy == 0.5
    assert scores.tool_calls_per_rollout == 1.0
    assert scores.no_tool_rate == 0.25
    assert scores.tool_error_ratio == 0.5  # 2 failed of 4 calls
    assert scores.tool_error_ratio_correct == pytest.approx(1 / 3)  # 1 failed of 3
    assert scores.format_error_rate == 0.25
    assert scores.mean_response_tokens == 20.0
    with pytest.raises(ValueError, match="no samples"):
        summarize([], checkpoint="ckpt", eval_dir=Path("eval"))
