"""n-gram decontamination against evaluation benchmarks (8-grams by default, as in the paper).

Texts are compared as lowercase word tokens, so copies that differ only in case, whitespace,
punctuation, ``$`` signs or LaTeX spacing still match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

from rstar2_data.filters.base import Filter, Row, row_text
from rstar2_data.filters.dedup import normalize_text

DEFAULT_NGRAM = 8


def ngrams(text: str, n: int) -> set[bytes]:
    """Hashes of the word n-grams of ``text``; a text shorter than ``n`` words is one gram."""
    words = normalize_text(text).split()
    if not words:
        return set()
    spans = [words[i : i + n] for i in range(max(1, len(words) - n + 1))]
    return {hashlib.blake2b(" ".join(s).encode(), digest_size=12).digest() for s in spans}


class Decontaminate(Filter):
    """Removes rows sharing at least ``min_matches`` n-grams with any benchmark text."""

    name: ClassVar[str] = "decontaminate"

    def __init__(
        self,
        benchmarks: Mapping[str, Iterable[str]],
        *,
        n: int = DEFAULT_NGRAM,
        min_matches: int = 1,
    ) -> None:
        if n < 1 or min_matches < 1:
            raise ValueError(f"n and min_matches must be >= 1, got {n} and {min_matches}")
        self.n, self.min_matches = n, min_matches
        # gram -> first benchmark holding it (benchmarks in the recipe's order)
        self.index: dict[bytes, str] = {}
        for benchmark, texts in benchmarks.items():
            for text in texts:
                for gram in ngrams(text, n):
                    self.index.setdefault(gram, benchmark)

    def rejector(self) -> Callable[[Row], str | None]:
        def reject(row: Row) -> str | None:
            hits = [self.index[g] for g in ngrams(row_text(row), self.n) if g in self.index]
            if len(hits) < self.min_matches:
                return None
            return f"overlaps {min(hits)} ({self.n}-grams)"

        return reject
