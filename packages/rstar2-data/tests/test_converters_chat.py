"""Each SFT converter on hand-written rows following its dataset's public schema."""

import json
from typing import Any

import pytest

from rstar2_data import PYTHON_TOOL_NAME, ChatExample
from rstar2_data.converters import RowError, get_converter


def convert(name: str, row: dict[str, Any]) -> ChatExample:
    example = get_converter(name).convert(row, source="src", index=3)
    assert isinstance(example, ChatExample)
    return example


def calls(example: ChatExample) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c.function.name, c.function.arguments)
        for m in example.messages
        for c in m.tool_calls or []
    ]


def test_tulu_messages() -> None:
    row = {
        "id": "personas_IF_1",
        "prompt": "Write a haiku",
        "messages": [
            {"role": "user", "content": "Write a haiku about rain, all lowercase."},
            {"role": "assistant", "content": "soft rain on the roof"},
        ],
        "constraints": ["all lowercase"],
    }
    example = convert("messages", row)
    assert example.id == "personas_IF_1"
    assert [(m.role, m.content) for m in example.messages] == [
        ("user", "Write a haiku about rain, all lowercase."),
        ("assistant", "soft rain on the roof"),
    ]
    with pytest.raises(RowError, match="no assistant turn"):
        convert("messages", {"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(RowError, match="unknown role"):
        convert("messages", {"messages": [{"role": "robot", "content": "hi"}]})


def test_nemotron_keeps_reasoning_off_only() -> None:
    row = {
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
        ],
        "output": "Paris.",
        "reasoning": "off",
        "category": "chat",
        "system_prompt": "detailed thinking off",
    }
    example = convert("nemotron_chat", row)
    assert [m.role for m in example.messages] == ["system", "user", "assistant"]
    assert example.messages[-1].content == "Paris."
    assert example.id == "src-3"
    with pytest.raises(RowError, match="reasoning is not off"):
        convert("nemotron_chat", {**row, "reasoning": "on"})


def test_xlam_parallel_calls_and_flat_tool_specs() -> None:
    tools = [
        {
            "name": "live_giveaways_by_type",
            "description": "Retrieve live giveaways.",
            "parameters": {
                "type": {"description": "Type of giveaways.", "type": "str", "default": "game"},
                "limit": {"description": "How many.", "type": "int"},
            },
        }
    ]
    answers = [
        {"name": "live_giveaways_by_type", "arguments": {"type": "beta"}},
        {"name": "live_giveaways_by_type", "arguments": {"type": "game", "limit": 3}},
    ]
    row = {
        "id": 7,
        "query": "Where can I find beta and game giveaways?",
        "tools": json.dumps(tools),
        "answers": json.dumps(answers),
    }
    example = convert("xlam", row)
    assert example.id == "7"
    assert [m.role for m in example.messages] == ["user", "assistant"]
    assert calls(example) == [(a["name"], a["arguments"]) for a in answers]
    (tool,) = example.tools
    parameters = tool["function"]["parameters"]
    assert parameters["properties"]["limit"]["type"] == "integer"
    assert parameters["required"] == ["limit"]
    with pytest.raises(RowError, match="answers is not valid JSON"):
        convert("xlam", {**row, "answers": "[{"})


def test_apigen_mt_multi_turn_with_observations() -> None:
    tools = [
        {
            "name": "get_order",
            "description": "Find an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        }
    ]
    row = {
        "system": "You are a retail agent. Policy: verify the user first.",
        "tools": json.dumps(tools),
        "conversations": [
            {"from": "human", "value": "Where is order #W1?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_order", "arguments": {"order_id": "#W1"}}),
            },
            {"from": "observation", "value": '{"status": "shipped"}'},
            {"from": "gpt", "value": "It has shipped."},
        ],
    }
    example = convert("apigen_mt", row)
    assert [m.role for m in example.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert calls(example) == [("get_order", {"order_id": "#W1"})]
    call_message, tool_message = example.messages[2], example.messages[3]
    assert tool_message.tool_call_id == (call_message.tool_calls or [])[0].id
    assert example.tools[0]["function"]["parameters"]["required"] == ["order_id"]
    bad = {**row, "conversations": [row["conversations"][0], row["conversations"][2]]}
    with pytest.raises(RowError, match="tool response without a preceding call"):
        convert("apigen_mt", bad)


TOOLACE_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions.\nHere is a list of functions in JSON format that you can invoke:\n"
    '[{"name": "Market Trends API", "description": "Get market trends.", "parameters": '
    '{"type": "dict", "properties": {"trend_type": {"description": "Trend kind", "type": '
    '"string"}, "country": {"type": "string"}}, "required": ["trend_type"]}, "required": null}]'
    ".\nShould you decide to return the function call(s), put them in the format of "
    "[func1(params_name=params_value, params_name2=params_value2...), func2(params)]\n"
)


def test_toolace_bracket_calls() -> None:
    row = {
        "system": TOOLACE_SYSTEM,
        "conversations": [
            {"from": "user", "value": "Show me gainers in the US and losers in Japan."},
            {"from": "assistant", "value": '[Market Trends API(trend_type="MARKET_INDEXES")]'},
            {
                "from": "assistant",
                "value": "[get(trend_type='gainers', country='us', top=true, "
                "ids=[1, 2], opts={'a': null})]",
            },
            {"from": "tool", "value": '[{"name": "get", "results": {"ok": true}}]'},
            {"from": "assistant", "value": "Here are the gainers."},
        ],
    }
    # Names with spaces are not Python: such a turn stays plain assistant text.
    example = convert("toolace", row)
    assert calls(example) == [
        (
            "get",
            {
                "trend_type": "gainers",
                "country": "us",
                "top": True,
                "ids": [1, 2],
                "opts": {"a": None},
            },
        )
    ]
    assert example.messages[1].content == '[Market Trends API(trend_type="MARKET_INDEXES")]'
    assert example.tools[0]["function"]["name"] == "Market Trends API"
    assert example.tools[0]["function"]["parameters"]["type"] == "object"
    assert example.messages[-2].role == "tool"
    with pytest.raises(RowError, match="no tool list"):
        convert("toolace", {**row, "system": "no tools here"})


def test_glaive_markers_and_quoted_arguments() -> None:
    row = {
        "system": "SYSTEM: You are a helpful assistant with access to the following functions. "
        'Use them if required -\n{\n    "name": "get_news",\n    "description": "Headlines",\n'
        '    "parameters": {\n        "type": "object",\n        "properties": {\n'
        '            "country": {"type": "string"}\n        },\n        "required": ["country"]'
        "\n    }\n}\n",
        "chat": 'USER: Any news from the US?\n\n\nASSISTANT: <functioncall> {"name": '
        '"get_news", "arguments": \'{"country": "United States"}\'} <|endoftext|>\n\n\n'
        'FUNCTION RESPONSE: {"headlines": ["A", "B"]}\n\n\nASSISTANT: Headlines: A, B. '
        "<|endoftext|>\n\n\nUSER: Thanks!\n\n\nASSISTANT: You're welcome! <|endoftext|>\n",
    }
    example = convert("glaive", row)
    assert [m.role for m in example.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert calls(example) == [("get_news", {"country": "United States"})]
    assert example.messages[2].content == '{"headlines": ["A", "B"]}'
    assert example.messages[-1].content == "You're welcome!"
    assert example.tools[0]["function"]["name"] == "get_news"
    no_tools = {
        **row,
        "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
        "chat": "USER: Hi\n\n\nASSISTANT: Hello <|endoftext|>",
    }
    assert convert("glaive", no_tools).tools == []
    broken = {**row, "chat": "USER: x\n\n\nASSISTANT: <functioncall> {oops} <|endoftext|>"}
    with pytest.raises(RowError, match="unparsable <functioncall>"):
        convert("glaive", broken)


def test_magicoder_becomes_a_python_tool_call() -> None:
    row = {
        "problem": "Write a program that prints the sum of a list.",
        "solution": "Sum the list with the builtin:\n```python\nprint(sum([1, 2, 3]))\n```\nDone.",
        "lang": "python",
        "seed": "...",
    }
    example = convert("magicoder_oss", row)
    assert example.messages[1].content == "Sum the list with the builtin:"
    assert calls(example) == [(PYTHON_TOOL_NAME, {"code": "print(sum([1, 2, 3]))\n", "input": ""})]
    assert example.tools[0]["function"]["name"] == PYTHON_TOOL_NAME
    with pytest.raises(RowError, match="not python"):
        convert("magicoder_oss", {**row, "lang": "rust"})
    with pytest.raises(RowError, match="no python code block"):
        convert("magicoder_oss", {**row, "solution": "no code"})
    evol = {"instruction": "Reverse a string.", "response": "```py\nprint('ab'[::-1])\n```"}
    assert calls(convert("magicoder_evol", evol))[0][1]["code"] == "print('ab'[::-1])\n"
