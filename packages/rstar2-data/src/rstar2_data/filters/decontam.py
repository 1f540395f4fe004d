"""Decontamination against evaluation benchmarks, by three tests on canonical words.

A row is a copy of a benchmark problem when

1. its whole text equals the problem's (any length; case, spacing, punctuation, ``$`` and
   LaTeX spellings such as ``\\dfrac``/``\\frac`` aside), or
2. it shares word n-grams (8, as in the paper) with the problem: at least ``min_matches``, and
   at least ``coverage`` (half by default) of the problem's informative n-grams. An n-gram in
   ``boilerplate`` or more benchmark problems ("m and n are relatively prime positive
   integers") is stock phrasing, common to benchmark and ordinary problems alike, and does not
   count; nor does a stock phrase that is a small part of one problem (coverage), or
3. the problem is short (fewer than ``short_words`` words, where one changed word can break
   every n-gram): the row holds a passage within ``max_edits_for`` word edits of it (one word
   or one number changed, a sentence added before or after) and all but one of its numbers
   (all of them when it has fewer than ``MIN_WORDS_NUMBER_CHANGED`` words);
   or a passage within as many edits of the problem's text up to one of its clause ends
   (``clause_prefixes``: at least half its words), holding every number of that text (the
   last clause dropped: "Express your answer as a common fraction.", ", in square inches").

Candidates for test 3 are found through anchor words the edits cannot all remove (two more of a
passage's rarest words than the edits allowed; a near copy holds two of them); only those that
hold enough of its words and numbers pay for the word-level alignment. ``bench/decontam.py``
measures what the tests catch and flag.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import ClassVar

from rstar2_data.filters.base import Filter
from rstar2_data.filters.text import Item, canonical_words, normalize_words

DEFAULT_NGRAM = 8
DEFAULT_BOILERPLATE = 3
DEFAULT_SHORT_WORDS = 24
DEFAULT_COVERAGE = 0.5
MAX_CHANGED_NUMBERS = 1
"""Numbers of a short problem a near copy may have changed (each also counts as an edit)."""
MIN_WORDS_NUMBER_CHANGED = 6
"""Fewest words of a short problem that a near copy may hold with a number changed: shorter
ones ("Simplify $\\sqrt{242}$.", "Compute $\\dbinom{31}{28}$.") with another number are other
instances of a stock exercise."""
MIN_PREFIX_WORDS = 5
"""Fewest words of a short problem's text up to a clause end that is matched on its own."""

Gram = tuple[str, ...]


def _grams(words: list[str], n: int) -> Iterator[Gram]:
    if len(words) <= n:
        return iter([tuple(words)] if words else [])
    return zip(*[words[k:] for k in range(n)], strict=False)


def word_ngrams(words: list[str], n: int) -> set[Gram]:
    """The word n-grams of ``words``; a text shorter than ``n`` words is one gram."""
    return set(_grams(words, n))


def ngrams(text: str, n: int) -> set[Gram]:
    """``word_ngrams`` of the canonical words of ``text``."""
    return word_ngrams(canonical_words(normalize_words(text)), n)


def max_edits_for(length: int) -> int:
    """Word edits a near copy of a ``length``-word problem may have: 1, and 2 from 16 words."""
    return 1 if length < 16 else 2


def window_distance(pattern: Gram, text: list[str], limit: int) -> int:
    """Fewest word edits turning ``pattern`` into some passage of ``text`` (``limit + 1`` once
    it exceeds ``limit``)."""
    previous = [0] * (len(text) + 1)  # a passage may start anywhere
    for i, word in enumerate(pattern, start=1):
        current = [i] + [0] * len(text)
        for j, other in enumerate(text, start=1):
            current[j] = min(previous[j - 1] + (word != other), previous[j] + 1, current[j - 1] + 1)
        if min(current) > limit:
            return limit + 1
        previous = current
    return min(previous)


@dataclass(frozen=True)
class _Short:
    """A passage a near copy holds: a short problem, or its text up to one of its clause ends."""

    benchmark: str
    words: Gram
    vocabulary: frozenset[str]
    numbers: frozenset[str]
    pairs: frozenset[tuple[str, str]]
    max_edits: int
    changed_numbers: int
    """Of its numbers, how many a near copy may have changed (each also counts as an edit)."""


# Math ($...$, $$...$$, \[...\], \(...\)), whose punctuation ends no clause.
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$]*\$|\\\[.*?\\\]|\\\(.*?\\\)", re.S)
# A sentence's end with more text after it, a comma or a semicolon.
_CLAUSE_END = re.compile(r"[.?!](?=\s+\S)|[,;](?=\s)")


def clause_prefixes(text: str, length: int) -> list[Gram]:
    """The canonical words of ``text`` up to each of its clause ends outside math that keep
    at least half its ``length`` words (and ``MIN_PREFIX_WORDS``): what a copy that drops the
    problem's last clause or clauses still holds."""
    math = [m.span() for m in _MATH.finditer(text)]
    prefixes = []
    for end in _CLAUSE_END.finditer(text):
        if any(start <= end.start() < stop for start, stop in math):
            continue
        words = canonical_words(normalize_words(text[: end.start()]))
        if max(MIN_PREFIX_WORDS, -(-length // 2)) <= len(words) < length:
            prefixes.append(tuple(words))
    return list(dict.fromkeys(prefixes))


class Decontaminate(Filter):
    """Removes rows that copy a benchmark problem (see the module's docstring for the tests)."""

    name: ClassVar[str] = "decontaminate"
    judges_removed: ClassVar[bool] = True

    def __init__(
        self,
        benchmarks: Mapping[str, Iterable[str]],
        *,
        n: int = DEFAULT_NGRAM,
        min_matches: int = 1,
        boilerplate: int = DEFAULT_BOILERPLATE,
        short_words: int = DEFAULT_SHORT_WORDS,
        coverage: float = DEFAULT_COVERAGE,
    ) -> None:
        if n < 1 or min_matches < 1 or boilerplate < 2 or not 0 <= coverage <= 1:
            raise ValueError(
                "n and min_matches must be >= 1, boilerplate >= 2 and coverage in [0, 1], got "
                f"{n}, {min_matches}, {boilerplate} and {coverage}"
            )
        self.n, self.min_matches = n, min_matches
        texts = [(benchmark, text) for benchmark, group in benchmarks.items() for text in group]
        canonical = [canonical_words(normalize_words(text)) for _, text in texts]
        problems = [
            (benchmark, words)
            for (benchmark, _), words in zip(texts, canonical, strict=True)
            if words
        ]
        # whole text -> first benchmark holding it (benchmarks in the recipe's order)
        self.whole: dict[Gram, str] = {}
        spread: Counter[Gram] = Counter()
        for benchmark, words in problems:
            self.whole.setdefault(tuple(words), benchmark)
            if len(words) > n:
                spread.update(word_ngrams(words, n))
        self.boilerplate = sorted(
            " ".join(g) for g, count in spread.items() if count >= boilerplate
        )
        # informative gram -> the problems holding it; a problem's count of informative grams
        self.grams: dict[Gram, list[int]] = {}
        self.informative: list[int] = []
        self.benchmark_of: list[str] = []
        for number, (benchmark, words) in enumerate(problems):
            own = [g for g in word_ngrams(words, n) if len(words) > n and spread[g] < boilerplate]
            for gram in own:
                self.grams.setdefault(gram, []).append(number)
            self.informative.append(len(own))
            self.benchmark_of.append(benchmark)
        self.coverage = coverage
        self.gram_set = frozenset(self.grams)
        # Near-copy candidates are found through anchor words the edits cannot all change.
        frequency = Counter(word for _, words in problems for word in set(words))
        self.short: list[_Short] = []
        self.anchors: dict[str, list[int]] = {}
        for (benchmark, text), words in zip(texts, canonical, strict=True):
            if not words or len(words) >= short_words:
                continue
            changed = MAX_CHANGED_NUMBERS if len(words) >= MIN_WORDS_NUMBER_CHANGED else 0
            self._add(benchmark, tuple(words), frequency, changed_numbers=changed)
            # A clause prefix has lost part of the problem already: its numbers must all stay.
            for prefix in clause_prefixes(text, len(words)):
                self._add(benchmark, prefix, frequency, changed_numbers=0)
        self.anchor_set = frozenset(self.anchors)
        # The words a row is scanned for at once: every word of the short problems.
        self.watched = frozenset().union(*(short.vocabulary for short in self.short))

    def _add(
        self, benchmark: str, pattern: Gram, frequency: Counter[str], *, changed_numbers: int
    ) -> None:
        """Indexes ``pattern`` under its e + 2 rarest distinct words (e: its edits, a changed
        number included), of which a near copy holds two; an ordinary row seldom holds two rare
        words of one problem. Single characters (variables, digits) come last: nearly every
        row holds some. A pattern of e + 1 distinct words or fewer, of which a near copy may
        hold one, is listed twice under each."""
        edits = max_edits_for(len(pattern))
        rarest = sorted(set(pattern), key=lambda w: (len(w) == 1, frequency[w], -len(w), w))
        anchors = rarest[: edits + 2]
        for anchor in anchors * (1 if len(anchors) == edits + 2 else 2):
            self.anchors.setdefault(anchor, []).append(len(self.short))
        vocabulary = frozenset(pattern)
        self.short.append(
            _Short(
                benchmark=benchmark,
                words=pattern,
                vocabulary=vocabulary,
                numbers=frozenset(w for w in vocabulary if w.isdigit()),
                pairs=frozenset(pairwise(pattern)),
                max_edits=edits,
                changed_numbers=changed_numbers,
            )
        )

    def check(self, item: Item) -> str | None:
        words = item.canonical
        if not words:
            return None
        shared: dict[int, int] = {}
        for gram in self.gram_set.intersection(_grams(words, self.n)):
            for number in self.grams[gram]:
                shared[number] = shared.get(number, 0) + 1
        copied = [
            self.benchmark_of[number]
            for number, count in shared.items()
            if count >= max(self.min_matches, self.coverage * self.informative[number])
        ]
        if copied:
            return f"overlaps {min(copied)} ({self.n}-grams)"
        whole = self.whole.get(tuple(words))
        if whole is not None:
            return f"overlaps {whole} (whole text)"
        return self._near_copy(words)

    def _near_copy(self, words: list[str]) -> str | None:
        present = self.watched.intersection(words)
        anchors = present.intersection(self.anchor_set)
        if not anchors:
            return None
        # The patterns listed under two of the row's anchors (or twice under one).
        once: set[int] = set()
        twice: set[int] = set()
        for anchor in anchors:
            for number in self.anchors[anchor]:
                if number in once:
                    twice.add(number)
                else:
                    once.add(number)
        pairs: set[tuple[str, str]] | None = None
        found = []
        for number in twice:
            short = self.short[number]
            if len(short.numbers - present) > short.changed_numbers:
                continue
            if len(short.vocabulary - present) > short.max_edits:
                continue
            # An edit breaks at most two of the problem's word pairs.
            if pairs is None:
                pairs = set(pairwise(words))
            if len(short.pairs - pairs) > 2 * short.max_edits:
                continue
            if window_distance(short.words, words, short.max_edits) <= short.max_edits:
                found.append(short.benchmark)
        return f"overlaps {min(found)} (near copy)" if found else None
