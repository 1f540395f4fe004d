"""Bad input to the rstar2-scheduler commands: exit code 2, one ``error:`` line naming the
option or file at fault, no traceback, and nothing simulated before the inputs are checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_scheduler.cli import app

runner = CliRunner(env={"COLUMNS": "80"})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["bench", "--engines", "0"], "'--engines': Input should be greater than or equal to 1"),
        (["bench", "--policy", "fastest"], "'--policy'"),
        (["bench", "--kv-headroom", "1.5"], "'--kv-headroom'"),
        (["bench", "--json", "{tmp}/a-file/report.json"], "a-file is not a directory"),
        (["bench", "--plot", "{tmp}"], "is a directory"),
        # Rollouts that no engine can hold fail before anything is simulated.
        (["bench", "--kv-tokens", "1000"], "'--budget' / '--kv-tokens': a rollout needs up to"),
        (["sweep", "--prompts", "1", "--budget", "700000"], "more than an engine holds (604207)"),
        (["plot", "{tmp}/missing.json"], "missing.json"),
        (["plot", "{tmp}/truncated.json"], "truncated.json is not a report of 'bench --json'"),
        (["plot", "{tmp}/other.json"], "other.json is not a report of 'bench --json': config"),
        (["plot", "{tmp}/other.json", "--out", "{tmp}/a-file/t.png"], "a-file is not a directory"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "truncated.json").write_text('{"config": {"engines": 8, ')
    (tmp_path / "other.json").write_text('{"rows": []}')
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in arguments])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # One line, option validation included (not click's Usage/Try/Error block).
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert line.startswith("error: ")
    assert message in line
