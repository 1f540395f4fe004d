"""Errors about user input that name where the problem is."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: names the file (or dataset), the line, the field and what was expected."""

    def __init__(
        self, origin: str, message: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.origin = origin
        self.line = line
        self.field = field
        self.message = message
        where = origin if line is None else f"{origin}, line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
