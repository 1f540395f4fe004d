"""Converters of SFT sources into ``ChatExample`` rows with one tool-call format.

Every source's calls become assistant ``tool_calls`` with JSON-object arguments, tool results
become ``tool`` messages linked to their call, and tool descriptions become JSON function
schemas in ``tools``. System prompts that only describe a source's own call syntax are dropped
(the chat template writes rstar2's); system prompts with task content are kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ValidationError

from rstar2_data.converters.base import Converter, RowError, RowKind, field, text_field
from rstar2_data.converters.calls import (
    Call,
    bracket_calls,
    function_schema,
    json_call,
    json_objects,
    json_value,
)
from rstar2_data.protocol import FunctionCall, ToolCall
from rstar2_data.schemas import ChatExample, ChatMessage
from rstar2_data.tools import PYTHON_TOOL_NAME, python_tool_arguments, python_tool_schema


class ChatBuilder:
    """Accumulates one conversation, numbering calls and linking tool results to them."""

    def __init__(self) -> None:
        self._messages: list[dict[str, Any]] = []
        self._unanswered: list[ToolCall] = []
        self._calls = 0

    def say(self, role: str, content: str) -> None:
        if role not in ("system", "user", "assistant"):
            raise RowError("unknown role", role)
        self._messages.append({"role": role, "content": content})

    def call(self, calls: list[Call], content: str = "") -> None:
        """Assistant tool calls; consecutive calls join the same assistant message."""
        made = []
        for name, arguments in calls:
            made.append(
                ToolCall(
                    id=f"call_{self._calls}",
                    function=FunctionCall(name=name, arguments=arguments),
                )
            )
            self._calls += 1
        last = self._messages[-1] if self._messages else None
        if last is not None and last["role"] == "assistant":
            # A reply followed by its calls (or parallel calls in a row) is one assistant turn.
            last["content"] = "\n".join(part for part in (last["content"], content) if part)
            last.setdefault("tool_calls", []).extend(made)
        else:
            self._messages.append({"role": "assistant", "content": content, "tool_calls": made})
        self._unanswered.extend(made)

    def tool(self, content: str) -> None:
        """A tool result, answering the oldest unanswered call."""
        if not self._unanswered:
            raise RowError("tool response without a preceding call")
        call = self._unanswered.pop(0)
        self._messages.append(
            {
                "role": "tool",
                "content": content,
                "tool_call_id": call.id,
                "name": call.function.name,
            }
        )

    def build(self, *, example_id: str, source: str, tools: list[dict[str, Any]]) -> ChatExample:
        if not any(m["role"] == "assistant" for m in self._messages):
            raise RowError("no assistant turn")
        return ChatExample(
            id=example_id,
            source=source,
            messages=[ChatMessage(**m) for m in self._messages],
            tools=tools,
        )


def _tools(value: Any) -> list[dict[str, Any]]:
    decoded = json_value(value, "tools")
    if not isinstance(decoded, list):
        raise RowError("tools is not a list")
    return [function_schema(spec) for spec in decoded]


def _example_id(row: Mapping[str, Any], source: str, index: int) -> str:
    value = row.get("id")
    return str(value) if value is not None and str(value) else f"{source}-{index}"


class Rows(Converter[ChatExample]):
    """Rows already in the ``ChatExample`` schema, e.g. the output of an earlier build."""

    kind: ClassVar[RowKind] = "chat"

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        try:
            return ChatExample.model_validate(row)
        except ValidationError as error:
            where = ".".join(str(p) for p in error.errors()[0]["loc"])
            raise RowError("not a ChatExample row", where) from error


class Messages(Converter[ChatExample]):
    """Rows with OpenAI-style ``messages`` (role/content), e.g. the tulu-3 SFT sets."""

    kind: ClassVar[RowKind] = "chat"

    def __init__(self, column: str = "messages") -> None:
        self.column = column

    def add(self, builder: ChatBuilder, messages: Any) -> None:
        if not isinstance(messages, list) or not messages:
            raise RowError(f"{self.column} is not a non-empty list")
        for message in messages:
            if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
                raise RowError("message without string content")
            builder.say(str(message.get("role")), message["content"])

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        builder = ChatBuilder()
        self.add(builder, field(row, self.column))
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=[])


class NemotronChat(Messages):
    """``nvidia/Llama-Nemotron-Post-Training-Dataset`` chat split: ``input`` messages plus the
    ``output`` reply; only ``reasoning: off`` rows are kept (no reasoning traces in this SFT)."""

    def __init__(self) -> None:
        super().__init__(column="input")

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        if row.get("reasoning") != "off":
            raise RowError("reasoning is not off", str(row.get("reasoning")))
        builder = ChatBuilder()
        self.add(builder, field(row, "input"))
        builder.say("assistant", text_field(row, "output").strip())
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=[])


class Xlam(Converter[ChatExample]):
    """``Salesforce/xlam-function-calling-60k``: ``query``, with ``tools`` and ``answers`` as
    JSON strings; one user turn answered by (possibly parallel) calls."""

    kind: ClassVar[RowKind] = "chat"

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        answers = json_value(field(row, "answers"), "answers")
        if not isinstance(answers, list) or not answers:
            raise RowError("answers is not a non-empty list")
        builder = ChatBuilder()
        builder.say("user", text_field(row, "query"))
        builder.call([json_call(answer) for answer in answers])
        tools = _tools(field(row, "tools"))
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=tools)


class ApigenMT(Converter[ChatExample]):
    """``Salesforce/APIGen-MT-5k``: ``conversations`` of human/gpt/function_call/observation
    turns, ``tools`` as a JSON string, and a ``system`` prompt holding the domain policy (kept)."""

    kind: ClassVar[RowKind] = "chat"
    _ROLES: ClassVar[dict[str, str]] = {"human": "user", "gpt": "assistant"}

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        builder = ChatBuilder()
        system = row.get("system")
        if isinstance(system, str) and system.strip():
            builder.say("system", system.strip())
        for turn in _turns(row):
            speaker, value = turn
            if speaker == "function_call":
                builder.call([json_call(value)])
            elif speaker == "observation":
                builder.tool(value)
            elif speaker in self._ROLES:
                builder.say(self._ROLES[speaker], value)
            else:
                raise RowError("unknown conversation speaker", speaker)
        tools = _tools(field(row, "tools"))
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=tools)


def _turns(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """ShareGPT-style ``conversations``: [{"from": ..., "value": ...}]."""
    turns = json_value(field(row, "conversations"), "conversations")
    if not isinstance(turns, list) or not turns:
        raise RowError("conversations is not a non-empty list")
    out = []
    for turn in turns:
        if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str):
            raise RowError("conversation turn without string value")
        out.append((str(turn.get("from")), turn["value"]))
    return out


class ToolAce(Converter[ChatExample]):
    """``Team-ACE/ToolACE``: tools as a JSON list inside the ``system`` text, ``conversations``
    from user/assistant/tool, and calls in the bracket syntax ``[func(a=1)]``."""

    kind: ClassVar[RowKind] = "chat"

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        system = text_field(row, "system")
        lists = [value for value in json_objects(system) if isinstance(value, list)]
        if not lists:
            raise RowError("no tool list in system prompt")
        tools = [function_schema(spec) for spec in lists[0]]
        builder = ChatBuilder()
        for speaker, value in _turns(row):
            if speaker == "assistant" and (calls := bracket_calls(value)) is not None:
                builder.call(calls)
            elif speaker == "tool":
                builder.tool(value)
            else:
                builder.say(speaker, value)
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=tools)


class Glaive(Converter[ChatExample]):
    """``glaiveai/glaive-function-calling-v2``: ``system`` ("SYSTEM: ..." then tool JSON objects)
    and ``chat`` with USER:/ASSISTANT:/FUNCTION RESPONSE: markers; calls are
    ``<functioncall> {"name": ..., "arguments": '{...}'}``."""

    kind: ClassVar[RowKind] = "chat"
    _MARKER = re.compile(r"(?:^|\n+)\s*(USER|ASSISTANT|FUNCTION RESPONSE):\s?")
    _CALL = re.compile(
        r"<functioncall>\s*\{\s*\"name\"\s*:\s*\"(?P<name>[^\"]+)\"\s*,\s*\"arguments\"\s*:\s*"
        r"(?P<q>'?)(?P<args>.*)(?P=q)\s*\}\s*$",
        re.DOTALL,
    )

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        system = text_field(row, "system")
        tools = [function_schema(spec) for spec in json_objects(system) if isinstance(spec, dict)]
        chat = text_field(row, "chat")
        parts = self._MARKER.split(chat)
        if parts[0].strip():
            raise RowError("chat does not start with a USER:/ASSISTANT: marker")
        builder = ChatBuilder()
        for marker, text in zip(parts[1::2], parts[2::2], strict=True):
            text = text.replace("<|endoftext|>", "").strip()
            if marker == "USER":
                builder.say("user", text)
            elif marker == "FUNCTION RESPONSE":
                builder.tool(text)
            elif "<functioncall>" in text:
                before, _, call = text.partition("<functioncall>")
                match = self._CALL.match("<functioncall>" + call.strip())
                if match is None:
                    raise RowError("unparsable <functioncall>", call[:80])
                arguments = json_value(match.group("args"), "tool call arguments")
                builder.call(
                    [json_call({"name": match.group("name"), "arguments": arguments})],
                    content=before.strip(),
                )
            else:
                builder.say("assistant", text)
        return builder.build(example_id=_example_id(row, source, index), source=source, tools=tools)


class MagicoderToTool(Converter[ChatExample]):
    """Magicoder-style code instructions (``problem``/``solution`` with ``lang``, or
    ``instruction``/``response``) turned into a call of the Python tool: the assistant explains,
    then runs the solution's first ```python block. The example ends at the call: it teaches the
    call syntax, and running untrusted code is the sandbox's job, not the converter's."""

    kind: ClassVar[RowKind] = "chat"
    _BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(?P<code>.*?)```", re.DOTALL | re.IGNORECASE)

    def __init__(self, *, instruction: str = "problem", response: str = "solution") -> None:
        self.instruction, self.response = instruction, response

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> ChatExample:
        lang = row.get("lang")
        if lang is not None and str(lang).lower() != "python":
            raise RowError("not python", str(lang))
        response = text_field(row, self.response)
        match = self._BLOCK.search(response)
        if match is None or not match.group("code").strip():
            raise RowError("no python code block")
        explanation = response[: match.start()].strip()
        builder = ChatBuilder()
        builder.say("user", text_field(row, self.instruction).strip())
        builder.call(
            [(PYTHON_TOOL_NAME, python_tool_arguments(match.group("code"), ""))],
            content=explanation,
        )
        return builder.build(
            example_id=_example_id(row, source, index),
            source=source,
            tools=[python_tool_schema()],
        )
