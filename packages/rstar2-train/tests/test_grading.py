"""Grading in the RL stage: the in-process adapter, its warm-up, and what validation is given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, cast

from rstar2_eval import AnswerFormat, AsyncGrader, Grade, Grader, GraderConfig
from rstar2_eval.grading import ProgressCallback
from rstar2_sandbox.protocol import Sandbox
from rstar2_train.rl.grading import Grading, LocalGrading
from rstar2_train.rl.resources import rollout_resources

RESPONSES = ["<answer>\\boxed{42}</answer>", "<answer>\\boxed{41}</answer>", "no answer"]
GOLDS = ["42", "42", "42"]


class RecordingGrader(Grader):
    """A real ``Grader`` that records the threads it grades on and whether it was closed."""

    def __init__(self) -> None:
        super().__init__(GraderConfig(workers=1))
        self.threads: list[int] = []
        self.batches: list[int] = []
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
        self.batches.append(len(responses))
        return super().grade_many(responses, golds, answer_format=answer_format)

    def close(self) -> None:
        self.closed = True
        super().close()


def test_local_grading_grades_on_a_thread_and_closes_its_grader() -> None:
    grader = RecordingGrader()
    grading = LocalGrading(grader)

    async def run() -> tuple[list[Grade], int]:
        return await grading.agrade_many(RESPONSES, GOLDS), threading.get_ident()

    grades, loop_thread = asyncio.run(run())
    assert [g.status for g in grades] == ["correct", "incorrect", "no_answer"]
    assert grades == Grader(GraderConfig(workers=1)).grade_many(RESPONSES, GOLDS)
    assert len(grader.threads) == 1
    assert grader.threads[0] != loop_thread  # the event loop kept running rollouts
    # Validation hands the grading itself to rstar2-eval's evaluate: it is an AsyncGrader.
    assert isinstance(grading, AsyncGrader)
    assert grading.config is grader.config
    assert grading.metrics() == {}
    asyncio.run(grading.aclose())
    assert grader.closed


def test_rollouts_ending_together_are_graded_in_one_batch() -> None:
    grader = RecordingGrader()
    grading = LocalGrading(grader)
    answers = [r"\frac{1}{2}", "0.5", r"\frac{2}{4}", r"\frac{1}{3}"]

    async def run() -> list[list[Grade]]:
        # One call per rollout as it ends, as the rollout phase makes them.
        return await asyncio.gather(
            *(grading.agrade_many([f"<answer>\\boxed{{{a}}}</answer>"], ["0.5"]) for a in answers)
        )

    try:
        graded = asyncio.run(run())
    finally:
        asyncio.run(grading.aclose())
    assert [batch[0].correct for batch in graded] == [True, True, True, False]
    assert grader.batches == [4]  # one pool call with all four, not four calls one by one


def test_warm_up_starts_the_workers_before_any_answer_needs_them() -> None:
    grader = RecordingGrader()
    grading = LocalGrading(grader)
    assert not grader.pool_started
    asyncio.run(grading.warm_up())
    assert grader.pool_started
    assert grader.threads == []  # warming grades nothing
    asyncio.run(grading.aclose())


class _Recorder(Grading):
    def __init__(self, events: list[str]) -> None:
        self.config = GraderConfig(workers=1)
        self.events = events

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        raise AssertionError("not graded here")

    async def warm_up(self) -> None:
        self.events.append("warm-up started")
        await asyncio.sleep(0.05)
        self.events.append("warm")

    async def aclose(self) -> None:
        self.events.append("grading closed")


class _Engine:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def start(self) -> None:
        await asyncio.sleep(0.05)  # loading weights
        self.events.append("engine started")

    async def close(self) -> None:
        self.events.append("engine closed")


class _Sandbox:
    async def aclose(self) -> None:
        pass


def test_the_stage_warms_grading_while_the_engines_start() -> None:
    events: list[str] = []

    async def run() -> None:
        engines = cast(list[Any], [_Engine(events)])
        async with rollout_resources(engines, cast(Sandbox, _Sandbox()), _Recorder(events)):
            events.append("first step")

    asyncio.run(run())
    # The warm-up overlaps the engines' start, and both are done before the first step.
    assert events.index("warm-up started") < events.index("engine started")
    assert set(events[:3]) == {"warm-up started", "engine started", "warm"}
    assert events[3:] == ["first step", "engine closed", "grading closed"]


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
