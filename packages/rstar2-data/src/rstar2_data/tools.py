"""The Python tool of the agent protocol: one definition for SFT data, converters and rollouts.

The scheduler renders this schema into the system prompt, the converters emit calls to it and
the demo transcripts call it, so all three must take it from here.
"""

from __future__ import annotations

import copy
from typing import Any

PYTHON_TOOL_NAME = "execute_python_code_with_standard_io"
# The name the rStar2-Agent release used for the same tool; accepted when reading its data.
RELEASE_PYTHON_TOOL_NAME = "python_code_with_standard_io"

_PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PYTHON_TOOL_NAME,
        "description": (
            "Execute Python code with the given standard input and return what it prints "
            "to standard output (or the error it raised)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "A complete Python program; print results to stdout.",
                },
                "input": {
                    "type": "string",
                    "description": "Text passed to the program on standard input (may be empty).",
                },
            },
            "required": ["code", "input"],
        },
    },
}


def python_tool_schema() -> dict[str, Any]:
    """The JSON function schema of the Python tool (a fresh copy the caller may modify)."""
    return copy.deepcopy(_PYTHON_TOOL)


def python_tool_arguments(code: str, stdin: str = "") -> dict[str, str]:
    """The arguments object of one Python tool call."""
    return {"code": code, "input": stdin}
