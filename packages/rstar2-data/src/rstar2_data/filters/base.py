"""The filter interface: rows in, kept rows out, removed rows counted per reason."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from rstar2_data.converters.base import RowKind
from rstar2_data.schemas import ChatExample, MathProblem

Row = MathProblem | ChatExample


class FilterReport(BaseModel):
    """What one filter did: rows in, rows kept, and removals per reason."""

    model_config = ConfigDict(extra="forbid")

    name: str
    rows_in: int
    kept: int
    removed: dict[str, int]


class Filter(ABC):
    """A row filter. ``rejector`` returns a fresh predicate per run, so stateful filters
    (dedup) start clean each time: it gives the removal reason, or ``None`` to keep the row."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[RowKind, ...]] = ("math", "chat")

    @abstractmethod
    def rejector(self) -> Callable[[Row], str | None]:
        """A predicate giving the reason to remove a row, or ``None`` to keep it."""

    def apply(self, rows: Sequence[Row]) -> tuple[list[Row], FilterReport]:
        reject = self.rejector()
        kept: list[Row] = []
        removed: Counter[str] = Counter()
        for row in rows:
            reason = reject(row)
            if reason is None:
                kept.append(row)
            else:
                removed[reason] += 1
        report = FilterReport(
            name=self.name, rows_in=len(rows), kept=len(kept), removed=dict(sorted(removed.items()))
        )
        return kept, report


def row_text(row: Row) -> str:
    """The text a row shows the model: the problem, or the user turns of a conversation."""
    if isinstance(row, MathProblem):
        return row.problem
    return "\n".join(m.content for m in row.messages if m.role == "user")
