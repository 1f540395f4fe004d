"""How an RL stage grades: an rstar2-eval ``Grader`` in this process, or grader actors on Ray.

Rollouts await ``Grading.grade`` without knowing which. Validation goes through rstar2-eval's
``evaluate``, which takes a ``Grader`` and calls its ``grade_many`` from a worker thread:
``Grading.as_grader`` gives one that grades through the same object.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence

from rstar2_eval import AnswerFormat, Grade, Grader, GraderConfig
from rstar2_eval.grading import ProgressCallback


class Grading(ABC):
    """Grades responses against gold answers for the rollout phase and validation."""

    config: GraderConfig

    @abstractmethod
    async def grade(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        """``Grader.grade_many`` without blocking the event loop."""

    def as_grader(self) -> Grader:
        """A ``Grader`` for rstar2-eval's ``evaluate``: its ``grade_many``, called from a worker
        thread, runs ``grade`` on the running event loop (call this on that loop)."""
        return _LoopGrader(self, asyncio.get_running_loop())

    def metrics(self) -> dict[str, float]:
        """Figures for the step's metrics (none by default)."""
        return {}

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the worker processes."""


class LocalGrading(Grading):
    """A ``Grader`` in this process, run on a thread."""

    def __init__(self, grader: Grader) -> None:
        self.grader = grader
        self.config = grader.config

    async def grade(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        return await self.grader.agrade_many(responses, golds, answer_format=answer_format)

    def as_grader(self) -> Grader:
        return self.grader

    async def aclose(self) -> None:
        self.grader.close()


class _LoopGrader(Grader):
    """A ``Grader`` whose ``grade_many`` is ``grading.grade`` on ``loop``.

    Only ``grade_many`` is routed: the inherited worker pool is never started by it.
    """

    def __init__(self, grading: Grading, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(grading.config)
        self._grading = grading
        self._loop = loop

    def grade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
        on_graded: ProgressCallback | None = None,
    ) -> list[Grade]:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # waiting on the loop from the loop itself never returns
            raise RuntimeError("grade_many of a loop-bound grader must run in a worker thread")
        future = asyncio.run_coroutine_threadsafe(
            self._grading.grade(responses, golds, answer_format=answer_format), self._loop
        )
        grades = future.result()
        if on_graded is not None:
            on_graded(list(range(len(grades))))
        return grades
