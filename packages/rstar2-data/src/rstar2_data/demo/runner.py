"""Deterministic in-process execution of the demo's own tool calls.

Only code that rstar2 generated itself runs here (the demo's solver programs and their planted
bugs), so no isolation is needed; model-written code goes through rstar2-sandbox instead.
The tool responses in the SFT transcripts are the real output of running each call.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import sys
import traceback

from pydantic import BaseModel, ConfigDict

# rstar2-sandbox's name for the program, so SFT traces show the tracebacks rollouts get.
_FILENAME = "main.py"


class Execution(BaseModel):
    """What one program printed, and the error it raised if it failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    stdout: str
    stderr: str


def _format_error(error: BaseException) -> str:
    """The traceback the sandbox shows: from the program's first frame, with its source lines.

    Frames of this module are dropped so the text does not depend on where rstar2 is installed.
    """
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != _FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def run_python(code: str, stdin: str = "") -> Execution:
    """Run ``code`` with ``stdin`` as standard input; capture stdout and any error."""
    stdout = io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    # Tracebacks quote the program's lines from here, as in the sandbox.
    saved_source = linecache.cache.get(_FILENAME)
    linecache.cache[_FILENAME] = (len(code), None, code.splitlines(True), _FILENAME)
    try:
        with contextlib.redirect_stdout(stdout):
            exec(compile(code, _FILENAME, "exec"), {"__name__": "__main__"})
    except Exception as error:  # the program's own failure is the tool's result
        return Execution(ok=False, stdout=stdout.getvalue(), stderr=_format_error(error))
    finally:
        sys.stdin = saved_stdin
        if saved_source is None:
            linecache.cache.pop(_FILENAME, None)
        else:
            linecache.cache[_FILENAME] = saved_source
    return Execution(ok=True, stdout=stdout.getvalue(), stderr="")
