"""Parsing the tool-call syntaxes of SFT sources into one form: (name, JSON-object arguments).

Also turns the tool descriptions each source uses into JSON function schemas.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from rstar2_data.converters.base import RowError

Call = tuple[str, dict[str, Any]]

# Python-style type names (xLAM, ToolACE) -> JSON schema types.
_JSON_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
}


def _json_type(name: str) -> str:
    base = name.split(",")[0].strip().split("[")[0].strip().lower()
    return _JSON_TYPES.get(base, "string")


def _parameters(parameters: Any) -> dict[str, Any]:
    """JSON schema parameters, converting the flat ``{arg: {type, description, default}}`` form."""
    if not isinstance(parameters, Mapping):
        raise RowError("tool parameters are not an object")
    if parameters.get("type") in ("object", "dict") and "properties" in parameters:
        return {**parameters, "type": "object"}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg, spec in parameters.items():
        if not isinstance(spec, Mapping):
            raise RowError("tool parameter spec is not an object", str(arg))
        kind = str(spec.get("type", "string"))
        properties[arg] = {"type": _json_type(kind)}
        if "description" in spec:
            properties[arg]["description"] = spec["description"]
        if "default" not in spec and "optional" not in kind.lower():
            required.append(arg)
    return {"type": "object", "properties": properties, "required": required}


def function_schema(spec: Any) -> dict[str, Any]:
    """An OpenAI function schema from ``{"name", "description", "parameters"}`` or the wrapped
    ``{"type": "function", "function": {...}}`` form."""
    if isinstance(spec, Mapping) and spec.get("type") == "function" and "function" in spec:
        spec = spec["function"]
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise RowError("tool spec has no name")
    function: dict[str, Any] = {"name": spec["name"]}
    if "description" in spec:
        function["description"] = spec["description"]
    function["parameters"] = _parameters(spec.get("parameters", {}))
    return {"type": "function", "function": function}


def json_value(text: Any, what: str) -> Any:
    """A JSON-encoded column or string, decoded; already-decoded values pass through."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RowError(f"{what} is not valid JSON", str(error)) from error


def arguments_object(arguments: Any) -> dict[str, Any]:
    """Call arguments as a JSON object, decoding them when a source stores them as a string."""
    value = (
        json_value(arguments, "tool call arguments") if isinstance(arguments, str) else arguments
    )
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RowError("tool call arguments are not a JSON object")
    return value


def json_call(value: Any) -> Call:
    """A call spelled ``{"name": ..., "arguments": {...}}`` (possibly as a JSON string)."""
    call = json_value(value, "tool call")
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        raise RowError("tool call has no name")
    return call["name"], arguments_object(call.get("arguments"))


def _literal(node: ast.expr) -> Any:
    # ToolACE mixes Python and JSON literals: accept true/false/null as names.
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("dict unpacking in a tool call argument")
        return {
            _literal(key): _literal(value)
            for key, value in zip(node.keys, node.values, strict=True)
            if key is not None
        }
    return ast.literal_eval(node)


def bracket_calls(text: str) -> list[Call] | None:
    """Calls in the bracket syntax ``[f(a=1, b="x"), g()]``; ``None`` when ``text`` is not one."""
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return None
    try:
        tree = ast.parse(stripped, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[Call] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)  # dotted names such as "weather.get" are kept whole
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError) as error:
            raise RowError("tool call argument is not a literal", str(error)) from error
        calls.append((name, arguments))
    return calls


def json_objects(text: str) -> list[Any]:
    """Every JSON value in ``text`` that starts with ``{`` or ``[``, in order."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    position = 0
    while (start := _next_open(text, position)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        found.append(value)
        position = end
    return found


def _next_open(text: str, position: int) -> int:
    starts = [i for i in (text.find("{", position), text.find("[", position)) if i != -1]
    return min(starts, default=-1)
