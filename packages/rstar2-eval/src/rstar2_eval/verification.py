"""Deciding whether one extracted answer equals its gold answer.

Three paths, cheapest first: integer golds compare as integers in-process; multiple-choice golds
compare as letters in-process; everything else goes to math-verify, which only runs inside the
grading worker processes (see ``pool``) because it can hang and its import is slow. Units and
prose are read before math-verify (``notation``; the grader applies those rules).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from rstar2_data.answers import canonical_integer
from rstar2_data.benchmarks import AnswerFormat as AnswerFormat  # re-exported: graders take it
from rstar2_eval.notation import expand_scientific


class FastVerdict(NamedTuple):
    """A verdict reached in-process, and the rule that reached it."""

    correct: bool
    method: Literal["integer", "choice", "exact"]


# Wrappers models put around a choice letter: \text{B}, \textbf{(B)}, \mathrm{B}.
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
# "B", "(B)", "B)", "B.", "B:", "(B) 42", "Option B", "Answer: B".
_CHOICE = re.compile(r"^(?:(?:option|choice|answer)\s*:?\s*)?\(?([A-Za-z])\)?(?:[.:)]|\s|$)", re.I)


def normalize_choice(answer: str) -> str | None:
    """The upper-case letter a multiple-choice answer names, or None when it names none."""
    text = answer.replace("$", "")
    while (unwrapped := _TEXT_WRAPPER.sub(r"\1", text)) != text:
        text = unwrapped
    match = _CHOICE.match(text.strip())
    return match.group(1).upper() if match is not None else None


def same_text(answer: str, gold: str) -> bool:
    """Whether two LaTeX strings are identical up to whitespace (insignificant in math mode)."""
    return "".join(answer.split()) == "".join(gold.split())


def fast_verdict(answer: str, gold: str, answer_format: AnswerFormat) -> FastVerdict | None:
    """Decide without math-verify where that is exact; None when math-verify must decide.

    Choice golds always decide here. Integer golds against integer-looking answers ("025",
    "1,000", "27.0") compare as ints; an integer gold against anything else
    (``\\frac{50}{2}``, ``25\\%``) still goes to math-verify. Other golds decide here only
    when the answer is the same text (up to whitespace).
    """
    if answer_format == "choice":
        expected = normalize_choice(gold)
        return FastVerdict(expected is not None and normalize_choice(answer) == expected, "choice")
    gold_int = canonical_integer(gold)
    if gold_int is not None:
        answer_int = canonical_integer(answer)
        if answer_int is not None:
            # Canonical digit strings: equal exactly when the integers are, at any length.
            return FastVerdict(answer_int == gold_int, "integer")
    if same_text(answer, gold):
        return FastVerdict(True, "exact")
    return None


def _as_latex(answer: str) -> str:
    """Wrap a bare answer so math-verify's LaTeX extraction reads all of it (E notation as
    ``\\times 10^{}``: math-verify would read the ``e`` of ``1e3`` as Euler's number)."""
    return "\\boxed{" + expand_scientific(answer) + "}"


def _parse(answer: str) -> list[Any]:
    import math_verify

    # Timeouts are disabled here: the worker bounds the whole item with its own alarm, which
    # math-verify's `except Exception` handlers cannot swallow.
    return list(
        math_verify.parse(
            _as_latex(answer),
            extraction_config=[math_verify.LatexExtractionConfig()],
            parsing_timeout=None,
            raise_on_error=False,
        )
    )


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    # Golds repeat across the k samples of a problem; parse each once per worker.
    return tuple(_parse(gold))


class GoldParseError(ValueError):
    """math-verify could not read a gold answer: a label problem, not a model error."""


def math_verify_equal(answer: str, gold: str) -> bool:
    """Whether math-verify finds ``answer`` equal to ``gold`` (both bare LaTeX).

    Runs in a grading worker. Raises GoldParseError when the gold does not parse.
    """
    import math_verify

    parsed_gold = _parse_gold(gold)
    if not parsed_gold:
        raise GoldParseError(f"math-verify cannot parse the gold answer {gold!r}")
    parsed_answer = _parse(answer)
    if not parsed_answer:
        return False
    return bool(math_verify.verify(list(parsed_gold), parsed_answer, timeout_seconds=None))
