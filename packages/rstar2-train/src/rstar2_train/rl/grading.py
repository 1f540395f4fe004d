"""How an RL stage grades: an rstar2-eval ``Grader`` in this process, or grader actors on Ray.

Rollouts await ``Grading.agrade_many`` without knowing which, and validation hands the same
object to rstar2-eval's ``evaluate``: a ``Grading`` is an ``rstar2_eval.AsyncGrader``. The
stage warms it (worker processes started, math-verify imported and run once) while the engines
start, so the first answer that needs math-verify in the first step does not wait for a cold
worker.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence

from rstar2_eval import AnswerFormat, Grade, Grader, GraderConfig


class Grading(ABC):
    """Grades responses against gold answers for the rollout phase and validation."""

    config: GraderConfig

    @abstractmethod
    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        """``Grader.grade_many`` without blocking the event loop."""

    @abstractmethod
    async def warm_up(self) -> None:
        """Return once the math-verify workers have started and verified one answer."""

    def metrics(self) -> dict[str, float]:
        """Figures for the step's metrics (none by default)."""
        return {}

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the worker processes."""


class LocalGrading(Grading):
    """A ``Grader`` in this process; overlapping calls (rollouts ending while an earlier batch
    is verified) are graded together, so every worker stays busy."""

    def __init__(self, grader: Grader) -> None:
        self.grader = grader
        self.config = grader.config

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        return await self.grader.agrade_many(responses, golds, answer_format=answer_format)

    async def warm_up(self) -> None:
        await asyncio.to_thread(self.grader.warm_up)

    async def aclose(self) -> None:
        self.grader.close()
