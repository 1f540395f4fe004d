"""Grading in the RL stage: the in-process adapter, and the ``Grader`` validation is given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from rstar2_eval import AnswerFormat, Grade, Grader, GraderConfig
from rstar2_eval.grading import ProgressCallback
from rstar2_train.rl.grading import Grading, LocalGrading

RESPONSES = ["<answer>\\boxed{42}</answer>", "<answer>\\boxed{41}</answer>", "no answer"]
GOLDS = ["42", "42", "42"]


class RecordingGrader(Grader):
    """A real ``Grader`` that records the threads it grades on and whether it was closed."""

    def __init__(self) -> None:
        super().__init__(GraderConfig(workers=1))
        self.threads: list[int] = []
        self.closed = False

    def grade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
        on_graded: ProgressCallback | None = None,
    ) -> list[Grade]:
        self.threads.append(threading.get_ident())
        return super().grade_many(responses, golds, answer_format=answer_format)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_local_grading_grades_on_a_thread_and_closes_its_grader() -> None:
    grader = RecordingGrader()
    grading = LocalGrading(grader)

    async def run() -> tuple[list[Grade], int]:
        return await grading.grade(RESPONSES, GOLDS), threading.get_ident()

    grades, loop_thread = asyncio.run(run())
    assert [g.status for g in grades] == ["correct", "incorrect", "no_answer"]
    assert grades == Grader(GraderConfig(workers=1)).grade_many(RESPONSES, GOLDS)
    assert len(grader.threads) == 1
    assert grader.threads[0] != loop_thread  # the event loop kept running rollouts
    # Validation gets the grader itself, and no figures are added to the step's metrics.
    assert grading.as_grader() is grader
    assert grading.config is grader.config
    assert grading.metrics() == {}
    asyncio.run(grading.aclose())
    assert grader.closed


class LoopGrading(Grading):
    """Grades on the event loop, recording which thread ran each batch."""

    def __init__(self) -> None:
        self.config = GraderConfig(workers=1, boxed_fallback=True)
        self.grader = Grader(self.config)
        self.threads: list[int] = []

    async def grade(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        self.threads.append(threading.get_ident())
        return self.grader.grade_many(responses, golds, answer_format=answer_format)

    async def aclose(self) -> None:
        self.grader.close()


def test_validations_grader_runs_grade_on_the_loop_from_a_worker_thread() -> None:
    grading = LoopGrading()
    positions: list[list[int]] = []

    async def run() -> tuple[Grader, list[Grade], int]:
        grader = grading.as_grader()
        # What rstar2-eval's evaluate does with the grader it is given.
        grades = await asyncio.to_thread(
            grader.grade_many, RESPONSES, GOLDS, answer_format="math", on_graded=positions.append
        )
        return grader, grades, threading.get_ident()

    grader, grades, loop_thread = asyncio.run(run())
    assert [g.status for g in grades] == ["correct", "incorrect", "no_answer"]
    assert grading.threads == [loop_thread]
    assert positions == [[0, 1, 2]]
    assert grader.config is grading.config  # evaluate records boxed_fallback and timeout_s
    assert not grader.pool_started

    async def on_the_loop() -> None:
        grading.as_grader().grade_many(RESPONSES, GOLDS)

    with pytest.raises(RuntimeError, match="must run in a worker thread"):
        asyncio.run(on_the_loop())


def test_grader_actors_default_to_one_worker_per_cpu_unless_workers_is_set() -> None:
    from rstar2_train.config.schema import GraderPlacement
    from rstar2_train.placement.grading import actor_grader_config

    unset = GraderConfig(timeout_s=2.0)
    assert actor_grader_config(unset, GraderPlacement(cpus=8)).workers == 8
    assert actor_grader_config(unset, GraderPlacement(cpus=2.5)).workers == 2
    assert actor_grader_config(unset, GraderPlacement(cpus=0.5)).workers == 1
    assert actor_grader_config(unset, GraderPlacement(cpus=8)).timeout_s == 2.0
    # A config that names its workers keeps them, even from YAML-shaped input.
    explicit = GraderConfig.model_validate({"workers": 3})
    assert actor_grader_config(explicit, GraderPlacement(cpus=8)).workers == 3
