"""TrajectoryQuality: the paper's penalties on worked examples, and record validation."""

import pytest

from rstar2_algo import TrajectoryQuality


def quality(**overrides: object) -> TrajectoryQuality:
    fields: dict[str, object] = {
        "tool_calls": 0,
        "parse_errors": 0,
        "runtime_errors": 0,
        "timeouts": 0,
        "other_errors": 0,
        "answer_tags": 1,
        "turns": 1,
        "truncated": False,
    }
    fields.update(overrides)
    return TrajectoryQuality(**fields)  # type: ignore[arg-type]


def test_clean_trajectory_has_zero_penalty() -> None:
    # Four tool calls that all ran, one answer at the end: nothing to penalise.
    q = quality(tool_calls=4, turns=5, answer_tags=1)
    assert q.tool_error_ratio == 0.0
    assert q.format_penalty == 0.0
    assert q.penalty == 0.0


def test_tool_error_ratio_counts_every_kind_of_failure() -> None:
    # 8 calls: one parse error, two runtime errors, one timeout, one other -> 5/8 failed.
    q = quality(tool_calls=8, parse_errors=1, runtime_errors=2, timeouts=1, other_errors=1, turns=9)
    assert q.failed_tool_calls == 5
    assert q.tool_error_ratio == pytest.approx(5 / 8)


def test_timeouts_and_parse_failures_count_as_errors() -> None:
    # The released code only looked for "error" in the tool output and missed these two kinds.
    assert quality(tool_calls=2, timeouts=1, turns=3).tool_error_ratio == 0.5
    assert quality(tool_calls=2, parse_errors=2, turns=3).tool_error_ratio == 1.0


def test_no_tool_call_gives_neutral_error_ratio() -> None:
    assert quality(tool_calls=0).tool_error_ratio == 0.5


def test_missing_answer_gives_full_format_penalty() -> None:
    q = quality(tool_calls=2, runtime_errors=1, answer_tags=0, turns=3)
    assert q.format_penalty == 1.0
    assert q.penalty == pytest.approx(0.5 + 1.0)


def test_repeated_answers_are_penalised_per_turn() -> None:
    # 3 answers over 4 turns: (3 - 1) / 4.
    assert quality(tool_calls=3, answer_tags=3, turns=4).format_penalty == pytest.approx(0.5)
    # The penalty saturates at 1: 6 answers over 2 turns would be 5/2.
    assert quality(tool_calls=1, answer_tags=6, turns=2).format_penalty == 1.0


def test_rollout_without_a_turn_gets_neutral_error_ratio_and_full_format_penalty() -> None:
    # The engine failed the first request: no turn, so no tool call and no answer.
    q = quality(turns=0, answer_tags=0, truncated=True)
    assert q.tool_error_ratio == 0.5
    assert q.format_penalty == 1.0
    assert q.penalty == pytest.approx(0.5 + 1.0)


def test_truncated_flag_does_not_change_the_penalty() -> None:
    base = quality(tool_calls=3, runtime_errors=1, answer_tags=0, turns=4)
    cut = quality(tool_calls=3, runtime_errors=1, answer_tags=0, turns=4, truncated=True)
    assert cut.penalty == base.penalty


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tool_calls": -1}, "tool_calls must be >= 0"),
        ({"answer_tags": -2}, "answer_tags must be >= 0"),
        ({"turns": -1, "answer_tags": 0}, "turns must be >= 0"),
        ({"turns": 0}, "answer_tags must be 0 when turns=0, got 1"),
        ({"turns": 0, "answer_tags": 0, "tool_calls": 1}, "tool_calls must be 0 when turns=0"),
        ({"tool_calls": 2, "runtime_errors": 2, "timeouts": 1}, "must not exceed tool_calls=2"),
        ({"tool_calls": 1.0}, "tool_calls must be an int"),
        ({"timeouts": True}, "timeouts must be an int"),
        ({"truncated": 1}, "truncated must be a bool"),
    ],
)
def test_inconsistent_records_are_rejected(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quality(**overrides)
