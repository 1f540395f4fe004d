"""Integer-answer filter: keep problems whose answer is an integer of bounded size."""

from __future__ import annotations

from typing import ClassVar

from rstar2_data.answers import canonical_integer, integer_digits
from rstar2_data.converters.base import RowKind
from rstar2_data.filters.base import Filter
from rstar2_data.filters.text import Item
from rstar2_data.schemas import MathProblem

DEFAULT_MAX_ABS = 10**12


class IntegerAnswer(Filter):
    """Keeps integer answers with ``|answer| <= max_abs``; huge answers are slow to verify."""

    name: ClassVar[str] = "integer_answer"
    kinds: ClassVar[tuple[RowKind, ...]] = ("math",)

    def __init__(self, max_abs: int = DEFAULT_MAX_ABS) -> None:
        self.max_abs = max_abs

    def check(self, item: Item) -> str | None:
        row = item.row
        assert type(row) is MathProblem  # kinds guarantees it
        value = canonical_integer(row.answer)
        if value is None:
            return "answer is not an integer"
        # Compare lengths first: int() refuses very long digit strings.
        too_long = integer_digits(value) > len(str(self.max_abs))
        if too_long or abs(int(value)) > self.max_abs:
            return f"answer larger than {self.max_abs}"
        return None
