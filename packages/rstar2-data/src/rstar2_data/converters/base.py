"""The converter interface: one source row in, one rstar2 row out, or a ``RowError`` saying why.

Every converter raises ``RowError`` with a short, stable reason for a row it cannot convert;
the build counts rows per reason and reports them instead of dropping them silently.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Literal, TypeVar

from rstar2_data.benchmarks import lookup
from rstar2_data.schemas import ChatExample, MathProblem

RowKind = Literal["math", "chat"]
RowT = TypeVar("RowT", MathProblem, ChatExample)


class RowError(ValueError):
    """A source row that cannot be converted. ``reason`` is a short key used for counting."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Converter(ABC, Generic[RowT]):
    """Turns rows of one source format into ``MathProblem`` or ``ChatExample`` rows."""

    kind: ClassVar[RowKind]

    @abstractmethod
    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> RowT:
        """Convert one row; ``index`` is its position in the source (for ids it lacks)."""


def field(row: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` ("reward_model.ground_truth"); ``RowError`` when absent."""
    value = lookup(row, path)
    if value is None:
        raise RowError(f"missing field {path}")
    return value


def text_field(row: Mapping[str, Any], path: str) -> str:
    """A non-empty string field."""
    value = field(row, path)
    if not isinstance(value, str):
        raise RowError(f"field {path} is not a string", type(value).__name__)
    if not value.strip():
        raise RowError(f"empty field {path}")
    return value
