"""Planted edits of benchmark problems: the ways a copy of a benchmark problem hides in a corpus.

Each edit of ``EDITS`` keeps the problem's numbers and changes its text the way scraped and
rewritten datasets do: a sentence added before or after, other LaTeX spellings of the same
formula, one word changed. ``SHORT_EDITS`` go further, as rewritten copies of short problems
do: one number changed, or the last clause dropped (an instruction such as "Express your
answer as a common fraction.", or what follows the last comma). Each maps an edit's name to a
function ``(text, rng) -> edited text or None`` (None: the edit does not apply to this text,
e.g. no LaTeX to respell).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

PREFIXES = (
    "Solve the following problem.",
    "Answer the question below and justify each step.",
    "This problem comes from a practice set.",
    "Read carefully before answering.",
)
SUFFIXES = (
    "Show your work.",
    "Put the final answer in a box.",
    "Give the answer as a number.",
    "Explain your reasoning briefly.",
)
# Same formula, other spelling: the first rule that applies to a text is used.
RESPELLINGS: tuple[tuple[str, str], ...] = (
    (r"\frac", r"\dfrac"),
    (r"\dfrac", r"\frac"),
    (r"\leq", r"\le"),
    (r"\le ", r"\leq "),
    (r"\geq", r"\ge"),
    (r"\ge ", r"\geq "),
    (r"\neq", r"\ne"),
    (r"\cdot", r"\times"),
    (r"\left(", "("),
    ("^2", "^{2}"),
)
REPLACEMENTS = ("value", "number", "amount", "figure", "quantity", "result", "total", "count")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}(?![A-Za-z])")
_MATH = re.compile(r"\$[^$]*\$")
_NUMBER = re.compile(r"\d+")
# Math spans ($...$, $$...$$, \[...\], \(...\)), whose punctuation ends no clause. Written
# apart from the filter's own clause ends so that the planted edits do not inherit its choices.
_DISPLAY = re.compile(r"\$\$.*?\$\$|\$[^$]*\$|\\\[.*?\\\]|\\\(.*?\\\)", re.S)
# A sentence's end with more text after it, or a comma or semicolon.
_CLAUSE_END = re.compile(r"[.?!](?=\s+\S)|[,;](?=\s)")


def prefix_sentence(text: str, rng: random.Random) -> str:
    return f"{rng.choice(PREFIXES)} {text}"


def suffix_sentence(text: str, rng: random.Random) -> str:
    return f"{text} {rng.choice(SUFFIXES)}"


def latex_spelling(text: str, rng: random.Random) -> str | None:
    """``\\frac`` -> ``\\dfrac`` and the like; else inline math ``$x$`` -> ``\\(x\\)``."""
    for old, new in RESPELLINGS:
        if old in text:
            return text.replace(old, new)
    if _MATH.search(text):
        return _MATH.sub(lambda m: r"\(" + m.group(0)[1:-1] + r"\)", text)
    return None


def one_word(text: str, rng: random.Random) -> str | None:
    """One word of running text (outside ``$...$``, not a LaTeX command) replaced."""
    spans = [(m.start(), m.end()) for m in _MATH.finditer(text)]
    words = [
        m for m in _WORD.finditer(text) if not any(start <= m.start() < end for start, end in spans)
    ]
    if not words:
        return None
    word = rng.choice(words)
    replacement = rng.choice([r for r in REPLACEMENTS if r != word.group(0).lower()])
    return text[: word.start()] + replacement + text[word.end() :]


def one_number(text: str, rng: random.Random) -> str | None:
    """One number (a run of digits, anywhere) replaced by another with as many digits."""
    numbers = list(_NUMBER.finditer(text))
    if not numbers:
        return None
    number = rng.choice(numbers)
    digits = len(number.group(0))
    low = 10 ** (digits - 1) if digits > 1 else 0
    other = number.group(0)
    while other == number.group(0):
        other = str(rng.randint(low, 10**digits - 1))
    return text[: number.start()] + other + text[number.end() :]


def last_clause(text: str, rng: random.Random) -> str | None:
    """The text up to its last clause end outside math: a sentence end followed by more text
    (kept), or a comma or semicolon (dropped with what follows)."""
    spans = [m.span() for m in _DISPLAY.finditer(text)]
    ends = [
        m.end() if m.group(0) in ".?!" else m.start()
        for m in _CLAUSE_END.finditer(text)
        if not any(start <= m.start() < end for start, end in spans)
    ]
    return text[: max(ends)].rstrip() if ends else None


EDITS: dict[str, Callable[[str, random.Random], str | None]] = {
    "prefix sentence": prefix_sentence,
    "suffix sentence": suffix_sentence,
    "latex spelling": latex_spelling,
    "one word changed": one_word,
}
SHORT_EDITS: dict[str, Callable[[str, random.Random], str | None]] = {
    "one number changed": one_number,
    "last clause dropped": last_clause,
}


def benchmark_problems(folder: Path, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(benchmark, problem text)`` of every row of ``folder/<name>.jsonl``."""
    out = []
    for name in names:
        with (folder / f"{name}.jsonl").open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    out.append((name, row.get("problem") or row["question"]))
    return out
