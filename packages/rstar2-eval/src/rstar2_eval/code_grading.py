"""Grading programs by running their tests in rstar2-sandbox, beside the math grader.

``CodeGrader`` runs each response's program with its problem's tests (one sandbox run per
sample, bounded by ``CodeGradingConfig``); ``TaskGrader`` is the ``AsyncGrader`` that
``evaluate`` gets: code answers go to the sandbox, IFEval responses to its instruction checkers
(on a thread), every other answer to the math grader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval.code_tasks import FunctionTests, extract_program
from rstar2_eval.grading import AsyncGrader, Grade, GraderConfig
from rstar2_eval.instruction_tasks import grade_instructions
from rstar2_eval.verification import AnswerFormat
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.protocol import Sandbox

# Failures are summarized by the end of stderr: the exception line of a traceback.
_DETAIL_CHARS = 300


class CodeGradingConfig(BaseModel):
    """Limits of one test run (a program with all its problem's tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="Wall-clock seconds for the program and its tests."
    )
    memory_mb: int = Field(default=1024, gt=0, description="Address space of the test run.")
    output_limit_bytes: int = Field(
        default=64 << 10, gt=0, description="Cap on what a test run may print."
    )


def _failure(result: RunResult, timeout_s: float) -> str:
    if result.status is RunStatus.TIMEOUT:
        return f"timed out after {timeout_s:g} s"
    if result.status is RunStatus.MEMORY_EXCEEDED:
        return "exceeded its memory"
    if result.status is RunStatus.OUTPUT_LIMIT_EXCEEDED:
        return "printed past the output limit"
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"{result.status.value} (exit code {result.exit_code})"
    return last[-_DETAIL_CHARS:]


class CodeGrader:
    """Runs each response's program against its tests in ``sandbox`` (not owned: never closed)."""

    def __init__(self, sandbox: Sandbox, config: CodeGradingConfig | None = None) -> None:
        self.sandbox = sandbox
        self.config = config if config is not None else CodeGradingConfig()

    def _request(self, tests: FunctionTests, program: str) -> RunRequest:
        return RunRequest(
            code=tests.program(program),
            timeout_s=self.config.timeout_s,
            memory_mb=self.config.memory_mb,
            output_limit_bytes=self.config.output_limit_bytes,
        )

    async def agrade_many(self, responses: Sequence[str], golds: Sequence[str]) -> list[Grade]:
        """One grade per response; ``golds`` are ``FunctionTests`` documents (a problem's
        ``answer``). A response without a program is ``no_answer``; a sandbox that fails to
        run one is ``ungradable``; any other run is correct exactly when it exits cleanly."""
        tests = [FunctionTests.model_validate_json(gold) for gold in golds]
        programs = [
            extract_program(response, t.entry_point)
            for response, t in zip(responses, tests, strict=True)
        ]
        runnable = [i for i, program in enumerate(programs) if program is not None]
        results = await self.sandbox.run_many(
            [self._request(tests[i], programs[i] or "") for i in runnable]
        )
        grades = [
            Grade(correct=False, status="no_answer", answer=None, method=None) for _ in programs
        ]
        for i, result in zip(runnable, results, strict=True):
            if result.ok:
                grades[i] = Grade(
                    correct=True, status="correct", answer=programs[i], method="tests"
                )
            elif result.status is RunStatus.INTERNAL_ERROR:
                grades[i] = Grade(
                    correct=False,
                    status="ungradable",
                    answer=programs[i],
                    method="tests",
                    detail=f"the sandbox failed: {result.stderr.strip()[-_DETAIL_CHARS:]}",
                )
            else:
                grades[i] = Grade(
                    correct=False,
                    status="incorrect",
                    answer=programs[i],
                    method="tests",
                    detail=_failure(result, self.config.timeout_s),
                )
        return grades


class TaskGrader:
    """An ``AsyncGrader`` for any mix of benchmarks: ``code`` answers run their tests through
    ``code``, ``instructions`` answers go to IFEval's checkers, all others to ``math`` (whose
    config this grader reports)."""

    def __init__(self, math: AsyncGrader, code: CodeGrader) -> None:
        self.math = math
        self.code = code
        self.config: GraderConfig = math.config

    async def _grade(
        self, responses: list[str], golds: list[str], formats: list[AnswerFormat]
    ) -> list[Grade]:
        if not responses:
            return []
        if formats[0] == "code":
            return await self.code.agrade_many(responses, golds)
        if formats[0] == "instructions":
            return await asyncio.to_thread(grade_instructions, responses, golds)
        return await self.math.agrade_many(responses, golds, answer_format=formats)

    async def agrade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
    ) -> list[Grade]:
        """One grade per response, in order."""
        formats: list[AnswerFormat] = (
            [answer_format] * len(responses)
            if isinstance(answer_format, str)
            else list(answer_format)
        )
        routes: dict[str, list[int]] = {"code": [], "instructions": [], "math": []}
        for i, fmt in enumerate(formats):
            routes[fmt if fmt in ("code", "instructions") else "math"].append(i)
        graded = await asyncio.gather(
            *(
                self._grade(
                    [responses[i] for i in items],
                    [golds[i] for i in items],
                    [formats[i] for i in items],
                )
                for items in routes.values()
            )
        )
        grades: dict[int, Grade] = {}
        for items, group in zip(routes.values(), graded, strict=True):
            grades.update(zip(items, group, strict=True))
        return [grades[i] for i in range(len(responses))]
