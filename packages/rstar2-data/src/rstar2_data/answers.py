"""Answer normalization shared by data filters and evaluation (integer answers first).

Benchmarks and RL sets store integer answers in many spellings ("025", 27.0, "1,000",
"\\boxed{12}"). One function turns them into an ``int`` or says they are not integers, so the data
filters and the grader agree on what an integer answer is.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"^\\(?:boxed|fbox)\s*\{(?P<inner>.*)\}$", re.DOTALL)
_INTEGER = re.compile(r"^[+-]?\d+$")
# Thousands separators only in well-formed groups: "1,000" and "12,345,678", never "1,00".
_GROUPED = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+$")
_INTEGRAL_FLOAT = re.compile(r"^(?P<int>[+-]?\d+)\.0*$")
_LATEX_NOISE = ("$", "\\!", "\\,", "\\;", "\\ ", "{,}")


def unwrap_boxed(text: str) -> str:
    """Strip a ``\\boxed{}`` or ``\\fbox{}`` that wraps the whole string; keep anything else."""
    text = text.strip()
    while (match := _BOXED.match(text)) is not None:
        text = match.group("inner").strip()
    return text


def normalize_integer(answer: str | int | float) -> int | None:
    """The integer an answer spells, or ``None`` when it is not an integer.

    Accepts ints, integral floats (27.0), and strings with leading zeros ("025"), a sign,
    thousands separators ("1,000", "1{,}000"), surrounding ``$`` or ``\\boxed{}``, and a
    trailing ".0". Booleans, non-integral numbers and anything symbolic give ``None``.
    """
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    if isinstance(answer, float):
        return int(answer) if answer.is_integer() else None
    text = unwrap_boxed(answer)
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "" if noise != "{,}" else ",")
    text = text.strip().replace(" ", "")
    if _GROUPED.match(text):
        text = text.replace(",", "")
    if (match := _INTEGRAL_FLOAT.match(text)) is not None:
        text = match.group("int")
    if _INTEGER.match(text):
        return int(text)
    return None
