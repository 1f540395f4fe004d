"""LiveCodeBench-style stdin/stdout problems from a local copy: each test case run with its input
on stdin under the per-test timeout, outputs compared as LiveCodeBench compares them, bad rows
named by line, and ``rstar2-eval run --benchmarks livecodebench`` on scripted answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rstar2_data.schemas import MathProblem
from rstar2_eval import InputError, load_benchmark
from rstar2_eval.cli import app
from rstar2_eval.code_grading import CodeGrader, CodeGradingConfig
from rstar2_eval.grading import Grade
from rstar2_eval.stdio_tasks import same_output
from rstar2_sandbox.local import LocalSandbox

CASES = [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}]
ROWS: list[dict[str, Any]] = [
    {
        "question_id": "add",
        "question_content": "Read two integers and print their sum.",
        # LiveCodeBench stores its test cases as JSON text.
        "public_test_cases": json.dumps(CASES),
        "private_test_cases": [
            {"input": "-4 10\n", "output": "6", "testtype": "stdin"},
            {"input": "1000000000000 1\n", "output": "1000000000001\n", "testtype": "stdin"},
        ],
        "difficulty": "easy",
    },
    {
        "question_id": "rev",
        "question_content": "Print the lines of the input in reverse order.",
        "public_test_cases": [{"input": "a\nb\nc\n", "output": "c\nb\na\n", "testtype": "stdin"}],
    },
]

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
REVERSE = "import sys\nprint(''.join(reversed(sys.stdin.readlines())), end='')\n"


def fenced(code: str) -> str:
    return f"\nDone.\n</reason>\n<answer>\n```python\n{code}```\n</answer>"


def write_rows(directory: Path, rows: Sequence[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "livecodebench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> list[MathProblem]:
    return load_benchmark("livecodebench", write_rows(tmp_path_factory.mktemp("lcb"), ROWS))


def grade(
    problems: Sequence[MathProblem], responses: Sequence[str], timeout_s: float = 10.0
) -> list[Grade]:
    async def run() -> list[Grade]:
        async with LocalSandbox() as sandbox:
            grader = CodeGrader(sandbox, CodeGradingConfig(timeout_s=timeout_s))
            return await grader.agrade_many(responses, [p.answer for p in problems])

    return asyncio.run(run())


def test_rows_become_problems_with_every_test_case(problems: list[MathProblem]) -> None:
    add, rev = problems
    assert (add.id, rev.id) == ("add", "rev")
    assert add.problem.startswith("Read two integers and print their sum.")
    assert "standard input" in add.problem
    assert [c["input"] for c in json.loads(add.answer)["cases"]] == [
        "2 3\n",
        "-4 10\n",
        "1000000000000 1\n",
    ]
    assert add.metadata == {"difficulty": "easy"}


def test_outputs_compare_line_by_line_up_to_trailing_whitespace() -> None:
    assert same_output("5  \n\n\n", "5")
    assert same_output("a\nb\n", "a \nb")
    assert not same_output("a b\n", "ab\n")
    assert not same_output("5\n6\n", "5\n")


def test_each_case_runs_with_its_input(problems: list[MathProblem]) -> None:
    add, rev = problems
    right, wrong, crash, slow, nothing, backwards = grade(
        [add, add, add, add, add, rev],
        [
            fenced(ADD),
            fenced("a, b = map(int, input().split())\nprint(a - b)\n"),
            fenced("print(int('x'))\n"),
            fenced("a, b = map(int, input().split())\nwhile a < 0:\n    pass\nprint(a + b)\n"),
            "\nI cannot.\n</reason>\n<answer></answer>",
            fenced(REVERSE),
        ],
        timeout_s=1.0,
    )
    assert (right.correct, right.method) == (True, "tests")
    assert backwards.correct
    assert (wrong.correct, wrong.detail) == (False, "test 1 of 3: wrong output")
    assert crash.detail is not None
    assert crash.detail.startswith("test 1 of 3: ValueError")
    # The first case passes; the second never ends and is cut at the per-test timeout.
    assert (slow.correct, slow.detail) == (False, "test 2 of 3: timed out after 1 s")
    assert (nothing.correct, nothing.status) == (False, "no_answer")


def test_bad_rows_and_missing_copies_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputError) as missing:
        load_benchmark("livecodebench", tmp_path)
    assert "`data_dir`" in str(missing.value)
    assert str(tmp_path / "livecodebench.jsonl") in str(missing.value)

    functional = {**ROWS[1], "question_id": "f"}
    functional["public_test_cases"] = [{"input": "[1]", "output": "1", "testtype": "functional"}]
    write_rows(tmp_path, [ROWS[0], functional])
    with pytest.raises(InputError) as bad:
        load_benchmark("livecodebench", tmp_path)
    assert (bad.value.line, bad.value.field) == (2, "public_test_cases")
    assert "'functional' tests are not supported" in str(bad.value)

    write_rows(tmp_path, [{**ROWS[0], "private_test_cases": "eJzLSM3JyQcABiwCFQ=="}])
    with pytest.raises(InputError) as packed:
        load_benchmark("livecodebench", tmp_path)
    assert (packed.value.line, packed.value.field) == (1, "private_test_cases")
    assert "decompressed" in str(packed.value)

    write_rows(tmp_path, [ROWS[1], ROWS[1]])
    with pytest.raises(InputError, match="duplicate question_id 'rev'") as twice:
        load_benchmark("livecodebench", tmp_path)
    assert twice.value.line == 2


@pytest.mark.slow
def test_run_livecodebench_on_a_stub_endpoint(tmp_path: Path) -> None:
    from harness import make_tokenizer
    from servers import stub_server

    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    data = write_rows(tmp_path / "data", ROWS)
    script = {"print their sum": fenced(ADD), "reverse order": fenced("print('no')\n")}
    (tmp_path / "script.json").write_text(json.dumps(script))
    out = tmp_path / "out"
    with stub_server(tokenizer, "--script", str(tmp_path / "script.json")) as url:
        result = CliRunner().invoke(
            app,
            [
                *("run", "--endpoint", url, "--tokenizer", str(tokenizer)),
                *("--benchmarks", "livecodebench", "--data-dir", str(data)),
                *("--samples", "1", "--temperature", "0", "--max-tokens", "500"),
                *("--max-turns", "1", "--out", str(out), "--no-progress"),
            ],
        )
    assert result.exit_code == 0, result.output
    (score,) = json.loads((out / "generations.report.json").read_text())["benchmarks"]
    assert (score["benchmark"], score["avg"], score["pass_at_k"]) == (
        "livecodebench",
        0.5,
        {"1": 0.5},
    )
