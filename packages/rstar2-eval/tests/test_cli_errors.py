"""Bad input to ``rstar2-eval score`` and ``run`` (more of ``run``'s options in
test_run_inputs.py): exit code 2, one line naming the file or option at fault, no traceback, and
an unreachable hub reported at once with how to pass a local copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_eval.cli import app

# Offline, as on a machine without the hub: the benchmark must fail at once, in one line.
runner = CliRunner(env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "80"})

GENERATION = {"benchmark": "aime24", "problem_id": "0", "sample_index": 0, "response": "x"}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "good.jsonl").write_text(json.dumps(GENERATION) + "\n")
    (tmp_path / "broken.jsonl").write_text(json.dumps(GENERATION) + '\n{"benchmark": \n')
    (tmp_path / "no-index.jsonl").write_text(json.dumps({**GENERATION, "sample_index": "a"}))
    return tmp_path


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["score", "{tmp}/missing.jsonl"], "missing.jsonl"),
        (["score", "{tmp}/broken.jsonl"], "broken.jsonl, line 2"),
        (["score", "{tmp}/no-index.jsonl"], "no-index.jsonl, line 1"),
        (["score", "{tmp}/good.jsonl", "--out", "{tmp}/a-file/out"], "a-file is not a directory"),
        (["score", "{tmp}/good.jsonl", "--samples-out", "{tmp}"], "is a directory"),
        (["score", "{tmp}/good.jsonl", "--k", "0"], "'--k'"),
        (
            ["score", "{tmp}/good.jsonl"],
            "could not reach dataset HuggingFaceH4/aime_2024 on the Hugging Face hub "
            "(HF_HUB_OFFLINE is set); pass a folder holding a local copy (aime24.jsonl) with "
            "--data-dir",
        ),
        (
            ["run", "--model", "m", "--benchmarks", "aime24", "--out", "{tmp}/a-file/run"],
            "a-file is not a directory",
        ),
        (
            ["run", "--model", "{tmp}/no-such-dir", "--benchmarks", "aime24", "--out", "{tmp}/r"],
            "--model: {tmp}/no-such-dir: no such checkpoint directory",
        ),
        (
            ["run", "--model", "{tmp}", "--benchmarks", "aime24", "--out", "{tmp}/r"],
            "not a Hugging Face checkpoint directory (no config.json)",
        ),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    arguments: list[str], message: str, inputs: Path
) -> None:
    result = runner.invoke(app, [a.format(tmp=inputs) for a in arguments])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert message.format(tmp=inputs) in line


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (
            ["score", "{tmp}/missing.jsonl"],
            "error: Invalid value for 'generations': file '{tmp}/missing.jsonl' does not exist. "
            "(see rstar2-eval score --help)",
        ),
        (
            ["score", "{tmp}/good.jsonl", "--k", "0"],
            "error: Invalid value for '--k': Input should be greater than or equal to 1 "
            "(see rstar2-eval score --help)",
        ),
    ],
)
def test_option_validation_is_the_same_one_error_line(
    arguments: list[str], line: str, inputs: Path
) -> None:
    """click's own checks of options and arguments, not only the commands' checks."""
    wide = CliRunner(env={"COLUMNS": "1000"})
    result = wide.invoke(app, [a.format(tmp=inputs) for a in arguments], prog_name="rstar2-eval")
    assert result.exit_code == 2
    assert result.output.splitlines() == [line.format(tmp=inputs)]
