"""Grader actors: rstar2-eval ``Grader``s (each with its math-verify worker pool) in Ray actors,
and the driver's ``RayGrading``, which sends each batch to the least busy live one.

A batch whose actor dies is graded again by another; when none is left, grading fails with
``GradersLostError`` instead of waiting on a dead actor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any

from rstar2_eval import AnswerFormat, Grade, Grader, GraderConfig
from rstar2_train.config.schema import GraderPlacement
from rstar2_train.rl.grading import Grading

logger = logging.getLogger(__name__)


class GradersLostError(RuntimeError):
    """Every grader actor died: nothing is left to grade on."""


def actor_grader_config(grader: GraderConfig, placement: GraderPlacement) -> GraderConfig:
    """``rl.grader`` for one actor: ``workers``, unless the config sets it, is the actor's CPUs.

    ``GraderConfig.workers`` otherwise defaults to the CPUs of the machine that loaded the
    config (the head node), which would start that many processes on each actor's few CPUs.
    """
    if "workers" in grader.model_fields_set:
        return grader
    return grader.model_copy(update={"workers": max(1, math.floor(placement.cpus))})


class GraderHost:
    """The body of a grader actor: one ``Grader``, called from the driver's ``RayGrading``."""

    def __init__(self, config: GraderConfig) -> None:
        self.grader = Grader(config)
        self.graded = 0

    def warm_up(self) -> None:
        """Start the worker processes and wait until each has verified one answer."""
        self.grader.warm_up()

    def grade_many(
        self,
        responses: list[str],
        golds: list[str],
        answer_format: AnswerFormat | list[AnswerFormat],
    ) -> list[Grade]:
        grades = self.grader.grade_many(responses, golds, answer_format=answer_format)
        self.graded += len(grades)
        return grades

    def graded_items(self) -> int:
        """Responses graded by this actor so far."""
        return self.graded

    def close(self) -> None:
        self.grader.close()


class RayGrading(Grading):
    """``Grading`` over grader actors (all built with ``config``)."""

    def __init__(self, handles: Sequence[Any], names: Sequence[str], config: GraderConfig) -> None:
        self.handles = list(handles)
        self.names = list(names)
        self.config = config
        self.dead: dict[int, str] = {}
        self._busy = [0] * len(self.handles)
        self._turn = itertools.count()

    def _alive(self) -> list[int]:
        return [i for i in range(len(self.handles)) if i not in self.dead]

    def _pick(self) -> int:
        alive = self._alive()
        if not alive:
            causes = "; ".join(f"{self.names[i]}: {why}" for i, why in sorted(self.dead.items()))
            raise GradersLostError(
                f"all {len(self.handles)} grader actors died ({causes}); the step cannot be "
                "graded: resume the stage from its last checkpoint"
            )
        least = min(self._busy[i] for i in alive)
        idle = [i for i in alive if self._busy[i] == least]
        return idle[next(self._turn) % len(idle)]  # ties in turn, so every actor gets work

    def _mark_dead(self, index: int, error: BaseException) -> None:
        if index not in self.dead:
            self.dead[index] = f"{type(error).__name__}: {error}"
            logger.warning(
                "grader actor %s died (%s); its batches go to the live graders %s",
                self.names[index],
                str(error).splitlines()[0] if str(error) else type(error).__name__,
                [self.names[i] for i in self._alive()],
            )

    async def warm_up(self) -> None:
        """Warm every live actor's workers at once; an actor that dies meanwhile is marked."""
        from ray.exceptions import RayActorError

        alive = self._alive()
        outcomes = await asyncio.gather(
            *(self.handles[i].warm_up.remote() for i in alive), return_exceptions=True
        )
        for index, outcome in zip(alive, outcomes, strict=True):
            if isinstance(outcome, RayActorError):
                self._mark_dead(index, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        from ray.exceptions import RayActorError

        formats = answer_format if isinstance(answer_format, str) else list(answer_format)
        while True:
            index = self._pick()
            self._busy[index] += 1
            try:
                grades: list[Grade] = await self.handles[index].grade_many.remote(
                    list(responses), list(golds), formats
                )
                return grades
            except RayActorError as error:
                self._mark_dead(index, error)
            finally:
                self._busy[index] -= 1

    def metrics(self) -> dict[str, float]:
        return {"grader/actors_lost": float(len(self.dead))}

    async def aclose(self) -> None:
        """Stop the live actors' worker pools (the actors themselves go with the stage)."""
        alive = self._alive()
        outcomes = await asyncio.gather(
            *(self.handles[i].close.remote() for i in alive), return_exceptions=True
        )
        for index, outcome in zip(alive, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("closing grader actor %s: %s", self.names[index], outcome)
