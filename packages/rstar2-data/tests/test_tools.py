"""The Python tool schema is the one of the agent protocol, and callers cannot corrupt it."""

from rstar2_data import PYTHON_TOOL_NAME, python_tool_arguments, python_tool_schema


def test_schema_names_the_tool_and_requires_code_and_input() -> None:
    schema = python_tool_schema()
    function = schema["function"]
    assert schema["type"] == "function"
    assert function["name"] == PYTHON_TOOL_NAME == "execute_python_code_with_standard_io"
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert sorted(parameters["required"]) == ["code", "input"]
    assert {k: v["type"] for k, v in parameters["properties"].items()} == {
        "code": "string",
        "input": "string",
    }


def test_schema_is_a_fresh_copy() -> None:
    python_tool_schema()["function"]["parameters"]["required"].clear()
    assert python_tool_schema()["function"]["parameters"]["required"] == ["code", "input"]


def test_arguments_match_the_schema_properties() -> None:
    arguments = python_tool_arguments("print(input())", "hi\n")
    assert arguments == {"code": "print(input())", "input": "hi\n"}
    assert set(arguments) == set(python_tool_schema()["function"]["parameters"]["properties"])
