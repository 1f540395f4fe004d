"""How an answer is written: scientific notation, a trailing unit, or prose instead of an answer.

math-verify reads ``1e3`` as ``1 * e * 3`` (Euler's number), drops any unit it recognizes (so
``5 m`` equals ``5 cm``), and reads English words as products of one-letter symbols (so
``0, so the answer is 0`` becomes the set ``{0, s*o*...*0} = {0}``). These rules run before it:

- **Scientific notation**: a number followed directly by ``e``/``E`` and an integer exponent
  (``2.5e-3``, ``1E3``; not preceded by a letter, digit or backslash) means ``2.5 \\times 10^{-3}``.
- **Units**: a unit is trailing text after a plain number: a ``\\text{}``-like group
  (``5\\,\\text{cm}``, ``3\\mathrm{m}^2``) or, after a space, a word (``5 cm``, ``3 apples``) or
  a one-letter unit symbol (``5 m``, ``2 s``; other single letters are variables). When both
  sides state a unit, the units must match (after spelling normalization: ``cm`` =
  ``\\text{ cm}`` = ``centimeters``; no conversion, so ``50 mm`` is not ``5 cm``); when one side
  states none, the unit is dropped and the numbers are compared.
- **Prose**: a box holds prose, not an answer, when a phrase of words (two letters or more)
  is followed by a number (``so the answer is 0``, ``\\text{the answer is } 5``, ``0, so 0``),
  unless the phrase ends with ``and``/``or`` or a function name (``5 and 6``, ``sin 30``), or
  follows a number without a sentence word (``is``, ``the``, ``so``, ``answer``, ...): that is
  a unit (``3 feet 4 inches``, ``1 hour and 30 minutes``).
"""

from __future__ import annotations

import re

# \text{...}-like groups: their content is plain text (units, words).
_TEXT_GROUP = re.compile(
    r"\\(?:text|textrm|textnormal|textup|textit|textbf|mathrm|mathit|mbox|operatorname)\s*"
    r"\{([^{}]*)\}"
)
_SPACING = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad")
_SCIENTIFIC = re.compile(r"(?<![\w\\.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
# A plain number: digits, decimal points, signs, fractions, roots, pi and products of those.
_NUMBER_COMMANDS = ("frac", "dfrac", "tfrac", "sqrt", "pi", "times", "cdot", "left", "right")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_UNIT = re.compile(
    r"^(?P<value>.*?[\d}.)])\s*(?P<unit>[A-Za-z°][A-Za-z°\s/.\-]*(?:\^\s*(?:\{-?\d+\}|-?\d))?)$"
)
_POWER_TAIL = re.compile(r"\s*(?:\^\s*(?:\{-?\d+\}|-?\d))?\s*")
# One-letter unit symbols: other single letters after a number are variables.
_LETTER_UNITS = frozenset("mgshLlKJWV")
# Long names and abbreviations of the same unit (singular; plurals are folded first).
_UNIT_ALIASES = {
    "meter": "m",
    "metre": "m",
    "centimeter": "cm",
    "centimetre": "cm",
    "millimeter": "mm",
    "millimetre": "mm",
    "kilometer": "km",
    "kilometre": "km",
    "second": "s",
    "sec": "s",
    "minute": "min",
    "hour": "h",
    "hr": "h",
    "gram": "g",
    "kilogram": "kg",
    "liter": "L",
    "litre": "L",
    "l": "L",
    "foot": "ft",
    "feet": "ft",
    "inch": "in",
    "inche": "in",
    "mile": "mi",
    "yard": "yd",
    "degree": "°",
    "deg": "°",
}
_CONNECTIVES = frozenset({"and", "or"})
# Words of a sentence, never of a unit: "0 so the answer is 0" is prose, "3 feet 4 in" is not.
_SENTENCE_WORDS = frozenset(
    {"is", "are", "was", "so", "the", "thus", "hence", "therefore", "answer", "equals", "gives"}
    | {"get", "we", "which", "since", "because", "then"}
)
_FUNCTIONS = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh"}
    | {"tanh", "log", "ln", "lg", "exp", "lim", "max", "min", "sup", "inf", "gcd", "lcm", "mod"}
    | {"det", "deg", "dim", "ker", "sqrt", "frac", "pi"}
)
# Words, numbers and single other characters, in order (whitespace skipped).
_TOKEN = re.compile(r"[A-Za-z]+|\d+|\S")


def expand_scientific(text: str) -> str:
    """``2.5e-3`` -> ``2.5\\times10^{-3}`` wherever a number is written in E notation."""
    return _SCIENTIFIC.sub(r"\1\\times10^{\2}", text)


def _plain(text: str) -> str:
    """``text`` with ``\\text{}``-like groups unwrapped and LaTeX spacing as spaces."""
    text = _SPACING.sub(" ", text)
    previous = None
    while previous != text:
        previous, text = text, _TEXT_GROUP.sub(r" \1 ", text)
    return " ".join(text.split())


def _is_number(value: str) -> bool:
    """Whether ``value`` is a plain number (no variables), so what follows it can be a unit."""
    commands = _COMMAND.findall(value)
    if any(name not in _NUMBER_COMMANDS for name in commands):
        return False
    bare = _COMMAND.sub("", value)
    return any(c.isdigit() for c in bare) and not any(c.isalpha() for c in bare)


def _unit_key(unit: str) -> str:
    """A unit's spelling normalized: spacing, braces, plurals and long names folded."""
    unit = unit.replace("{", "").replace("}", "").replace(" ", "")
    power = ""
    if "^" in unit:
        unit, _, power = unit.partition("^")
        power = "^" + power
    parts = []
    for part in re.split(r"([/.\-])", unit):
        if part in "/.-":
            parts.append(part)
            continue
        folded = part.removesuffix("s") if len(part) > 3 else part
        parts.append(_UNIT_ALIASES.get(part, _UNIT_ALIASES.get(folded, folded)))
    return "".join(parts) + power


def _ends_with_text_group(text: str) -> bool:
    groups = list(_TEXT_GROUP.finditer(text))
    return bool(groups) and _POWER_TAIL.fullmatch(text[groups[-1].end() :]) is not None


def split_unit(text: str) -> tuple[str, str | None]:
    """``(value, unit key)`` when ``text`` is a plain number with a trailing unit, else
    ``(text, None)``. The value keeps its LaTeX, without the unit."""
    plain = _plain(text)
    match = _UNIT.match(plain)
    if match is None or not _is_number(match.group("value")):
        return text, None
    value, unit = match.group("value"), match.group("unit").strip()
    if not _ends_with_text_group(text):
        # A bare unit is set off by a space ("2x" is a product), and a lone letter must be a
        # unit symbol ("2 x" is a product too).
        symbol = unit.split("^")[0].strip()
        if plain[len(value)] != " " or (len(symbol) == 1 and symbol not in _LETTER_UNITS):
            return text, None
    return value.strip(), _unit_key(unit)


def is_prose(text: str) -> bool:
    """Whether a box holds a sentence rather than an answer (see the module's rules).

    One pass over the tokens (words, numbers, other characters), so a long answer of words
    costs linear time.
    """
    plain = _COMMAND.sub(
        lambda m: f" {m.group(1)} " if m.group(1) in _FUNCTIONS else " ", _plain(text)
    )
    phrase: list[str] = []  # words of two letters or more, one after the other
    after_number = False  # the phrase follows a number
    joined = False  # a ':' or a sign stands between the phrase and the next token
    previous = ""
    for token in _TOKEN.findall(plain):
        if token[0].isdigit():
            if phrase and _is_sentence(phrase, after_number=after_number):
                return True
            phrase, joined = [], False
        elif token.isalpha() and len(token) > 1 and not joined:
            if not phrase:
                after_number = previous[:1].isdigit()
            phrase.append(token.lower())
        elif token in ":+-." and phrase:
            joined = True  # "Answer: -5"
        else:
            phrase, joined = [], False
        previous = token
    return False


def _is_sentence(phrase: list[str], *, after_number: bool) -> bool:
    """Whether a phrase followed by a number is prose (not a connective, function or unit)."""
    if phrase[-1] in _CONNECTIVES or phrase[-1] in _FUNCTIONS:
        return False  # "5 and 6", "x = 1 or 2", "sin 30"
    # A phrase after a number without a sentence word is a unit: "3 feet 4 inches".
    return not after_number or bool(set(phrase) & _SENTENCE_WORDS)
