"""Answer notation read before math-verify: units, scientific notation, prose in a box."""

from __future__ import annotations

import pytest

from rstar2_eval import Grader
from rstar2_eval.notation import expand_scientific, is_prose, split_unit


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [
        ("5 m", "5", "m"),
        ("5 cm", "5", "cm"),
        (r"5\,\text{cm}", "5", "cm"),
        (r"5\text{ cm}", "5", "cm"),
        (r"5\mathrm{cm}^2", "5", "cm^2"),
        ("5 cm^{2}", "5", "cm^2"),
        ("5 centimeters", "5", "cm"),
        ("5 meters", "5", "m"),
        ("9.8 m/s^2", "9.8", "m/s^2"),
        (r"\frac{1}{2}\text{ m}", r"\frac{1}{2}", "m"),
        ("10^{3} m", "10^{3}", "m"),
        ("3 feet", "3", "ft"),
        ("12 inches", "12", "in"),
        ("5 square units", "5", "squareunit"),
        ("3 apples", "3", "apple"),
        # Not a number with a unit: left whole for math-verify.
        ("2x", "2x", None),  # a product, not a unit
        ("2 x", "2 x", None),  # a lone letter that is no unit symbol is a variable
        (r"x \text{ cm}", r"x \text{ cm}", None),  # the value is not a plain number
        (r"\text{Sunday}", r"\text{Sunday}", None),
        (r"1\,000", r"1\,000", None),
        (r"5 \text{ and } 6", r"5 \text{ and } 6", None),
    ],
)
def test_split_unit(text: str, value: str, unit: str | None) -> None:
    assert split_unit(text) == (value, unit)


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("1e3", r"1\times10^{3}"),
        ("2.5e-3", r"2.5\times10^{-3}"),
        ("1E3", r"1\times10^{3}"),
        ("6.02E+23", r"6.02\times10^{+23}"),
        (".5e2", r".5\times10^{2}"),
        # Euler's number and names stay as they are.
        ("2e", "2e"),
        ("3e^2", "3e^2"),
        ("e3", "e3"),
        ("x1e3", "x1e3"),
        ("12e3x", "12e3x"),
    ],
)
def test_expand_scientific(text: str, expanded: str) -> None:
    assert expand_scientific(text) == expanded


@pytest.mark.parametrize(
    "text",
    [
        "0, so the answer is 0",
        "the answer is 5",
        r"\text{the answer is } 5",
        "0, so 0",
        "The answer: 5",
        "therefore 12",
        r"x = 3, \text{hence } 3",
        r"\text{so } x = 3 \text{ gives } 3",
        "5 so 5",
    ],
)
def test_prose(text: str) -> None:
    assert is_prose(text)


@pytest.mark.parametrize(
    "text",
    [
        "3 feet 4 inches",  # a phrase after a number is a unit
        "1 hour and 30 minutes",
        "5 square units",
        "5 and 6",
        "x = 1 or x = 2",
        r"\sin 30",
        "sin 30",
        r"\log_2 8",
        r"\gcd(4, 6)",
        r"\operatorname{lcm}(4, 6)",
        r"4 \pmod 5",
        "No solution",
        r"\text{Sunday}",
        r"\text{(B)} 5",
        r"2.5 \times 10^{3}",
        r"\{1, 2\}",
        "x^2+1",
    ],
)
def test_not_prose(text: str) -> None:
    assert not is_prose(text)


@pytest.mark.parametrize(
    ("answer", "gold", "status", "method"),
    [
        ("5 m", "5 cm", "incorrect", "units"),
        ("5 m", r"5\,\text{cm}", "incorrect", "units"),
        ("50 mm", "5 cm", "incorrect", "units"),  # units are compared, not converted
        ("5 cm^2", "5 cm", "incorrect", "units"),
        ("5 min", "5 m", "incorrect", "units"),
        (r"5\,\text{cm}", "5 cm", "correct", "integer"),
        ("5 centimeters", r"5\text{ cm}", "correct", "integer"),
        (r"5\mathrm{cm}^{2}", "5 cm^2", "correct", "integer"),
        ("5", "5 cm", "correct", "integer"),  # one side states no unit: numbers compared
        (r"5\text{ cm}", "5", "correct", "integer"),
        (r"\frac{1}{2}\text{ m}", "0.5 m", "correct", "math_verify"),
        ("6 m", "5 m", "incorrect", "integer"),
    ],
)
def test_units_are_compared_when_both_sides_state_them(
    grader: Grader, answer: str, gold: str, status: str, method: str
) -> None:
    (grade,) = grader.grade_answers([answer], [gold])
    assert (grade.status, grade.method) == (status, method), grade
    assert grade.answer == answer


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("1e3", "1000", True),
        ("1E3", "1000", True),
        ("2.5e-3", "0.0025", True),
        ("2.5e-3", r"2.5\times 10^{-3}", True),
        ("4E2", "400", True),
        ("1e3", "10^{3}", True),
        ("10^{3}", "1000", True),
        ("6.02e23", r"6.02\times10^{23}", True),
        ("1e3", "100", False),
        ("2.5e-3", "0.025", False),
        ("1e-3", "1000", False),
        ("2e", "2e", True),  # Euler's number: the same text
    ],
)
def test_scientific_notation_parses(grader: Grader, answer: str, gold: str, correct: bool) -> None:
    (grade,) = grader.grade_answers([answer], [gold])
    assert grade.correct is correct, grade


@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("0, so the answer is 0", "0", "no_answer"),
        ("0 so the answer is 0", "0", "no_answer"),
        ("the answer is 5", "5", "no_answer"),
        (r"\text{the answer is } 5", "5", "no_answer"),
        ("0, so 0", "0", "no_answer"),
        ("Answer: 12", "12", "no_answer"),
        ("Answer: -12", "-12", "no_answer"),
        # Neighbours that are answers.
        ("5 and 6", "5, 6", "correct"),
        ("x = 3", "3", "correct"),
        (r"5\text{ square units}", "5", "correct"),
        ("3 apples", "3", "correct"),
        (r"\{1, 2\}", r"\{2, 1\}", "correct"),
        ("(1, 2)", "(1,2)", "correct"),
        (r"\text{No solution}", r"\text{No solution}", "correct"),
    ],
)
def test_a_box_holding_prose_is_not_an_answer(
    grader: Grader, answer: str, gold: str, status: str
) -> None:
    (grade,) = grader.grade_answers([answer], [gold])
    assert grade.status == status, grade
    if status == "no_answer":
        assert (grade.method, grade.answer) == ("prose", answer)
