"""Each math converter on hand-written rows following its dataset's public schema."""

from typing import Any

import pytest

from rstar2_data import MathProblem
from rstar2_data.benchmarks import FieldMap
from rstar2_data.converters import MappedMath, RowError, get_converter


def convert(name: str, row: dict[str, Any]) -> MathProblem:
    problem = get_converter(name).convert(row, source="src", index=5)
    assert isinstance(problem, MathProblem)
    return problem


def test_dapo_processed() -> None:
    row = {
        "prompt": "Find the number of positive divisors of 2024.",
        "solution": "12",
        "data_source": "math_dapo",
        "source_prompt": [{"content": "...", "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "12", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "abc"},
    }
    problem = convert("dapo_processed", row)
    assert (problem.id, problem.problem, problem.answer, problem.answer_kind) == (
        "src-5",
        "Find the number of positive divisors of 2024.",
        "12",
        "integer",
    )


def test_dapo_raw_strips_the_instruction() -> None:
    content = (
        "Solve the following math problem step by step. The last line of your response should be "
        "of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        "problem.\n\nWhat is $2^{10}$?\n\nRemember to put your answer on its own line after "
        '"Answer:".'
    )
    row = {
        "data_source": "math_dapo",
        "prompt": [{"content": content, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "1024", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
    }
    problem = convert("dapo_raw", row)
    assert problem.problem == "What is $2^{10}$?"
    assert problem.id == "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"
    assert problem.answer == "1024"
    with pytest.raises(RowError, match=r"missing field reward_model\.ground_truth"):
        convert("dapo_raw", {**row, "reward_model": {}})


def test_openmathreasoning_keeps_extracted_answers() -> None:
    row = {
        "expected_answer": "\\frac{1}{2}",
        "problem_type": "has_answer_extracted",
        "problem_source": "aops_c4_high_school_math",
        "generation_model": "DeepSeek-R1",
        "pass_rate_72b_tir": "0.5",
        "problem": "Compute $\\int_0^1 x\\,dx$.",
        "generated_solution": "...",
        "inference_mode": "cot",
    }
    problem = convert("openmathreasoning", row)
    assert (problem.answer, problem.answer_kind) == ("\\frac{1}{2}", "expression")
    assert problem.metadata == {
        "problem_source": "aops_c4_high_school_math",
        "problem_type": "has_answer_extracted",
    }
    with pytest.raises(RowError, match="answer not extracted"):
        convert("openmathreasoning", {**row, "problem_type": "converted_proof"})


def test_project_euler() -> None:
    # alexandonian/project-euler columns.
    row = {
        "id": 1,
        "title": "Multiples of 3 or 5",
        "problem": "Find the sum of all the multiples of 3 or 5 below 1000.",
        "question_latex": "...",
        "numerical_answer": "233168",
        "pub_date": "2001-10-05",
        "solved_by": 1000000,
        "diff_rate": "5%",
    }
    problem = convert("project_euler", row)
    assert (problem.id, problem.answer) == ("1", "233168")


@pytest.mark.parametrize(
    ("answer", "normalized", "kind"),
    [
        ("025", "25", "integer"),
        (27.0, "27", "integer"),
        ("\\boxed{1,000}", "1000", "integer"),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", "expression"),
        (2.5, "2.5", "expression"),
    ],
)
def test_field_mapping_normalizes_answers(answer: object, normalized: str, kind: str) -> None:
    converter = MappedMath(FieldMap(problem="q.text", answer="a", id="uid", keep=("tag",)))
    problem = converter.convert(
        {"q": {"text": " Q? "}, "a": answer, "uid": "u1", "tag": "x"}, source="s", index=0
    )
    assert (problem.problem, problem.answer, problem.answer_kind) == ("Q?", normalized, kind)
    assert problem.metadata == {"tag": "x"}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"problem": "Q", "answer": ""}, "empty answer"),
        ({"problem": "", "answer": "1"}, "empty field problem"),
        ({"problem": 3, "answer": "1"}, "field problem is not a string"),
        ({"problem": "Q", "answer": [1]}, "answer is not a string or number"),
        ({"answer": "1"}, "missing field problem"),
    ],
)
def test_malformed_rows_name_the_reason(row: dict[str, Any], reason: str) -> None:
    with pytest.raises(RowError) as caught:
        MappedMath().convert(row, source="s", index=0)
    assert caught.value.reason == reason
