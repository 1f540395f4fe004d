"""Parse and validation errors as one line: where and what, without a library's excerpt."""

from __future__ import annotations

import yaml
from pydantic import ValidationError


def describe_yaml_error(error: yaml.YAMLError) -> str:
    """``line L, column C: PROBLEM`` (1-based) where PyYAML knows the place, else its message."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        problem = error.problem or "invalid YAML"
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(error).split())


def describe_validation_error(error: ValidationError) -> str:
    """The first problem as ``FIELD.PATH: MESSAGE`` (``the file: ...`` for the whole input),
    with ``(and N more)`` when there are others."""
    problems = error.errors()
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"]) or "the file"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']}{more}"
