"""A stand-in for the wrapper rStar2-Agent's Code Judge client puts around every tool call.

rStar2-Agent's client (``rstar2_agent/tools/code_judge_utils.py`` in microsoft/rStar) does not
send the model's code as it is: it base64-encodes it into a Python template that decodes it,
splits off a trailing expression with ``ast``, runs the rest with ``exec`` under redirected
stdout/stderr, prints the expression's repr and reports an error with its line.
``rstar2_agent_wrap`` builds a wrapper of the same shape and cost (the same imports, the same
steps), so benchmarks and tests can send what that client sends without it installed.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

_AGENT_SETUP = """
import os
import base64
import sys
import ast
import traceback
from typing import Optional, Any
import linecache
from types import CodeType
from contextlib import redirect_stdout, redirect_stderr
from io import StringIO


class ToolCodeError(Exception):
    def __init__(self, error: Exception, code: str, offset: int = 0) -> None:
        line = getattr(error, "lineno", None)
        if line is None:
            tb = error.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            line = tb.tb_lineno if tb is not None else -1
        text = f"{type(error).__name__}: {error}"
        lines = code.splitlines()
        if line != -1 and 0 < line + offset <= len(lines):
            line += offset
            text = f"{type(error).__name__} at line {line}: {error}\\n  {lines[line - 1]}"
        super().__init__(text)


class ToolSession:
    def __init__(self) -> None:
        self.scope = {"__name__": "__main__", "__file__": "<string>", "__builtins__": __builtins__}

    def split(self, code: str) -> tuple[str, Optional[str]]:
        try:
            tree = ast.parse(code)
        except SyntaxError as error:
            raise ToolCodeError(error, code)
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body[-1]
            lines = code.splitlines()
            end = last.end_lineno or last.lineno
            return "\\n".join(lines[: last.lineno - 1]), "\\n".join(lines[last.lineno - 1 : end])
        return code, None

    def run(self, code: str, replay: bool) -> None:
        sink_out = redirect_stdout(StringIO() if replay else sys.stdout)
        sink_err = redirect_stderr(StringIO() if replay else sys.stderr)
        try:
            body, last = self.split(code)
            if body:
                try:
                    compiled = compile(body, "<string>", "exec")
                    with sink_out, sink_err:
                        exec(compiled, self.scope)
                except Exception as error:
                    raise ToolCodeError(error, body)
            if last:
                try:
                    with sink_out, sink_err:
                        value = eval(compile(last, "<string>", "eval"), self.scope)
                    if value is not None and not replay:
                        print(repr(value))
                except Exception:
                    try:
                        with sink_out, sink_err:
                            exec(compile(last, "<string>", "exec"), self.scope)
                    except Exception as error:
                        offset = len(body.splitlines()) if body else 0
                        raise ToolCodeError(error, last, offset)
        except Exception as error:
            if replay:
                return
            if isinstance(error, ToolCodeError):
                print(str(error), file=sys.stderr)
            else:
                traceback.print_exc(file=sys.stderr)
            os._exit(1)


session = ToolSession()
"""
_AGENT_CALL = """
code_to_execute = base64.b64decode("{payload}".encode()).decode()
session.run(code_to_execute, replay={replay})
"""


def rstar2_agent_wrap(code: str, history: Sequence[str] = ()) -> str:
    """``code`` as rStar2-Agent's Code Judge client sends it (``history``: earlier cells to replay
    silently first, as its Jupyter-like tool does)."""
    calls = [(cell, True) for cell in history] + [(code, False)]
    return _AGENT_SETUP + "".join(
        _AGENT_CALL.format(payload=base64.b64encode(cell.encode()).decode(), replay=replay)
        for cell, replay in calls
    )
