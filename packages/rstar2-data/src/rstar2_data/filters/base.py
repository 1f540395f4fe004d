"""The filter interface: a pure judgement per row; the chain that applies filters keeps state.

A filter's ``check`` looks at one row (its text normalized once, shared through ``Item``) and
returns a reason to remove it, ``None`` to keep it, or a key (``bytes``): then the row is removed
as a repeat when an earlier row kept by the filter had the same key (dedup). Because ``check``
holds no state, it can run in worker processes; the only state, the keys seen, is kept by
``FilterChain``, which checkpoints it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, cast

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data.converters.base import RowKind
from rstar2_data.schemas import ChatExample, MathProblem

if TYPE_CHECKING:
    from rstar2_data.filters.text import Item

Row = MathProblem | ChatExample
Verdict = str | bytes | None
"""A reason to remove the row, a key to remove repeats by, or None to keep the row."""


class FilterReport(BaseModel):
    """What one filter did: rows in, rows kept, and removals per reason."""

    model_config = ConfigDict(extra="forbid")

    name: str
    rows_in: int
    kept: int
    removed: dict[str, int]
    also_matched: dict[str, int] = Field(
        default_factory=dict,
        description="Rows an earlier filter removed that this one would have removed too, per "
        "reason (decontaminate: benchmark copies that were also duplicates or had no integer "
        "answer), so every benchmark copy in the sources is counted here or under removed.",
    )


class Filter(ABC):
    """A row filter: ``check`` judges one row without state."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[RowKind, ...]] = ("math", "chat")
    keyed: ClassVar[bool] = False
    """Whether ``check`` returns keys (bytes) rather than reasons."""
    judges_removed: ClassVar[bool] = False
    """Also judge the rows earlier filters removed (counted in the report's ``also_matched``)."""

    @abstractmethod
    def check(self, item: Item) -> Verdict:
        """A reason to remove the row, None to keep it, or a key to remove repeats by."""

    def repeat_reason(self) -> str:
        """The removal reason of a row whose key an earlier kept row had."""
        raise NotImplementedError(f"{self.name} returns no keys")

    def apply(self, rows: Sequence[Row]) -> tuple[list[Row], FilterReport]:
        """This filter alone over ``rows``: the kept rows and the report."""
        from rstar2_data.filters.chain import FilterChain
        from rstar2_data.filters.text import Item

        chain = FilterChain([self], unique_ids=False)
        kept = [row for row in rows if chain.judge_item(Item(row))]
        return kept, chain.reports()[0]


def row_text(row: Row) -> str:
    """The text a row shows the model: the problem, or the user turns of a conversation."""
    if type(row) is MathProblem:  # not isinstance: pydantic's metaclass makes that slow
        return row.problem
    chat = cast(ChatExample, row)
    return "\n".join(m.content for m in chat.messages if m.role == "user")
