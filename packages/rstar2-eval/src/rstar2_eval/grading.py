"""Grading responses against gold answers: extraction, fast paths, then the worker pool.

``Grader`` is the long-lived object (the trainer keeps one for every RL step, so workers stay
warm); ``grade_many``/``agrade_many`` are one-shot conveniences that start and stop their own.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval.extraction import ExtractionSource, extract_answer
from rstar2_eval.pool import VerifierPool, VerifyResult
from rstar2_eval.verification import AnswerFormat, fast_verdict

GradeStatus = Literal["correct", "incorrect", "no_answer", "timeout", "ungradable"]
"""``no_answer``: nothing to extract; ``timeout``/``ungradable``: the verdict could not be had."""

GradeMethod = Literal["integer", "choice", "exact", "math_verify"]
"""Which path decided: in-process (integer, choice letter, identical text) or math-verify."""

ProgressCallback = Callable[[list[int]], None]
"""Called with the positions of the items that just got their grade."""


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
        default=None, description="<answer> blocks in the response (None: answer given directly)."
    )
    method: GradeMethod | None = Field(default=None, description="None when nothing was compared.")
    detail: str | None = Field(default=None, description="Why a grade is timeout or ungradable.")


def _default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


class GraderConfig(BaseModel):
    """How answers are extracted and verified."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    boxed_fallback: bool = Field(
        default=False,
        description="Fall back to the last \\boxed{} anywhere when the <answer> block has none.",
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


def _formats(
    answer_format: AnswerFormat | Sequence[AnswerFormat], count: int
) -> list[AnswerFormat]:
    if isinstance(answer_format, str):
        return [answer_format] * count
    formats = list(answer_format)
    if len(formats) != count:
        raise ValueError(f"got {len(formats)} answer formats for {count} items")
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
            grade = self._decide_in_process(answer, gold, fmt)
            if grade is None:
                assert answer is not None
                groups.setdefault((answer, gold), []).append(index)
            else:
                grades[index] = grade
                decided.append(index)
        if on_graded is not None and decided:
            on_graded(decided)
        if groups:
            items = list(groups)

            def land(key: int, result: VerifyResult) -> None:
                indices = groups[items[key]]
                grade = Grade(
                    correct=result.status == "correct",
                    status=result.status,
                    answer=items[key][0],
                    method="math_verify",
                    detail=result.detail,
                )
                for index in indices:
                    grades[index] = grade
                if on_graded is not None:
                    on_graded(indices)

            with self._lock:
                self._pool.verify(items, land)
        return [grade for grade in grades if grade is not None]

    def _decide_in_process(self, answer: str | None, gold: str, fmt: AnswerFormat) -> Grade | None:
        if answer is None:
            return Grade(correct=False, status="no_answer", answer=None)
        if len(answer) > self.config.max_answer_chars:
            return Grade(
                correct=False,
                status="ungradable",
                answer=answer,
                detail=f"answer has {len(answer)} characters, over {self.config.max_answer_chars}",
            )
        verdict = fast_verdict(answer, gold, fmt)
        if verdict is None:
            return None
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
        """``grade_many`` without blocking the event loop."""
        return await asyncio.to_thread(
            self.grade_many, responses, golds, answer_format=answer_format
        )

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
