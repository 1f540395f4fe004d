"""IFEval: prompts from a local copy in IFEval's format, responses checked by IFEval's checkers
from lm-eval, strict and loose accuracies per prompt and per instruction, and ``rstar2-eval run
--benchmarks ifeval`` on scripted answers."""

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
from rstar2_eval.code_grading import CodeGrader, TaskGrader
from rstar2_eval.grading import Grade, Grader
from rstar2_eval.instruction_tasks import (
    checked_text,
    grade_instructions,
    instruction_scores,
)
from rstar2_sandbox.local import LocalSandbox

# Rows in IFEval's format. The hub's rows pad every kwargs object with all argument names set
# to null (row 3 does too); IFEval's evaluation drops them.
ROWS: list[dict[str, Any]] = [
    {
        "key": 1,
        "prompt": "Write a note about rstar in lowercase letters only, without commas.",
        "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
        "kwargs": [{}, {}],
    },
    {
        "key": 2,
        "prompt": "Say what rstar evaluates, wrapped in double quotation marks.",
        "instruction_id_list": ["startend:quotation"],
        "kwargs": [{}],
    },
    {
        "key": 3,
        "prompt": "In fewer than 10 words, mention the sandbox.",
        "instruction_id_list": ["keywords:existence", "length_constraints:number_words"],
        "kwargs": [
            {"keywords": ["sandbox"], "num_words": None, "relation": None},
            {"keywords": None, "num_words": 10, "relation": "less than"},
        ],
    },
]

FOLLOWED = [
    "<answer>a note about rstar: it trains and checks models</answer>",
    # Strictly not quoted (a preamble line first); loosely, without its first line, it is.
    '<answer>Sure:\n"rstar evaluates checkpoints"</answer>',
    "<reason>short</reason><answer>the sandbox runs code</answer>",
]
IGNORED = [
    "<answer>A note, about rstar</answer>",
    "<answer>rstar evaluates checkpoints</answer>",
    "<answer>the tool runs the code in a place that is very large and far away</answer>",
]


def write_rows(directory: Path, rows: Sequence[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ifeval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> list[MathProblem]:
    return load_benchmark("ifeval", write_rows(tmp_path_factory.mktemp("ifeval"), ROWS))


def test_rows_become_problems(problems: list[MathProblem]) -> None:
    assert [p.id for p in problems] == ["1", "2", "3"]
    assert problems[0].problem == ROWS[0]["prompt"]
    checks = json.loads(problems[2].answer)
    assert checks["kwargs"] == [
        {"keywords": ["sandbox"]},
        {"num_words": 10, "relation": "less than"},
    ]


def test_strict_and_loose_verdicts_per_instruction(problems: list[MathProblem]) -> None:
    golds = [p.answer for p in problems]
    followed = grade_instructions(FOLLOWED, golds)
    assert [g.correct for g in followed] == [True, False, True]
    assert [g.instructions.strict if g.instructions else None for g in followed] == [
        [True, True],
        [False],
        [True, True],
    ]
    assert followed[1].instructions is not None
    assert followed[1].instructions.loose == [True]
    ignored = grade_instructions(IGNORED, golds)
    assert [g.correct for g in ignored] == [False, False, False]
    assert [g.instructions.loose if g.instructions else None for g in ignored] == [
        [False, False],
        [False],
        [False, False],
    ]
    assert {g.method for g in followed + ignored} == {"instructions"}

    scores = instruction_scores(followed)
    assert scores is not None
    assert scores.prompt_strict == pytest.approx(2 / 3)
    assert scores.prompt_loose == 1.0
    assert scores.instruction_strict == pytest.approx(4 / 5)
    assert scores.instruction_loose == 1.0
    both = instruction_scores(followed + ignored)
    assert both is not None
    assert (both.prompt_strict, both.instruction_loose) == (pytest.approx(2 / 6), 0.5)


def test_the_answer_block_is_what_is_checked() -> None:
    assert checked_text("<reason>Thinking, with commas.</reason><answer> ok </answer>") == "ok"
    assert checked_text("no tags at all\n") == "no tags at all"


def test_a_missing_checker_resource_is_ungradable(
    problems: list[MathProblem], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rstar2_eval.instruction_tasks as tasks

    def missing(*args: object) -> None:
        raise LookupError("Resource punkt_tab not found.")

    monkeypatch.setattr(tasks, "check_instructions", missing)
    (graded,) = grade_instructions(["fine"], [problems[0].answer])
    assert (graded.correct, graded.status) == (False, "ungradable")
    assert graded.detail == "a checker's NLTK data is missing: Resource punkt_tab not found."
    assert instruction_scores([graded]) is None


def test_the_task_grader_sends_instructions_to_the_checkers(
    grader: Grader, problems: list[MathProblem]
) -> None:
    async def run() -> list[Grade]:
        async with LocalSandbox() as sandbox:
            return await TaskGrader(grader, CodeGrader(sandbox)).agrade_many(
                [FOLLOWED[0], r"<answer>\boxed{7}</answer>", IGNORED[0]],
                [problems[0].answer, "7", problems[0].answer],
                answer_format=["instructions", "math", "instructions"],
            )

    first, math, last = asyncio.run(run())
    assert (first.correct, first.method) == (True, "instructions")
    assert (math.correct, math.method) == (True, "integer")
    assert (last.correct, last.method) == (False, "instructions")


def test_bad_rows_and_missing_copies_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError) as missing:
        load_benchmark("ifeval", tmp_path)
    assert str(tmp_path / "ifeval.jsonl") in str(missing.value)
    assert "google/IFEval" in str(missing.value)

    unknown = {**ROWS[1], "key": 9, "instruction_id_list": ["startend:haiku"]}
    write_rows(tmp_path, [ROWS[0], unknown])
    with pytest.raises(InputError) as bad:
        load_benchmark("ifeval", tmp_path)
    assert (bad.value.line, bad.value.field) == (2, "instruction_id_list")
    assert "unknown instruction 'startend:haiku'" in str(bad.value)

    write_rows(tmp_path, [{**ROWS[2], "kwargs": [{}]}])
    with pytest.raises(InputError) as short:
        load_benchmark("ifeval", tmp_path)
    assert short.value.line == 1
    assert "1 kwargs for 2 instructions" in str(short.value)

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "lm_eval" else real(name, *args),
    )
    with pytest.raises(InputError, match=r"rstar2-eval\[ifeval\]"):
        load_benchmark("ifeval", write_rows(tmp_path, ROWS))


@pytest.mark.slow
def test_run_ifeval_on_a_stub_endpoint(tmp_path: Path) -> None:
    from harness import make_tokenizer
    from servers import stub_server

    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    data = write_rows(tmp_path / "data", ROWS)
    script = {
        row["prompt"]: f"\nDone.\n</reason>\n{answer}"
        for row, answer in zip(ROWS, FOLLOWED, strict=True)
    }
    (tmp_path / "script.json").write_text(json.dumps(script))
    out = tmp_path / "out"
    with stub_server(tokenizer, "--script", str(tmp_path / "script.json")) as url:
        result = CliRunner().invoke(
            app,
            [
                *("run", "--endpoint", url, "--tokenizer", str(tokenizer)),
                *("--benchmarks", "ifeval", "--data-dir", str(data), "--samples", "1"),
                *("--temperature", "0", "--max-tokens", "500", "--max-turns", "1"),
                *("--out", str(out), "--no-progress"),
            ],
        )
    assert result.exit_code == 0, result.output
    # The paper's generalization table, with the run's IFEval column filled and why the others
    # are not.
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert [cell.strip() for cell in rows["IFEval strict-prompt"].split("│")[2:5]] == [
        "83.4",
        "83.7",
        "66.7",
    ]
    assert "not run: add gpqa-diamond to --benchmarks" in rows["GPQA-Diamond"]
    assert "needs a judge model" in " ".join(result.output.split())
    (score,) = json.loads((out / "generations.report.json").read_text())["benchmarks"]
    assert score["avg"] == pytest.approx(2 / 3)
    assert score["instruction_following"] == {
        "prompt_strict": pytest.approx(2 / 3),
        "prompt_loose": 1.0,
        "instruction_strict": pytest.approx(4 / 5),
        "instruction_loose": 1.0,
        "checked": 3,
    }


def test_without_a_data_dir_the_prompts_come_from_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import rstar2_eval.instruction_tasks as tasks

    asked: list[tuple[str, str | None, str]] = []

    def hub(path: str, *, config: str | None, split: str, hint: str) -> Any:
        asked.append((path, config, split))
        assert "`data_dir`" in hint
        return iter(ROWS)

    monkeypatch.setattr(tasks, "iter_hub_dataset", hub)
    problems = load_benchmark("ifeval")
    assert asked == [("google/IFEval", None, "train")]
    assert [(p.id, p.source) for p in problems] == [
        ("1", "google/IFEval"),
        ("2", "google/IFEval"),
        ("3", "google/IFEval"),
    ]


def test_score_checks_a_generations_file(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "data", ROWS)
    generations = tmp_path / "generations.jsonl"
    generations.write_text(
        "".join(
            json.dumps(
                {"benchmark": "ifeval", "problem_id": str(row["key"]), "sample_index": 0}
                | {"response": response}
            )
            + "\n"
            for row, response in zip(ROWS, FOLLOWED, strict=True)
        )
    )
    result = CliRunner().invoke(app, ["score", str(generations), "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    (score,) = json.loads((tmp_path / "generations.report.json").read_text())["benchmarks"]
    assert score["instruction_following"]["prompt_strict"] == pytest.approx(2 / 3)
    assert score["instruction_following"]["instruction_loose"] == 1.0
