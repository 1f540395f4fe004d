"""Grading responses against gold answers: extraction, fast paths, then the worker pool.

``Grader`` is the long-lived object (the trainer keeps one for every RL step, so workers stay
warm); ``grade_many``/``agrade_many`` are one-shot conveniences that start and stop their own.
``AsyncGrader`` is what ``evaluate`` calls on a grader: a ``Grader`` is one, and so is anything
else that grades the same way (a trainer's grader actors on Ray).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval.extraction import ExtractionSource, extract_answer
from rstar2_eval.notation import is_prose, split_unit
from rstar2_eval.pool import VerifierPool, VerifyResult
from rstar2_eval.verification import AnswerFormat, fast_verdict

GradeStatus = Literal["correct", "incorrect", "no_answer", "timeout", "ungradable"]
"""``no_answer``: nothing to extract, or a box holding prose; ``timeout``/``ungradable``: the
verdict could not be had."""

GradeMethod = Literal[
    "integer", "choice", "exact", "units", "prose", "math_verify", "tests", "instructions"
]
"""Which path decided: in-process (integer, choice letter, identical text, different units, a
box holding prose; see ``rstar2_eval.notation``), math-verify, a program's tests run in the
sandbox (code benchmarks: ``rstar2_eval.code_grading``), or IFEval's instruction checkers
(``rstar2_eval.instruction_tasks``)."""

ProgressCallback = Callable[[list[int]], None]
"""Called with the positions of the items that just got their grade."""


class InstructionResults(BaseModel):
    """IFEval: whether each instruction of the prompt was followed, strictly and loosely."""

    model_config = ConfigDict(frozen=True)

    strict: list[bool]
    loose: list[bool]


class Grade(BaseModel):
    """The verdict on one response (or one extracted answer)."""

    model_config = ConfigDict(frozen=True)

    correct: bool
    status: GradeStatus
    answer: str | None = Field(description="The extracted answer that was graded.")
    source: ExtractionSource | None = Field(
        default=None, description="Extraction rule that found the answer (None: given directly)."
    )
    answer_blocks: int | None = Field(
        default=None, description="Answer blocks in the response (None: answer given directly)."
    )
    method: GradeMethod | None = Field(default=None, description="None when nothing was compared.")
    detail: str | None = Field(default=None, description="Why a grade is timeout or ungradable.")
    instructions: InstructionResults | None = Field(
        default=None, description="IFEval prompts: each instruction's verdicts."
    )


def _default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


class GraderConfig(BaseModel):
    """How answers are extracted and verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    boxed_fallback: bool = Field(
        default=False,
        description="Fall back to the last \\boxed{} anywhere when the answer block has none.",
    )
    timeout_s: float = Field(
        default=5.0, gt=0, description="Wall-clock limit per math-verify item."
    )
    kill_grace_s: float = Field(
        default=1.0, gt=0, description="Extra time before a worker stuck past the limit is killed."
    )
    workers: int = Field(default_factory=_default_workers, ge=1, description="Worker processes.")
    max_answer_chars: int = Field(
        default=2000, ge=1, description="Longer extracted answers are ungradable without parsing."
    )
    memory_limit_mb: int | None = Field(
        default=2048,
        ge=64,
        description="Address space a worker may add after start (None: no cap).",
    )


@runtime_checkable
class AsyncGrader(Protocol):
    """What ``evaluate`` needs of a grader: its settings (recorded in the report) and batches
    graded without blocking the event loop, as ``Grader.agrade_many`` does."""

    config: GraderConfig

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        """One grade per response, in order."""
        ...


@dataclass
class _Request:
    responses: list[str]
    golds: list[str]
    formats: list[AnswerFormat]
    future: asyncio.Future[list[Grade]]


@dataclass
class _Batcher:
    """The calls of one event loop waiting for the next batch."""

    pending: list[_Request] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


def answer_formats(
    answer_format: AnswerFormat | Sequence[AnswerFormat], count: int
) -> list[AnswerFormat]:
    """One answer format per item: ``answer_format`` for all, or the given one each."""
    formats = [answer_format] * count if isinstance(answer_format, str) else list(answer_format)
    if len(formats) != count:
        raise ValueError(f"got {len(formats)} answer formats for {count} items")
    return formats


def _formats(
    answer_format: AnswerFormat | Sequence[AnswerFormat], count: int
) -> list[AnswerFormat]:
    """``answer_formats``, refusing those the math Grader does not grade."""
    formats = answer_formats(answer_format, count)
    # Programs and instruction-following responses have no answer to compare: refuse them here
    # rather than grade their tests as a math gold.
    for other in ("code", "instructions"):
        if other in formats:
            raise ValueError(
                f"answer format {other!r} is graded by rstar2_eval.code_grading.TaskGrader "
                "(tests in a sandbox, IFEval's checkers), not by the math Grader"
            )
    return formats


class Grader:
    """Grades batches; owns the worker pool, which starts on first need and stays warm.

    Thread-safe: concurrent callers are served one batch at a time.
    """

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config if config is not None else GraderConfig()
        self._pool = VerifierPool(
            self.config.workers,
            self.config.timeout_s,
            kill_grace_s=self.config.kill_grace_s,
            memory_limit_mb=self.config.memory_limit_mb,
        )
        self._lock = threading.Lock()
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batcher] = (
            weakref.WeakKeyDictionary()
        )

    def warm_up(self, *, wait: bool = True) -> None:
        """Start the workers now instead of on the first answer that needs math-verify.

        With ``wait`` (the default), return once every worker has imported math-verify.
        """
        with self._lock:
            self._pool.start(wait=wait)

    def grade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
        on_graded: ProgressCallback | None = None,
    ) -> list[Grade]:
        """Grade full responses: extract each final answer, then verify it against its gold."""
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} golds")
        extractions = [
            extract_answer(response, boxed_fallback=self.config.boxed_fallback)
            for response in responses
        ]
        grades = self.grade_answers(
            [extraction.answer for extraction in extractions],
            golds,
            answer_format=answer_format,
            on_graded=on_graded,
        )
        return [
            grade.model_copy(
                update={"source": extraction.source, "answer_blocks": extraction.answer_blocks}
            )
            for grade, extraction in zip(grades, extractions, strict=True)
        ]

    def grade_answers(
        self,
        answers: Sequence[str | None],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
        on_graded: ProgressCallback | None = None,
    ) -> list[Grade]:
        """Grade already-extracted answers (None: the response had none)."""
        if len(answers) != len(golds):
            raise ValueError(f"got {len(answers)} answers but {len(golds)} golds")
        formats = _formats(answer_format, len(answers))
        grades: list[Grade | None] = [None] * len(answers)
        # Identical (answer, gold) pairs are common (k samples agreeing); verify each once.
        groups: dict[tuple[str, str], list[int]] = {}
        decided: list[int] = []
        for index, (answer, gold, fmt) in enumerate(zip(answers, golds, formats, strict=True)):
            outcome = self._decide_in_process(answer, gold, fmt)
            if isinstance(outcome, Grade):
                grades[index] = outcome
                decided.append(index)
            else:
                groups.setdefault(outcome, []).append(index)
        if on_graded is not None and decided:
            on_graded(decided)
        if groups:
            items = list(groups)

            def land(key: int, result: VerifyResult) -> None:
                indices = groups[items[key]]
                for index in indices:
                    grades[index] = Grade(
                        correct=result.status == "correct",
                        status=result.status,
                        answer=answers[index],
                        method="math_verify",
                        detail=result.detail,
                    )
                if on_graded is not None:
                    on_graded(indices)

            with self._lock:
                self._pool.verify(items, land)
        return [grade for grade in grades if grade is not None]

    def _decide_in_process(
        self, answer: str | None, gold: str, fmt: AnswerFormat
    ) -> Grade | tuple[str, str]:
        """The grade, when it needs no math-verify; else the ``(answer, gold)`` pair it gets."""
        if answer is None:
            return Grade(correct=False, status="no_answer", answer=None)
        if len(answer) > self.config.max_answer_chars:
            return Grade(
                correct=False,
                status="ungradable",
                answer=answer,
                detail=f"answer has {len(answer)} characters, over {self.config.max_answer_chars}",
            )
        compared, target = answer, gold
        verdict = fast_verdict(answer, gold, fmt)
        if verdict is None and fmt == "math":
            # Neither an integer pair nor the gold's text: read the notation (units, prose).
            if is_prose(answer):
                return Grade(
                    correct=False,
                    status="no_answer",
                    answer=answer,
                    method="prose",
                    detail="the box holds a sentence, not an answer",
                )
            compared, answer_unit = split_unit(answer)
            target, gold_unit = split_unit(gold)
            if answer_unit is not None and gold_unit is not None and answer_unit != gold_unit:
                return Grade(
                    correct=False,
                    status="incorrect",
                    answer=answer,
                    method="units",
                    detail=f"unit {answer_unit!r}, expected {gold_unit!r}",
                )
            verdict = fast_verdict(compared, target, fmt)
        if verdict is None:
            return compared, target
        return Grade(
            correct=verdict.correct,
            status="correct" if verdict.correct else "incorrect",
            answer=answer,
            method=verdict.method,
        )

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        """``grade_many`` without blocking the event loop.

        Calls that overlap are graded together: while one batch is with the workers, later
        calls queue, and everything queued goes as the next batch. A caller that grades each
        response as it arrives (a rollout the moment it ends) so keeps every worker busy,
        where one batch at a time would use one worker.
        """
        if len(responses) != len(golds):
            raise ValueError(f"got {len(responses)} responses but {len(golds)} golds")
        if not responses:
            return []
        loop = asyncio.get_running_loop()
        batcher = self._batchers.setdefault(loop, _Batcher())
        request = _Request(
            list(responses),
            list(golds),
            _formats(answer_format, len(responses)),
            loop.create_future(),
        )
        batcher.pending.append(request)
        if batcher.task is None or batcher.task.done():
            batcher.task = loop.create_task(self._drain(batcher), name="rstar2-eval-grader-batches")
        return await request.future

    async def _drain(self, batcher: _Batcher) -> None:
        """Grade everything queued, batch after batch, until nothing is left."""
        while batcher.pending:
            batch, batcher.pending = batcher.pending, []
            try:
                grades = await asyncio.to_thread(
                    self.grade_many,
                    [response for request in batch for response in request.responses],
                    [gold for request in batch for gold in request.golds],
                    answer_format=[fmt for request in batch for fmt in request.formats],
                )
            except asyncio.CancelledError:
                for request in [*batch, *batcher.pending]:
                    request.future.cancel()
                raise
            except Exception as error:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            start = 0
            for request in batch:
                end = start + len(request.responses)
                if not request.future.done():  # its caller may have been cancelled
                    request.future.set_result(grades[start:end])
                start = end

    @property
    def pool_started(self) -> bool:
        """Whether any worker process was ever started (the fast paths never start one)."""
        return self._pool.started

    @property
    def worker_replacements(self) -> int:
        """Workers killed (hung item) or lost (crash) and replaced so far."""
        return self._pool.replacements

    def close(self) -> None:
        """Stop the worker processes."""
        self._pool.close()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def grade_many(
    responses: Sequence[str],
    golds: Sequence[str],
    *,
    config: GraderConfig | None = None,
    answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
) -> list[Grade]:
    """Grade a batch with a temporary ``Grader`` (workers start and stop with the call)."""
    with Grader(config) as grader:
        return grader.grade_many(responses, golds, answer_format=answer_format)


async def agrade_many(
    responses: Sequence[str],
    golds: Sequence[str],
    *,
    config: GraderConfig | None = None,
    answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
) -> list[Grade]:
    """Async ``grade_many`` for callers that live in an event loop (the trainer)."""
    return await asyncio.to_thread(
        grade_many, responses, golds, config=config, answer_format=answer_format
    )
