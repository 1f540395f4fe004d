"""Integer answer normalization, as shared by the data filters and the evaluator."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rstar2_data import canonical_integer, integer_digits, normalize_integer, unwrap_boxed


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("025", 25),
        ("27.0", 27),
        (27.0, 27),
        ("1,000", 1000),
        ("12,345,678", 12345678),
        ("1{,}000", 1000),
        ("\\boxed{12}", 12),
        ("\\boxed{\\boxed{ 7 }}", 7),
        ("$-3$", -3),
        ("+8", 8),
        (104, 104),
        ("\\fbox{0}", 0),
    ],
)
def test_integer_spellings_normalize(answer: str | int | float, expected: int) -> None:
    assert normalize_integer(answer) == expected


@pytest.mark.parametrize(
    "answer", ["1,00", "2.5", 2.5, "\\frac{1}{2}", "x+1", "", "1e3", True, "\\sqrt{2}", "12a"]
)
def test_non_integers_give_none(answer: str | int | float) -> None:
    assert normalize_integer(answer) is None


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_every_integer_spelling_round_trips(value: int) -> None:
    assert normalize_integer(str(value)) == value
    assert normalize_integer(f"\\boxed{{{value}}}") == value
    assert normalize_integer(f"{value:,}") == value
    assert normalize_integer(f"{value}.00") == value


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("-0", "0"),
        ("+000", "0"),
        ("-007", "-7"),
        ("$1{,}000$", "1000"),
        (1e20, "100000000000000000000"),
    ],
)
def test_canonical_integer_spellings(answer: str | int | float, expected: str) -> None:
    assert canonical_integer(answer) == expected


def test_integers_beyond_the_int_string_limit_stay_digit_strings() -> None:
    digits = "12345" * 1000  # 5,000 digits: int(text) raises ValueError here
    assert canonical_integer(f"\\boxed{{-000{digits}}}") == f"-{digits}"
    assert canonical_integer(f"{digits}.0") == digits
    assert integer_digits(f"-{digits}") == 5000
    assert canonical_integer(f"{digits}.5") is None
    with pytest.raises(ValueError, match="5000 digits"):
        normalize_integer(digits)
    assert canonical_integer(-(10**5000)) == "-1" + "0" * 5000


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_canonical_integer_is_str_of_the_integer(value: int) -> None:
    assert canonical_integer(f"{value:,}") == str(value)
    assert canonical_integer(value) == str(value)


def test_unwrap_boxed_keeps_partial_boxes() -> None:
    assert unwrap_boxed(" \\boxed{a} + 1 ") == "\\boxed{a} + 1"
    assert unwrap_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
