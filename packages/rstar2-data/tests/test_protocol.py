"""The agent protocol has one home: its text and types are defined in rstar2_data.protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2_data import ChatMessage, python_tool_schema
from rstar2_data.protocol import (
    ANSWER_OPEN,
    CHAT_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    PROTOCOL_TAGS,
    TOOL_CALL_OPEN,
    TOOLS_INSTRUCTIONS,
    TOOLS_PREAMBLE,
    FunctionCall,
    ToolCall,
    count_answer_tags,
    user_prompt,
)

PACKAGES = Path(__file__).resolve().parents[2]
HOME = PACKAGES / "rstar2-data" / "src" / "rstar2_data" / "protocol.py"


def _source_files() -> list[Path]:
    files = [
        path
        for path in PACKAGES.glob("*/src/**/*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    if len({path.relative_to(PACKAGES).parts[0] for path in files}) < 6:
        pytest.skip("not a monorepo checkout: the other packages' sources are not beside this one")
    return files


def test_no_tag_is_written_outside_the_protocol_module() -> None:
    found = []
    for path in _source_files():
        if path == HOME:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            found += [
                f"{path.relative_to(PACKAGES)}:{number}: {tag}"
                for tag in PROTOCOL_TAGS
                if tag in line
            ]
    assert not found, "protocol tags written outside rstar2_data/protocol.py:\n" + "\n".join(found)


def test_the_scan_sees_what_it_looks_for() -> None:
    # The home module itself holds every tag, so the scan above would find a copy elsewhere.
    text = HOME.read_text(encoding="utf-8")
    assert all(tag in text for tag in PROTOCOL_TAGS)
    assert HOME in _source_files()


def test_chat_template_is_rendered_from_the_protocol_text() -> None:
    # The template's text is set from the constants (as JSON string literals) before its body.
    for value in (DEFAULT_SYSTEM_PROMPT, TOOLS_PREAMBLE, TOOLS_INSTRUCTIONS):
        assert json.dumps(value) in CHAT_TEMPLATE
    body = CHAT_TEMPLATE.split("-%}\n{#-", 1)[1]
    assert not any(tag in body for tag in PROTOCOL_TAGS)


def test_user_prompt_asks_for_the_answer_block() -> None:
    prompt = user_prompt("What is 2 + 2?")
    assert prompt.startswith("What is 2 + 2?\n\n")
    assert ANSWER_OPEN in prompt
    assert prompt.endswith("\\boxed{}.")
    assert count_answer_tags(f"{ANSWER_OPEN}1 then {ANSWER_OPEN}2") == 2


def test_one_tool_call_serves_sft_messages_and_parsed_calls() -> None:
    parsed = ToolCall.of("execute_python_code_with_standard_io", {"code": "print(1)", "input": ""})
    assert (parsed.id, parsed.name, parsed.arguments["code"]) == (
        None,
        parsed.function.name,
        "print(1)",
    )
    message = ChatMessage(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="call_0", function=FunctionCall(name="f", arguments={"x": 1}))],
    )
    assert message.model_dump(exclude_none=True)["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    ]
    assert TOOL_CALL_OPEN in TOOLS_INSTRUCTIONS
    assert python_tool_schema()["function"]["name"] == parsed.name
