"""Answer normalization shared by data filters and evaluation (integer answers first).

Benchmarks and RL sets store integer answers in many spellings ("025", 27.0, "1,000",
"\\boxed{12}"). One function turns them into canonical digits or says they are not integers, so
the data filters and the grader agree on what an integer answer is. Integers stay digit strings:
Python refuses ``int(text)`` beyond ``sys.get_int_max_str_digits()`` digits (4,300 by default),
and an answer that long must not stop a build or a grading batch.
"""

from __future__ import annotations

import decimal
import re
import sys

_BOXED = re.compile(r"^\\(?:boxed|fbox)\s*\{(?P<inner>.*)\}$", re.DOTALL)
_INTEGER = re.compile(r"^[+-]?\d+$")
# Thousands separators only in well-formed groups: "1,000" and "12,345,678", never "1,00".
_GROUPED = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+$")
_INTEGRAL_FLOAT = re.compile(r"^(?P<int>[+-]?\d+)\.0*$")
_LATEX_NOISE = ("$", "\\!", "\\,", "\\;", "\\ ", "{,}")
_CANONICAL = re.compile(r"-?[1-9][0-9]*|0")


def unwrap_boxed(text: str) -> str:
    """Strip a ``\\boxed{}`` or ``\\fbox{}`` that wraps the whole string; keep anything else."""
    text = text.strip()
    while (match := _BOXED.match(text)) is not None:
        text = match.group("inner").strip()
    return text


def canonical_integer(answer: str | int | float) -> str | None:
    """The decimal digits of the integer an answer spells (``-`` for negatives, no leading
    zeros, ``0`` unsigned), or ``None`` when it is not an integer. Any length.

    Accepts ints, integral floats (27.0), and strings with leading zeros ("025"), a sign,
    thousands separators ("1,000", "1{,}000"), surrounding ``$`` or ``\\boxed{}``, and a
    trailing ".0". Booleans, non-integral numbers and anything symbolic give ``None``.
    """
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        # Decimal formats an int of any size; str() is bounded by the int-string limit.
        return format(decimal.Decimal(answer), "f")
    if isinstance(answer, float):
        return canonical_integer(int(answer)) if answer.is_integer() else None
    if _CANONICAL.fullmatch(answer):  # already canonical: most answers a build sees twice
        return answer
    text = unwrap_boxed(answer)
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "" if noise != "{,}" else ",")
    text = text.strip().replace(" ", "")
    if _GROUPED.match(text):
        text = text.replace(",", "")
    if (match := _INTEGRAL_FLOAT.match(text)) is not None:
        text = match.group("int")
    if not _INTEGER.match(text):
        return None
    negative = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0") or "0"
    return f"-{digits}" if negative and digits != "0" else digits


def integer_digits(canonical: str) -> int:
    """How many digits a ``canonical_integer`` result has (its sign not counted)."""
    return len(canonical) - canonical.startswith("-")


def normalize_integer(answer: str | int | float) -> int | None:
    """The integer an answer spells (see ``canonical_integer``), or ``None`` when it is not one.

    Raises ``ValueError`` for an integer with more digits than Python converts
    (``sys.get_int_max_str_digits()``); ``canonical_integer`` handles any length.
    """
    canonical = canonical_integer(answer)
    if canonical is None:
        return None
    limit = sys.get_int_max_str_digits()
    if limit and integer_digits(canonical) > limit:
        raise ValueError(
            f"the integer has {integer_digits(canonical)} digits, more than Python converts "
            f"({limit}); use canonical_integer for its digits"
        )
    return int(canonical)
