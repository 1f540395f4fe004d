"""Results on stdout, logs and progress on stderr, and whole lines when the output is piped:
``rstar2-data build`` into a file as a user would redirect it, and the consoles behind it."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_data.cli_output import PIPED_WIDTH, command_console, log_handler

COMMAND = Path(sys.executable).parent / "rstar2-data"


def test_a_piped_build_has_results_on_stdout_and_whole_log_lines_on_stderr(
    tmp_path: Path,
) -> None:
    out = tmp_path / ("a folder whose name is long enough to pass eighty columns" * 2) / "heldout"
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = subprocess.run(
        [str(COMMAND), "build", "demo-heldout", "--out", str(out), "--verbose"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    stdout, stderr = result.stdout.splitlines(), result.stderr.splitlines()
    assert f"wrote 193 rows to {out / 'data.jsonl'}" in stdout
    assert any(line.startswith("rows: 193  sha256: ") for line in stdout)
    assert not any(" INFO " in line for line in stdout)
    # One record, one line: the time, the level and the whole message (rich's handler would
    # have cut it at 80 columns).
    (write,) = [line for line in stderr if "shuffle and write data.jsonl: 193 rows in" in line]
    assert " INFO shuffle and write" in write
    assert write.endswith(" rows/s)")
    assert "wrote 193 rows" not in result.stderr


def test_piped_consoles_do_not_wrap_and_log_one_line_per_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = command_console(stderr=True)  # pytest captures: not a terminal
    assert not console.is_terminal
    assert console.width == PIPED_WIDTH
    stream = io.StringIO()
    handler = log_handler(console)
    assert type(handler) is logging.StreamHandler
    handler.setStream(stream)
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "a %s message", ("long " * 40,), None
    )
    handler.handle(record)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(f" WARNING a {'long ' * 40} message")


def test_columns_still_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert command_console().width == 80
