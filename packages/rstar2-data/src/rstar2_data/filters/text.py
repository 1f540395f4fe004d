"""Normalized text: computed once per row and shared by every filter that compares texts.

``normalize_words`` lowercases, drops ``$`` and LaTeX spacing (``\\,``, ``\\left``, ...) and
keeps the runs of word characters, so case, whitespace and punctuation do not matter.
``canonical_words`` further splits words between letters and digits (``x^2y`` and ``x^{2}y``
alike give ``x 2 y``), maps LaTeX spellings of one symbol to one word (``\\dfrac`` and
``\\tfrac`` -> ``frac``, ``\\le`` -> ``leq``, ...) and drops formatting commands
(``\\text``, ``\\displaystyle``, ...); decontamination compares canonical words, dedup the
normalized text.
"""

from __future__ import annotations

import re
from itertools import chain

from rstar2_data.filters.base import Row, row_text

_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"[^\W\d_]+|\d+")  # letters or digits, not both
# ASCII text: every byte that is not a word character becomes a space, then str.split.
_ASCII_SPACES = bytes(
    c if chr(c).isascii() and (chr(c).isalnum() or chr(c) == "_") else 32 for c in range(256)
)

# LaTeX commands with the same meaning, as the words normalization leaves of them.
ALIASES = {
    "dfrac": "frac",
    "tfrac": "frac",
    "cfrac": "frac",
    "dbinom": "binom",
    "tbinom": "binom",
    "le": "leq",
    "leqslant": "leq",
    "ge": "geq",
    "geqslant": "geq",
    "ne": "neq",
    "cdot": "times",
    "lvert": "vert",
    "rvert": "vert",
    "lbrace": "",
    "rbrace": "",
    "displaystyle": "",
    "text": "",
    "textrm": "",
    "textbf": "",
    "textit": "",
    "mathrm": "",
    "mathbf": "",
    "mathit": "",
    "operatorname": "",
    "mbox": "",
}


def normalize_words(text: str) -> list[str]:
    """The words of ``text`` without case, whitespace, punctuation, ``$`` and LaTeX spacing
    (``\\,``, ``\\left``, ``\\right``, ...): the runs of word characters that remain."""
    lowered = text.lower()
    # Of LaTeX's spacing commands only these two hold word characters; `$`, `\,` and the
    # like are punctuation, which the split drops anyway.
    if "\\left" in lowered or "\\right" in lowered:
        lowered = lowered.replace("\\left", " ").replace("\\right", " ")
    if lowered.isascii():  # the same words as the regular expression, 5x faster
        return lowered.encode().translate(_ASCII_SPACES).decode().split()
    return _WORD.findall(lowered)


def normalize_text(text: str) -> str:
    """``normalize_words`` joined by single spaces."""
    return " ".join(normalize_words(text))


class _Canonical(dict[str, tuple[str, ...]]):
    """Normalized word -> its canonical words, worked out on first sight (for up to ``LIMIT``
    distinct words). A word that stays as it is maps to itself, the same string object."""

    LIMIT = 200_000

    def __missing__(self, word: str) -> tuple[str, ...]:
        tokens = _TOKEN.findall(word)
        if tokens == [word] and word not in ALIASES:
            canonical: tuple[str, ...] = (word,)
        else:
            canonical = tuple(alias for token in tokens if (alias := ALIASES.get(token, token)))
        if len(self) < self.LIMIT:
            self[word] = canonical
        return canonical


_CANONICAL = _Canonical()


def canonical_words(words: list[str]) -> list[str]:
    """Normalized ``words`` split into runs of letters and of digits, LaTeX aliases mapped to
    one spelling and formatting commands dropped."""
    # Each distinct word is worked out once per process (most rows hold only known words), and
    # the mapping runs in C: no string is created for a word that stays as it is.
    return list(chain.from_iterable(map(_CANONICAL.__getitem__, words)))


class Item:
    """A row on its way through the filters, with its text normalized at most once."""

    __slots__ = ("_canonical", "_text", "_words", "row")

    def __init__(self, row: Row) -> None:
        self.row = row
        self._words: list[str] | None = None
        self._text: str | None = None
        self._canonical: list[str] | None = None

    @property
    def words(self) -> list[str]:
        """``normalize_words`` of the row's text (``row_text``)."""
        if self._words is None:
            self._words = normalize_words(row_text(self.row))
        return self._words

    @property
    def text(self) -> str:
        """``words`` joined by single spaces: ``normalize_text`` of the row's text."""
        if self._text is None:
            self._text = " ".join(self.words)
        return self._text

    @property
    def canonical(self) -> list[str]:
        """``canonical_words`` of ``words``."""
        if self._canonical is None:
            self._canonical = canonical_words(self.words)
        return self._canonical
