"""A scored rollout built by hand, for tests of what the trainer makes of rollouts."""

from __future__ import annotations

from rstar2_data import MathProblem
from rstar2_eval import Grade
from rstar2_scheduler import Trajectory, TrajectoryQuality
from rstar2_train.rl.rollouts import ScoredRollout


def scored_rollout(
    mask: list[int],
    *,
    versions: list[str | None] | None = None,
    response_ids: list[int] | None = None,
    prompt_ids: tuple[int, ...] = (1,),
    support: list[list[int]] | None = None,
) -> ScoredRollout:
    """A correct one-turn rollout of "1+1" whose response tokens have ``mask`` (ids 2 unless
    given, log-probs 0, no version unless given)."""
    problem = MathProblem(id="p", source="t", problem="1+1", answer="2", answer_kind="integer")
    trajectory = Trajectory(
        rollout_id="r",
        problem_id="p",
        engine="e",
        prompt_ids=list(prompt_ids),
        response_ids=response_ids or [2] * len(mask),
        loss_mask=mask,
        logprobs=[0.0] * len(mask),
        versions=versions or [None] * len(mask),
        support=support,
        turns=[],
        stop_reason="no_tool_call",
        quality=TrajectoryQuality(
            tool_calls=0,
            parse_errors=0,
            runtime_errors=0,
            timeouts=0,
            other_errors=0,
            answer_tags=1,
            turns=1,
            truncated=False,
        ),
        response_text="",
    )
    grade = Grade(correct=True, status="correct", answer="2")
    return ScoredRollout(0, problem, trajectory, grade, 1.0)
