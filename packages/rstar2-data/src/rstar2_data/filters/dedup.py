"""Deduplication by exact text or by normalized text (case, whitespace, LaTeX spacing)."""

from __future__ import annotations

import hashlib
from typing import ClassVar, Literal

from rstar2_data.filters.base import Filter
from rstar2_data.filters.chain import KEY_BYTES
from rstar2_data.filters.text import Item, normalize_text
from rstar2_data.schemas import MathProblem

DedupMode = Literal["exact", "normalized"]


class Dedup(Filter):
    """Keeps the first of rows with the same text (``exact``) or normalized text.

    A problem is a duplicate by its statement; a conversation by all its messages and tools.
    """

    name: ClassVar[str] = "dedup"
    keyed: ClassVar[bool] = True

    def __init__(self, mode: DedupMode = "normalized") -> None:
        self.mode = mode

    def check(self, item: Item) -> bytes:
        row = item.row
        if type(row) is MathProblem:  # not isinstance: pydantic's metaclass makes it slow
            text = item.text if self.mode == "normalized" else row.problem
        else:
            text = row.model_dump_json(include={"messages", "tools"})
            if self.mode == "normalized":
                text = normalize_text(text)
        return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()

    def repeat_reason(self) -> str:
        return f"duplicate ({self.mode})"
