"""Standard-input programs (LiveCodeBench's stdin/stdout problems) from a local JSON Lines copy.

A row (``question_id``, ``question_content``, ``public_test_cases`` and optionally
``private_test_cases``: JSON lists, or JSON text of lists, of ``{"input", "output",
"testtype": "stdin"}``) becomes a ``MathProblem`` whose ``answer`` is a ``StdioTests``
document. The model's program runs once per test case with the case's input on stdin, each run
under the per-test timeout; a sample is correct when every run exits cleanly and prints the
expected output (compared line by line, trailing whitespace and trailing blank lines ignored, as
LiveCodeBench compares them). Functional (LeetCode-style) tests are not supported: such a row is
an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_data.schemas import MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.loading import RowError, collect_problems, read_jsonl_objects
from rstar2_eval.registry import BenchmarkSpec
from rstar2_sandbox.models import MAX_STDIN_BYTES

STDIO_INSTRUCTION = (
    "Read the input from standard input and write the answer to standard output. Give the "
    "whole program in a ```python code block in your answer."
)


class StdioCase(BaseModel):
    """One test: what the program reads and what it must print."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(max_length=MAX_STDIN_BYTES)
    output: str


class StdioTests(BaseModel):
    """A stdin/stdout problem's tests; a problem's ``answer`` holds it as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["stdio"] = "stdio"
    cases: list[StdioCase] = Field(min_length=1)


def same_output(printed: str, expected: str) -> bool:
    """Whether a program printed the expected output, line by line, ignoring trailing
    whitespace on each line and trailing blank lines."""
    return [line.rstrip() for line in printed.rstrip().splitlines()] == [
        line.rstrip() for line in expected.rstrip().splitlines()
    ]


def _cases(row: Mapping[str, Any], field: str) -> list[StdioCase]:
    raw = row.get(field)
    if raw is None:
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise RowError(
                "expected a JSON list of test cases (compressed test cases must be "
                "decompressed into the copy first)",
                field=field,
            ) from None
    if not isinstance(raw, list):
        raise RowError("expected a list of test cases", field=field)
    cases = []
    for case in raw:
        if not isinstance(case, dict):
            raise RowError("expected test cases as objects", field=field)
        if case.get("testtype", "stdin") != "stdin":
            raise RowError(
                f"{case.get('testtype')!r} tests are not supported; only stdin tests", field=field
            )
        try:
            cases.append(StdioCase(input=case.get("input"), output=case.get("output")))
        except ValidationError as error:
            raise RowError(f"a test case: {error.errors()[0]['msg']}", field=field) from None
    return cases


def stdio_problem(row: Mapping[str, Any], origin: str) -> MathProblem:
    """One row as a problem; RowError names the bad field."""
    for name in ("question_id", "question_content"):
        value = row.get(name)
        if not isinstance(value, str | int) or not str(value).strip():
            raise RowError("expected a non-empty string", field=name)
    cases = _cases(row, "public_test_cases") + _cases(row, "private_test_cases")
    if not cases:
        raise RowError("expected at least one test case", field="public_test_cases")
    used = {"question_id", "question_content", "public_test_cases", "private_test_cases"}
    return MathProblem(
        id=str(row["question_id"]),
        source=origin,
        problem=f"{str(row['question_content']).strip()}\n\n{STDIO_INSTRUCTION}",
        answer=StdioTests(cases=cases).model_dump_json(),
        answer_kind="expression",
        metadata={key: value for key, value in row.items() if key not in used},
    )


def load_stdio_benchmark(spec: BenchmarkSpec, data_dir: Path | None) -> list[MathProblem]:
    """The problems of ``data_dir/<spec.path>``; InputError names a bad row's line and field."""
    assert spec.path is not None
    path = (data_dir if data_dir is not None else Path()) / spec.path
    if not path.is_file():
        raise InputError(
            str(path),
            f"no local copy of {spec.name}; pass `data_dir`, a folder holding {spec.path} "
            "(JSON Lines of question_id, question_content, public_test_cases, "
            "private_test_cases)",
        )
    return collect_problems(
        spec.name,
        read_jsonl_objects(path),
        str(path),
        lambda _position, _line, row: stdio_problem(row, str(path)),
        id_field="question_id",
    )
