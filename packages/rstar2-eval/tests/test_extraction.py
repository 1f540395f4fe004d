"""Final-answer extraction: the <answer>-block rule, the \\boxed fallback, and box parsing."""

from __future__ import annotations

import pytest

from rstar2_eval import extract_answer, find_boxed


@pytest.mark.parametrize(
    ("text", "boxes"),
    [
        (r"\boxed{5}", ["5"]),
        (r"\boxed {5}", ["5"]),
        (r"\fbox{7}", ["7"]),
        (r"\boxed{\frac{1}{2}}", [r"\frac{1}{2}"]),
        (r"\boxed{\{1, 2\}}", [r"\{1, 2\}"]),
        (r"\boxed{\boxed{3}}", ["3"]),
        (r"first \boxed{1} then \boxed{2}", ["1", "2"]),
        (r"\boxed 25$ is it", ["25"]),
        (r"\boxed{3", []),
        (r"\boxed{}", []),
        (r"\boxed{ \boxed{5}", ["5"]),
        (r"\boxedx{4}", []),
        (r"\\{\boxed{x\\{y}}", [r"x\\{y}"]),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", [r"\left( 3, \frac{\pi}{2} \right)"]),
    ],
)
def test_find_boxed(text: str, boxes: list[str]) -> None:
    assert find_boxed(text) == boxes


def test_answer_block_box_is_the_answer() -> None:
    response = r"<reason>try \boxed{4}</reason><answer>so \boxed{\frac{1}{2}}</answer>"
    extraction = extract_answer(response)
    assert extraction.answer == r"\frac{1}{2}"
    assert extraction.source == "answer_block"
    assert extraction.answer_blocks == 1


def test_last_box_of_the_block_wins() -> None:
    assert extract_answer(r"<answer>\boxed{1} or rather \boxed{2}</answer>").answer == "2"


def test_repeated_answer_blocks_use_the_last_one() -> None:
    extraction = extract_answer(r"<answer>\boxed{1}</answer> wait <answer>\boxed{2}</answer>")
    assert (extraction.answer, extraction.answer_blocks) == ("2", 2)


def test_final_block_left_open_still_counts() -> None:
    # Engines strip the `</answer>` stop string from the text.
    assert extract_answer(r"<answer>The answer is \boxed{42}").answer == "42"


def test_no_answer_block_gives_nothing_under_the_paper_rule() -> None:
    extraction = extract_answer(r"the answer is \boxed{42}")
    assert (extraction.answer, extraction.source, extraction.answer_blocks) == (None, None, 0)


def test_fallback_takes_the_last_box_anywhere() -> None:
    extraction = extract_answer(r"\boxed{41} no, \boxed{42}", boxed_fallback=True)
    assert (extraction.answer, extraction.source) == ("42", "boxed_fallback")


def test_fallback_applies_when_the_block_has_no_box() -> None:
    response = r"\boxed{7} <answer>seven</answer>"
    assert extract_answer(response).answer is None
    extraction = extract_answer(response, boxed_fallback=True)
    assert (extraction.answer, extraction.source, extraction.answer_blocks) == (
        "7",
        "boxed_fallback",
        1,
    )


def test_block_box_beats_fallback() -> None:
    extraction = extract_answer(r"<answer>\boxed{1}</answer> \boxed{2}", boxed_fallback=True)
    assert (extraction.answer, extraction.source) == ("1", "answer_block")


def test_truncated_box_in_block_is_no_answer() -> None:
    assert extract_answer(r"<answer>\boxed{\frac{1}{2}").answer is None


def test_many_unclosed_boxes_do_not_blow_up() -> None:
    # One linear pass: 20,000 unclosed boxes in a 260 KB response still extract nothing.
    response = "<answer>" + r"\boxed{" * 20_000 + "x" * 100_000
    assert extract_answer(response, boxed_fallback=True).answer is None
