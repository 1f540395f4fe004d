"""Deterministic in-process execution of the demo's own tool calls.

Only code that rstar2 generated itself runs here (the demo's solver programs and their planted
bugs), so no isolation is needed; model-written code goes through rstar2-sandbox instead.
The tool responses in the SFT transcripts are the real output of running each call.
"""

from __future__ import annotations

import contextlib
import io
import sys
import traceback

from pydantic import BaseModel, ConfigDict

_FILENAME = "<string>"


class Execution(BaseModel):
    """What one program printed, and the error it raised if it failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    stdout: str
    stderr: str


def _format_error(error: BaseException) -> str:
    """A traceback of the program's own frames only, as the Python interpreter prints it.

    Frames of this module are dropped so the text does not depend on where rstar2 is installed.
    """
    summary = traceback.TracebackException.from_exception(error)
    frames = [frame for frame in summary.stack if frame.filename == _FILENAME]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        lines.extend(f'  File "{_FILENAME}", line {f.lineno}, in {f.name}\n' for f in frames)
    lines.extend(summary.format_exception_only())
    return "".join(lines)


def run_python(code: str, stdin: str = "") -> Execution:
    """Run ``code`` with ``stdin`` as standard input; capture stdout and any error."""
    stdout = io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(stdout):
            exec(compile(code, _FILENAME, "exec"), {"__name__": "__main__"})
    except Exception as error:  # the program's own failure is the tool's result
        return Execution(ok=False, stdout=stdout.getvalue(), stderr=_format_error(error))
    finally:
        sys.stdin = saved_stdin
    return Execution(ok=True, stdout=stdout.getvalue(), stderr="")
