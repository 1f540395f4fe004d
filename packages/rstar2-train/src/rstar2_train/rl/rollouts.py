"""One rollout phase: 2G rollouts per prompt on the engines, each graded the moment it ends.

Every rollout's sampling seed is derived from (stage seed, step, prompt, sample), so a resumed
step generates exactly what the interrupted one would have. The reward is answer-only: 1 when
the model's own text (tool responses excluded, so a program cannot print the answer for it)
holds a ``\\boxed{}`` answer in its answer block that verifies against the label, else 0; a rollout
that ran out of turns or budget gets 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rstar2_data import MathProblem
from rstar2_eval import Grade
from rstar2_scheduler import (
    JobResult,
    PhaseMetrics,
    RolloutJob,
    RolloutRunner,
    RolloutScheduler,
    Trajectory,
)
from rstar2_scheduler.engine import Engine
from rstar2_train.rl.grading import Grading

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoredRollout:
    """A finished rollout with its grade and reward."""

    prompt: int
    """Index of its problem in the step's prompts (its GRPO group)."""
    problem: MathProblem
    trajectory: Trajectory
    grade: Grade
    reward: float


@dataclass(frozen=True)
class RolloutPhaseResult:
    rollouts: list[ScoredRollout]
    """Rollouts that reached the model's end (grouped by prompt, in submission order)."""
    failed: int
    """Rollouts lost to engine or infrastructure failures (excluded from training)."""
    metrics: PhaseMetrics
    rollout_s: float
    grading_tail_s: float
    """Grading time left after the last rollout finished (grading overlaps generation)."""


def rollout_seed(seed: int, step: int, prompt: int, sample: int) -> int:
    """A sampling seed that depends only on where the rollout sits in the stage."""
    digest = hashlib.blake2b(f"{seed}:{step}:{prompt}:{sample}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 2


def model_text(trajectory: Trajectory) -> str:
    """What the model wrote in its turns, without the tool responses shown to it."""
    return "".join(turn.text for turn in trajectory.turns)


async def collect(
    problems: Sequence[MathProblem],
    *,
    step: int,
    seed: int,
    samples: int,
    runner: RolloutRunner,
    scheduler: RolloutScheduler,
    grader: Grading,
    on_progress: Callable[[int, int], None] | None = None,
    key: str = "rollout",
) -> RolloutPhaseResult:
    """``samples`` rollouts of every problem, placed by ``scheduler``, graded as they finish."""
    total = len(problems) * samples
    grades: dict[int, asyncio.Task[Grade]] = {}
    done = 0

    def job(prompt: int, sample: int) -> RolloutJob[Trajectory]:
        problem = problems[prompt]

        async def run(engine: Engine) -> Trajectory:
            return await runner.rollout(
                problem,
                engine,
                rollout_id=f"{key}-s{step}-p{prompt}-r{sample}",
                seed=rollout_seed(seed, step, prompt, sample),
            )

        return RolloutJob(run=run, kv_tokens=runner.max_tokens(problem), key=f"p{prompt}-r{sample}")

    async def grade(trajectory: Trajectory, gold: str) -> Grade:
        graded = await grader.agrade_many([model_text(trajectory)], [gold])
        return graded[0]

    def finished(result: JobResult[Trajectory]) -> None:
        nonlocal done
        done += 1
        trajectory = result.value
        if trajectory is not None and trajectory.stop_reason != "engine_error":
            gold = problems[result.index // samples].answer
            grades[result.index] = asyncio.create_task(grade(trajectory, gold))
        if on_progress is not None:
            on_progress(done, total)

    started = time.perf_counter()
    jobs = [job(prompt, sample) for prompt in range(len(problems)) for sample in range(samples)]
    phase = await scheduler.run(jobs, on_result=finished)
    generated = time.perf_counter()
    rollouts: list[ScoredRollout] = []
    for result in phase.results:
        task = grades.get(result.index)
        if task is None:
            continue
        graded = await task
        trajectory = result.value
        assert isinstance(trajectory, Trajectory)
        prompt = result.index // samples
        reward = 1.0 if graded.correct and not trajectory.truncated else 0.0
        rollouts.append(ScoredRollout(prompt, problems[prompt], trajectory, graded, reward))
    failed = total - len(rollouts)
    if failed:
        logger.warning("step %d: %d of %d rollouts failed and are left out", step, failed, total)
    return RolloutPhaseResult(
        rollouts=rollouts,
        failed=failed,
        metrics=phase.metrics,
        rollout_s=generated - started,
        grading_tail_s=time.perf_counter() - generated,
    )
