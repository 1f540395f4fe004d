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
   every n-gram): the row holds every number of the problem and a passage within
   ``max_edits_for`` word edits of it (one word changed, a sentence added before or after).

Candidates for test 3 are found through anchor words the edits cannot all remove (more of a
short problem's rarest words than the edits allowed, or its numbers); only those holding all its
numbers pay for the word-level alignment. ``bench/decontam.py`` measures what the tests
catch and flag.
"""

from __future__ import annotations

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
    benchmark: str
    words: Gram
    vocabulary: frozenset[str]
    numbers: frozenset[str]
    pairs: frozenset[tuple[str, str]]
    max_edits: int


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
        problems = [
            (benchmark, canonical_words(normalize_words(text)))
            for benchmark, texts in benchmarks.items()
            for text in texts
        ]
        problems = [(benchmark, words) for benchmark, words in problems if words]
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
        self.anchors: dict[str, list[_Short]] = {}
        for benchmark, words in problems:
            if len(words) >= short_words:
                continue
            edits = max_edits_for(len(words))
            vocabulary = frozenset(words)
            numbers = frozenset(w for w in vocabulary if w.isdigit())
            rarest = sorted(vocabulary, key=lambda w: (frequency[w], -len(w), w))
            short = _Short(
                benchmark=benchmark,
                words=tuple(words),
                vocabulary=vocabulary,
                numbers=numbers,
                pairs=frozenset(pairwise(words)),
                max_edits=edits,
            )
            self.short.append(short)
            # The longest number (edits keep numbers), else e + 1 rare words (e edits leave one).
            long_numbers = sorted((w for w in numbers if len(w) > 1), key=lambda w: (-len(w), w))
            for anchor in long_numbers[:1] or rarest[: edits + 1]:
                self.anchors.setdefault(anchor, []).append(short)
        self.anchor_set = frozenset(self.anchors)
        # The words a row is scanned for at once: every word of the short problems.
        self.watched = frozenset().union(*(short.vocabulary for short in self.short))

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
        pairs: set[tuple[str, str]] | None = None
        found = []
        for anchor in anchors:
            for short in self.anchors[anchor]:
                if not short.numbers <= present:
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
