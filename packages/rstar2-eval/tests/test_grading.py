"""Grading: the integer fast path, math-verify equivalences, multiple choice, batch APIs."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_eval import Grader, GraderConfig, agrade_many


def test_integer_fast_path_never_starts_workers() -> None:
    golds = ["25", "1000", "27", "-3", "0"]
    answers = ["025", "1,000", "27.0", "-3", "0"]
    with Grader(GraderConfig(workers=1)) as grader:
        grades = grader.grade_answers(answers, golds)
        assert not grader.pool_started
    assert [(g.correct, g.method) for g in grades] == [(True, "integer")] * 5


def test_integer_fast_path_rejects_wrong_integers() -> None:
    with Grader(GraderConfig(workers=1)) as grader:
        grades = grader.grade_answers(["24", "1000", "-25"], ["25", "100", "25"])
        assert not grader.pool_started
    assert [(g.status, g.method) for g in grades] == [("incorrect", "integer")] * 3


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac12", r"\frac{1}{2}"),
        (r"\sqrt{18}", r"3\sqrt{2}"),
        (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"),
        ("[1, 2)", r"\left[1,2\right)"),
        (r"(-\infty, 3]", r"\left(-\infty,3\right]"),
        (r"\{2, 1\}", r"\{1,2\}"),
        ("(3, \\pi/2)", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"10\%", "0.1"),
        ("1+x^2", "x^2+1"),
        (r"\frac{50}{2}", "25"),  # integer gold, non-integer spelling: math-verify decides
        ("2, 1", "1, 2"),
    ],
)
def test_latex_equivalences(grader: Grader, answer: str, gold: str) -> None:
    (grade,) = grader.grade_answers([answer], [gold])
    assert grade.correct, grade
    assert grade.method == "math_verify"


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        (r"\frac{1}{3}", "0.5"),
        (r"2\sqrt{2}", r"3\sqrt{2}"),
        ("(1, 2)", "[1,2]"),
        ("x^2-1", "x^2+1"),
        (r"\frac{49}{2}", "25"),
        ("1,00", "100"),  # not a well-formed thousands group: not the integer 100
    ],
)
def test_latex_non_equivalences(grader: Grader, answer: str, gold: str) -> None:
    (grade,) = grader.grade_answers([answer], [gold])
    assert grade.status == "incorrect", grade


def test_math500_golds_verify_against_themselves(grader: Grader, data_dir) -> None:  # type: ignore[no-untyped-def]
    from rstar2_eval import load_benchmark

    problems = [p for p in load_benchmark("math500", data_dir) if p.answer_kind != "integer"]
    golds = [p.answer for p in problems]
    # \displaystyle changes the text, not the meaning: math-verify, not string equality, decides.
    grades = grader.grade_answers([r"\displaystyle " + gold for gold in golds], golds)
    assert {g.method for g in grades} == {"math_verify"}
    failed = [(g.answer, g.status) for g in grades if not g.correct]
    assert not failed


def test_identical_text_needs_no_workers() -> None:
    with Grader(GraderConfig(workers=1)) as grader:
        grades = grader.grade_answers(
            [r"\frac {1}{2}", r"x \in [-2,7]"], [r"\frac{1}{2}", r"x\in[-2,7]"]
        )
        assert not grader.pool_started
    assert [(g.correct, g.method) for g in grades] == [(True, "exact")] * 2


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [
        ("B", "B", True),
        ("(B)", "B", True),
        (r"\text{B}", "B", True),
        (r"\textbf{(C)} 42", "C", True),
        ("b", "B", True),
        ("Option D", "D", True),
        ("A", "B", False),
        ("Because", "B", False),
    ],
)
def test_choice_answers(answer: str, gold: str, correct: bool) -> None:
    with Grader(GraderConfig(workers=1)) as grader:
        (grade,) = grader.grade_answers([answer], [gold], answer_format="choice")
        assert not grader.pool_started
    assert (grade.correct, grade.method) == (correct, "choice")


def test_grade_many_extracts_then_grades(grader: Grader) -> None:
    responses = [
        r"<reason>...</reason><answer>\boxed{025}</answer>",
        r"<answer>\boxed{\frac{2}{4}}</answer>",
        r"no tags \boxed{25}",
        r"<answer>\boxed{26}</answer>",
    ]
    grades = grader.grade_many(responses, ["25", "0.5", "25", "25"])
    assert [g.status for g in grades] == ["correct", "correct", "no_answer", "incorrect"]
    assert [g.source for g in grades] == ["answer_block", "answer_block", None, "answer_block"]
    assert [g.answer_blocks for g in grades] == [1, 1, 0, 1]


def test_fallback_config_changes_the_verdict() -> None:
    with Grader(GraderConfig(workers=1, boxed_fallback=True)) as grader:
        (grade,) = grader.grade_many([r"no tags \boxed{25}"], ["25"])
    assert (grade.correct, grade.source) == (True, "boxed_fallback")


def test_overlong_answer_is_ungradable_without_parsing() -> None:
    with Grader(GraderConfig(workers=1, max_answer_chars=100)) as grader:
        (grade,) = grader.grade_answers(["1+" * 50_000 + "1"], ["2"])
        assert not grader.pool_started
    assert grade.status == "ungradable"
    assert "100001 characters" in (grade.detail or "")


def test_integers_beyond_the_int_string_limit_grade_as_digit_strings() -> None:
    huge = "7" * 5000  # int(text) refuses more than 4,300 digits
    with Grader(GraderConfig(workers=1, max_answer_chars=10_000)) as grader:
        grades = grader.grade_answers(
            [f"000{huge}", huge + "8", "7", "3"], [huge, huge + "7", huge, "3"]
        )
        assert not grader.pool_started
    assert [(g.status, g.method) for g in grades] == [
        ("correct", "integer"),
        ("incorrect", "integer"),
        ("incorrect", "integer"),
        ("correct", "integer"),
    ]


def test_an_answer_too_long_to_grade_is_marked_alone() -> None:
    huge = "7" * 5000
    with Grader(GraderConfig(workers=1)) as grader:  # max_answer_chars 2000
        grades = grader.grade_many(
            [f"<answer>\\boxed{{{huge}}}</answer>", "<answer>\\boxed{3}</answer>"], [huge, "3"]
        )
    assert [g.status for g in grades] == ["ungradable", "correct"]


def test_mixed_formats_in_one_batch(grader: Grader) -> None:
    grades = grader.grade_answers(
        ["B", r"\frac{1}{2}", "7"], ["B", "0.5", "7"], answer_format=["choice", "math", "math"]
    )
    assert [(g.correct, g.method) for g in grades] == [
        (True, "choice"),
        (True, "math_verify"),
        (True, "integer"),
    ]


def test_length_mismatch_is_an_error(grader: Grader) -> None:
    with pytest.raises(ValueError, match="2 answers but 1 golds"):
        grader.grade_answers(["1", "2"], ["1"])


def test_async_variant_matches_sync(grader: Grader) -> None:
    responses = [r"<answer>\boxed{\sqrt{4}}</answer>", r"<answer>\boxed{3}</answer>"]
    grades = asyncio.run(grader.agrade_many(responses, ["2", "2"]))
    assert [g.correct for g in grades] == [True, False]


def test_one_shot_async_function() -> None:
    grades = asyncio.run(
        agrade_many([r"<answer>\boxed{12}</answer>"], ["12"], config=GraderConfig(workers=1))
    )
    assert grades[0].correct
