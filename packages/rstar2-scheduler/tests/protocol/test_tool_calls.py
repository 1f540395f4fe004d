"""Tool-call parsing: the first call of a turn, validated against the tool's schema."""

from __future__ import annotations

import json
import re

import pytest

from rstar2_data import PYTHON_TOOL_NAME, python_tool_schema
from rstar2_scheduler.protocol import ToolCallParser


def call(arguments: object, name: str = PYTHON_TOOL_NAME) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def parser() -> ToolCallParser:
    return ToolCallParser([python_tool_schema()])


def test_no_tool_call(parser: ToolCallParser) -> None:
    parsed = parser.parse("<reason>thinking</reason><answer>\\boxed{3}</answer>")
    assert not parsed.attempted
    assert parsed.call is None
    assert parsed.error is None


def test_first_call_only(parser: ToolCallParser) -> None:
    text = "a " + call({"code": "print(1)", "input": ""}) + " b " + call({"code": "2", "input": ""})
    parsed = parser.parse(text + call({"code": "3", "input": "x"}))
    assert parsed.call is not None
    assert parsed.call.arguments == {"code": "print(1)", "input": ""}
    assert parsed.ignored_calls == 2


def test_string_encoded_arguments_are_accepted(parser: ToolCallParser) -> None:
    parsed = parser.parse(call(json.dumps({"code": "print(5)", "input": "7"})))
    assert parsed.call is not None
    assert parsed.call.arguments == {"code": "print(5)", "input": "7"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
        ("<tool_call>\n[1, 2]\n</tool_call>", "must be a JSON object"),
        (call({"code": "1", "input": ""}, name="shell"), "unknown tool 'shell'"),
        (call({"code": "print(1)"}), r"missing required arguments \['input'\]"),
        (call({"code": 5, "input": ""}), "argument 'code' must be a string"),
        (call({"code": "1", "input": "", "cwd": "/"}), r"unknown arguments \['cwd'\]"),
        (call("{oops"), "arguments are not valid JSON"),
        (call([1]), "arguments must be a JSON object"),
        ('<tool_call>\n{"name": "x"', "is not closed by </tool_call>"),
    ],
)
def test_parse_errors_name_the_problem(parser: ToolCallParser, text: str, message: str) -> None:
    parsed = parser.parse(text)
    assert parsed.attempted
    assert parsed.call is None
    assert parsed.error is not None
    assert parsed.error.startswith("Error: ")
    assert re.search(message, parsed.error), parsed.error


def test_bad_tool_schema_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"tools\[0\] must be an OpenAI function schema"):
        ToolCallParser([{"name": "x"}])
