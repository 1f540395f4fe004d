"""Finding and parsing the tool call of one assistant turn.

Only the first tool-call block of a turn is executed. A call that does not parse (bad JSON, wrong
tool, missing or mistyped arguments) is not executed: its error text becomes the tool response,
so the model can correct itself, and it counts as a failed tool call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall

_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "string": str,
    "object": dict,
    "array": list,
    "boolean": bool,
    "number": (int, float),
}


class ParsedTurn(BaseModel):
    """What the tool-call parser found in one assistant turn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempted: bool = Field(description="The turn contains a tool-call opening tag.")
    call: ToolCall | None = Field(
        default=None, description="The first call, when it parsed and matches the tool's schema."
    )
    error: str | None = Field(default=None, description="Why the first call did not parse.")
    ignored_calls: int = Field(default=0, ge=0, description="Further calls, never executed.")


class ToolCallParser:
    """Parses tool calls against the JSON function schemas offered to the model."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self._schemas: dict[str, dict[str, Any]] = {}
        for index, tool in enumerate(tools):
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(
                    f"tools[{index}] must be an OpenAI function schema "
                    '{"type": "function", "function": {"name": ..., "parameters": ...}}'
                )
            self._schemas[function["name"]] = function.get("parameters") or {}

    def parse(self, text: str) -> ParsedTurn:
        """Find the first tool call in ``text`` and validate it."""
        start = text.find(TOOL_CALL_OPEN)
        if start < 0:
            return ParsedTurn(attempted=False)
        calls = _CALL.findall(text, start)
        if not calls:
            return ParsedTurn(
                attempted=True, error=f"Error: {TOOL_CALL_OPEN} is not closed by {TOOL_CALL_CLOSE}."
            )
        ignored = len(calls) - 1
        try:
            call = self._validate(calls[0])
        except ValueError as error:
            return ParsedTurn(attempted=True, error=f"Error: {error}", ignored_calls=ignored)
        return ParsedTurn(attempted=True, call=call, ignored_calls=ignored)

    def _validate(self, body: str) -> ToolCall:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as error:
            raise ValueError(f"the tool call is not valid JSON: {error}") from None
        if not isinstance(payload, dict):
            raise ValueError('the tool call must be a JSON object {"name": ..., "arguments": ...}')
        name = payload.get("name")
        if name not in self._schemas:
            raise ValueError(f"unknown tool {name!r}; available: {sorted(self._schemas)}")
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            # Some models JSON-encode the arguments object as a string, as the OpenAI API does.
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                raise ValueError(f"the tool call's arguments are not valid JSON: {error}") from None
        if not isinstance(arguments, dict):
            raise ValueError("the tool call's arguments must be a JSON object")
        self._check_arguments(name, arguments)
        return ToolCall.of(name, arguments)

    def _check_arguments(self, name: str, arguments: dict[str, Any]) -> None:
        schema = self._schemas[name]
        properties: dict[str, Any] = schema.get("properties", {})
        missing = [key for key in schema.get("required", []) if key not in arguments]
        if missing:
            raise ValueError(f"{name} is missing required arguments {missing}")
        unknown = sorted(set(arguments) - set(properties))
        if unknown and properties:
            raise ValueError(
                f"{name} got unknown arguments {unknown}; expected {sorted(properties)}"
            )
        for key, value in arguments.items():
            expected = _JSON_TYPES.get(properties.get(key, {}).get("type", ""))
            if expected is not None and not isinstance(value, expected):
                kind = properties[key]["type"]
                raise ValueError(f"{name} argument {key!r} must be a {kind}, got {value!r:.80}")
