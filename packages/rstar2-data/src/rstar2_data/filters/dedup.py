"""Deduplication by exact text or by normalized text (case, whitespace, LaTeX spacing)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import ClassVar, Literal

from rstar2_data.filters.base import Filter, Row
from rstar2_data.schemas import MathProblem

DedupMode = Literal["exact", "normalized"]
_SPACING = re.compile(r"\\[,;:! ]|\$|\\left|\\right")
_NON_WORD = re.compile(r"[^\w]+")


def normalize_text(text: str) -> str:
    """Lowercase words only: drops case, whitespace, punctuation, ``$`` and LaTeX spacing."""
    return " ".join(_NON_WORD.sub(" ", _SPACING.sub(" ", text.lower())).split())


def _key(row: Row) -> str:
    # A problem is a duplicate by its statement; a conversation by all its messages and tools.
    if isinstance(row, MathProblem):
        return row.problem
    return row.model_dump_json(include={"messages", "tools"})


class Dedup(Filter):
    """Keeps the first of rows with the same text (``exact``) or normalized text."""

    name: ClassVar[str] = "dedup"

    def __init__(self, mode: DedupMode = "normalized") -> None:
        self.mode = mode

    def rejector(self) -> Callable[[Row], str | None]:
        seen: set[bytes] = set()
        transform = normalize_text if self.mode == "normalized" else str

        def reject(row: Row) -> str | None:
            digest = hashlib.blake2b(transform(_key(row)).encode(), digest_size=16).digest()
            if digest in seen:
                return f"duplicate ({self.mode})"
            seen.add(digest)
            return None

        return reject
