"""Planted edits of benchmark problems: the ways a copy of a benchmark problem hides in a corpus.

Each edit keeps the problem's numbers and changes its text the way scraped and rewritten
datasets do: a sentence added before or after, other LaTeX spellings of the same formula, one
word changed. ``EDITS`` maps an edit's name to a function ``(text, rng) -> edited text or None``
(None: the edit does not apply to this text, e.g. no LaTeX to respell).
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


EDITS: dict[str, Callable[[str, random.Random], str | None]] = {
    "prefix sentence": prefix_sentence,
    "suffix sentence": suffix_sentence,
    "latex spelling": latex_spelling,
    "one word changed": one_word,
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
