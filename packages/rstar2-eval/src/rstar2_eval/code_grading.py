"""Grading programs by running their tests in rstar2-sandbox, beside the math grader.

``CodeGrader`` runs each response's program with its problem's tests: a HumanEval problem's
tests in one sandbox run, a stdin/stdout problem's cases one run each (stopping at the first
failure), each run bounded by ``CodeGradingConfig``. ``TaskGrader`` is the ``AsyncGrader`` that
``evaluate`` gets: code answers go to the sandbox, IFEval responses to its instruction checkers
(on a thread), every other answer to the math grader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from rstar2_eval.code_tasks import FunctionTests, extract_program
from rstar2_eval.grading import (
    AsyncGrader,
    Grade,
    Grader,
    GraderConfig,
    ProgressCallback,
    answer_formats,
)
from rstar2_eval.instruction_tasks import grade_instructions
from rstar2_eval.stdio_tasks import StdioTests, same_output
from rstar2_eval.verification import AnswerFormat
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.protocol import Sandbox

# Failures are summarized by the end of stderr: the exception line of a traceback.
_DETAIL_CHARS = 300
_MAX_OUTPUT_BYTES = 64 << 20  # RunRequest's own cap

CodeTests = Annotated[FunctionTests | StdioTests, Field(discriminator="kind")]
"""A code problem's ``answer``: the tests its program must pass."""
_CODE_TESTS: TypeAdapter[FunctionTests | StdioTests] = TypeAdapter(CodeTests)


class CodeGradingConfig(BaseModel):
    """Limits of one test run (a HumanEval program with all its tests, or one stdin case)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        default=10.0, gt=0, le=300, description="Wall-clock seconds of one test run."
    )
    memory_mb: int = Field(default=1024, gt=0, description="Address space of a test run.")
    output_limit_bytes: int = Field(
        default=64 << 10,
        gt=0,
        description="Cap on what a test run may print (a stdin case's cap also leaves room for "
        "twice its expected output).",
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


@dataclass(frozen=True)
class _Outcome:
    passed: bool
    detail: str | None = None
    ungradable: bool = False


class CodeGrader:
    """Runs each response's program against its tests in ``sandbox`` (not owned: never closed)."""

    def __init__(self, sandbox: Sandbox, config: CodeGradingConfig | None = None) -> None:
        self.sandbox = sandbox
        self.config = config if config is not None else CodeGradingConfig()

    async def _run(self, code: str, stdin: str = "", expected: str = "") -> RunResult:
        room = 2 * len(expected.encode()) + 1024
        return await self.sandbox.run(
            RunRequest(
                code=code,
                stdin=stdin,
                timeout_s=self.config.timeout_s,
                memory_mb=self.config.memory_mb,
                output_limit_bytes=min(
                    max(self.config.output_limit_bytes, room), _MAX_OUTPUT_BYTES
                ),
            )
        )

    def _judge(self, result: RunResult, where: str = "") -> _Outcome | None:
        """The outcome of a run that did not succeed; None when it did."""
        if result.ok:
            return None
        if result.status is RunStatus.INTERNAL_ERROR:
            reason = result.stderr.strip()[-_DETAIL_CHARS:]
            return _Outcome(False, f"{where}the sandbox failed: {reason}", ungradable=True)
        return _Outcome(False, where + _failure(result, self.config.timeout_s))

    async def _test(self, tests: FunctionTests | StdioTests, program: str) -> _Outcome:
        if isinstance(tests, FunctionTests):
            return self._judge(await self._run(tests.program(program))) or _Outcome(True)
        for number, case in enumerate(tests.cases, start=1):
            where = f"test {number} of {len(tests.cases)}: "
            result = await self._run(program, case.input, case.output)
            failed = self._judge(result, where)
            if failed is not None:
                return failed
            if not same_output(result.stdout, case.output):
                return _Outcome(False, where + "wrong output")
        return _Outcome(True)

    async def _grade(self, response: str, gold: str) -> Grade:
        tests = _CODE_TESTS.validate_json(gold)
        entry_point = tests.entry_point if isinstance(tests, FunctionTests) else None
        program = extract_program(response, entry_point)
        if program is None:
            return Grade(correct=False, status="no_answer", answer=None, method=None)
        outcome = await self._test(tests, program)
        status = (
            "correct" if outcome.passed else "ungradable" if outcome.ungradable else "incorrect"
        )
        return Grade(
            correct=outcome.passed,
            status=status,
            answer=program,
            method="tests",
            detail=outcome.detail,
        )

    async def agrade_many(self, responses: Sequence[str], golds: Sequence[str]) -> list[Grade]:
        """One grade per response; ``golds`` are a code problem's ``answer`` (its tests). A
        response without a program is ``no_answer``; a sandbox that fails to run one is
        ``ungradable``; otherwise the sample is correct exactly when every test passes, and a
        failure's reason (the exception, a timeout, a wrong output) is the grade's detail."""
        return list(
            await asyncio.gather(
                *(self._grade(r, g) for r, g in zip(responses, golds, strict=True))
            )
        )


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
        formats = answer_formats(answer_format, len(responses))
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


class SandboxedGrading:
    """What ``score_generations`` calls (``config`` and a blocking ``grade_many``) for a mix
    that holds code or IFEval answers: each call opens the sandbox named by ``sandbox``
    (``local``: embedded; else a service URL), grades through ``TaskGrader`` and closes it."""

    def __init__(
        self, grader: Grader, sandbox: str = "local", tests: CodeGradingConfig | None = None
    ) -> None:
        self.grader = grader
        self.sandbox = sandbox
        self.tests = tests if tests is not None else CodeGradingConfig()
        self.config: GraderConfig = grader.config

    async def _agrade(
        self, responses: Sequence[str], golds: Sequence[str], formats: list[AnswerFormat]
    ) -> list[Grade]:
        from rstar2_eval.backends import open_sandbox

        sandbox = await open_sandbox(self.sandbox)
        try:
            tasks = TaskGrader(self.grader, CodeGrader(sandbox, self.tests))
            return await tasks.agrade_many(responses, golds, answer_format=formats)
        finally:
            await sandbox.aclose()

    def grade_many(
        self,
        responses: Sequence[str],
        golds: Sequence[str],
        *,
        answer_format: AnswerFormat | Sequence[AnswerFormat] = "math",
        on_graded: ProgressCallback | None = None,
    ) -> list[Grade]:
        """One grade per response, in order; ``on_graded`` hears of all of them at the end."""
        formats = answer_formats(answer_format, len(responses))
        grades = asyncio.run(self._agrade(responses, golds, formats))
        if on_graded is not None:
            on_graded(list(range(len(grades))))
        return grades
