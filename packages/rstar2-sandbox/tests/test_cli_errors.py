"""Bad input to every rstar2-sandbox command: exit code 2, one line naming the option at fault,
no traceback, and no wait on a service that is not there."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_sandbox.cli import app

runner = CliRunner(env={"COLUMNS": "80"})

# Port 9 (discard) on the loopback: nothing listens there, so a connection is refused at once.
NOBODY = "127.0.0.1:9"


def error_line(output: str) -> str:
    assert "Traceback" not in output
    # One line, option validation included (not click's Usage/Try/Error block).
    (line,) = [line for line in output.splitlines() if line.strip()]
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["serve", "--port", "70000"], "'--port': Input should be less than or equal to 65535"),
        (["serve", "--port", "http"], "'--port': Input should be a valid integer"),
        (["serve", "--servers", "0"], "'--servers'"),
        (["serve", "--spool-dir", "{tmp}/missing"], "'--spool-dir'"),
        (["serve", "--redis", f"redis://{NOBODY}"], f"--redis: cannot reach redis://{NOBODY}"),
        (["serve", "--redis", "not-a-url"], "--redis:"),
        (["worker", "--redis", f"redis://{NOBODY}"], f"--redis: cannot reach redis://{NOBODY}"),
        (["bench", "--url", f"http://{NOBODY}"], f"--url: no service answers at http://{NOBODY}"),
        (["bench", "--url", "localhost"], "--url: expected http://HOST:PORT"),
        (["bench", "--snippets", "trivial,numpie"], "--snippets: unknown ['numpie']"),
        (["bench", "--batch-size", "0"], "'--batch-size'"),
        (["bench", "--json", "{tmp}/a-file/out.json"], "--json: cannot write into"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    arguments: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in arguments])
    assert result.exit_code == 2, result.output
    assert message in error_line(result.output)


def test_a_busy_port_fails_before_any_fork_server_starts() -> None:
    # A subprocess with a timeout: were the port not checked up front, serve would keep running.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = [sys.executable, "-c", "from rstar2_sandbox.cli import main; main()", "serve"]
        result = subprocess.run(
            [*serve, "--port", str(port), "--servers", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2, result.stderr
    line = error_line(result.stdout + result.stderr)
    assert f"--port: 127.0.0.1:{port} is already in use" in line
