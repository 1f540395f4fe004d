"""The synthetic demo: seeded problems with correct answers, and transcripts in the protocol."""

import re
from collections import Counter

import pytest

from rstar2_data import PYTHON_TOOL_NAME, ChatExample, normalize_integer, python_tool_schema
from rstar2_data.demo import (
    FAMILIES,
    demo_problems,
    demo_transcripts,
    generate_tasks,
    run_python,
    task_split,
    to_transcript,
)
from rstar2_data.demo.tasks import _prime_count


def test_same_seed_same_problems_other_seed_other_problems() -> None:
    assert demo_problems(50, seed=7) == demo_problems(50, seed=7)
    assert demo_problems(50, seed=7) != demo_problems(50, seed=8)


def test_problems_cover_families_and_levels_with_integer_answers() -> None:
    problems = demo_problems(200, seed=0)
    assert {p.metadata["family"] for p in problems} == set(FAMILIES)
    assert {p.metadata["level"] for p in problems} == {1, 2, 3}
    assert len({p.id for p in problems}) == 200
    for p in problems:
        assert p.answer_kind == "integer"
        assert str(normalize_integer(p.answer)) == p.answer


def test_levels_and_families_restrict_the_draw() -> None:
    problems = demo_problems(30, seed=1, levels=[1], families=["multiply"])
    assert {(p.metadata["family"], p.metadata["level"]) for p in problems} == {("multiply", 1)}
    # Level 1 multiplies 4-digit numbers: an 7- or 8-digit product.
    assert all(7 <= len(p.answer) <= 8 for p in problems)


def test_higher_levels_are_harder() -> None:
    lengths = {
        level: max(
            len(p.answer) for p in demo_problems(20, seed=2, levels=[level], families=["multiply"])
        )
        for level in (1, 2, 3)
    }
    assert lengths[1] < lengths[2] < lengths[3]


def test_rejects_unknown_family() -> None:
    with pytest.raises(ValueError, match="unknown demo families"):
        generate_tasks(1, seed=0, families=["division"])


@pytest.mark.parametrize(("lo", "hi"), [(1, 1), (2, 2), (1, 100), (90, 200), (500, 648)])
def test_prime_count_matches_trial_division(lo: int, hi: int) -> None:
    expected = sum(1 for n in range(lo, hi + 1) if n > 1 and all(n % d for d in range(2, n)))
    assert _prime_count(lo, hi) == expected


def test_solver_programs_print_the_answer() -> None:
    for task in generate_tasks(40, seed=4):
        result = run_python(task.code, task.stdin)
        assert result.ok, result.stderr
        assert int(result.stdout) == task.answer


def _calls(example: ChatExample) -> list[tuple[str, str]]:
    return [
        (c.function.arguments["code"], c.function.arguments["input"])
        for m in example.messages
        for c in m.tool_calls or []
    ]


def test_transcript_follows_the_agent_protocol() -> None:
    (task,) = generate_tasks(1, seed=5)
    example = to_transcript(task, example_id="x")
    roles = [m.role for m in example.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert example.tools == [python_tool_schema()]
    user, call, tool, final = example.messages
    assert user.content == task.problem
    assert call.content.startswith("<reason>")
    (tool_call,) = call.tool_calls or []
    assert tool_call.function.name == PYTHON_TOOL_NAME
    assert tool.tool_call_id == tool_call.id
    assert tool.content.strip() == str(task.answer)
    assert final.tool_calls is None
    assert final.content.count("<answer>") == 1
    assert final.content.count("</reason>") == 1
    boxed = re.search(r"<answer>\s*\\boxed\{(\d+)\}\s*</answer>$", final.content)
    assert boxed is not None
    assert int(boxed.group(1)) == task.answer


@pytest.mark.parametrize("failure", ["missing_stdin", "name_typo", "syntax"])
def test_failing_call_then_corrected_call(failure: str) -> None:
    for task in generate_tasks(12, seed=6):
        example = to_transcript(task, example_id="x", failure=failure)
        assert [m.role for m in example.messages] == ["user"] + ["assistant", "tool"] * 2 + [
            "assistant"
        ]
        (bad_code, bad_stdin), (good_code, good_stdin) = _calls(example)
        assert (bad_code, bad_stdin) != (good_code, good_stdin)
        assert (good_code, good_stdin) == (task.code, task.stdin)
        failed, succeeded = example.messages[2], example.messages[4]
        assert "Error" in failed.content
        assert succeeded.content.strip() == str(task.answer)
        assert failed.tool_call_id != succeeded.tool_call_id


def test_failure_share_is_exact_and_seeded() -> None:
    examples = demo_transcripts(40, seed=9, failure_share=0.25)
    with_failure = [e for e in examples if len(_calls(e)) == 2]
    assert len(with_failure) == 10
    assert examples == demo_transcripts(40, seed=9, failure_share=0.25)
    kinds = Counter(
        e.messages[2].content.strip().splitlines()[-1].split(":")[0] for e in with_failure
    )
    assert len(kinds) >= 2, kinds
    assert all(len(_calls(e)) == 1 for e in demo_transcripts(10, seed=9, failure_share=0.0))
    with pytest.raises(ValueError, match="failure_share"):
        demo_transcripts(1, seed=0, failure_share=1.5)


def test_custom_tool_response_format() -> None:
    (example,) = demo_transcripts(
        1, seed=0, failure_share=1.0, tool_response=lambda r: f"ok={r.ok}"
    )
    assert [m.content for m in example.messages if m.role == "tool"] == ["ok=False", "ok=True"]


def test_runner_reports_errors_without_install_paths() -> None:
    result = run_python("x = int(input())\nprint(1 / x)\n", "0\n")
    assert not result.ok
    lines = result.stderr.splitlines()
    # As rstar2-sandbox shows it: the program is main.py and its source line is quoted (the
    # caret line under it varies across Python versions).
    assert lines[:3] == [
        "Traceback (most recent call last):",
        '  File "main.py", line 2, in <module>',
        "    print(1 / x)",
    ]
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert "rstar2_data" not in result.stderr
    assert run_python("print(input()[::-1])", "abc\n").stdout == "cba\n"


def test_train_and_heldout_splits_are_disjoint_and_fixed_by_the_problem() -> None:
    train = generate_tasks(400, seed=0, split="train")
    heldout = generate_tasks(100, seed=1, split="heldout")
    assert len(train) == 400
    assert len(heldout) == 100
    assert {(t.family, t.stdin) for t in train}.isdisjoint({(t.family, t.stdin) for t in heldout})
    assert all(task_split(t) == "train" for t in train)
    assert all(task_split(t) == "heldout" for t in heldout)
    # The partition holds out about the configured share of all draws.
    drawn = generate_tasks(2000, seed=3)
    share = sum(task_split(t) == "heldout" for t in drawn) / len(drawn)
    assert 0.07 < share < 0.13
    # Problem ids say which split they come from; transcripts follow the same split.
    assert demo_problems(2, seed=1, split="heldout")[0].id == "demo-heldout-1-0"
    sft = demo_transcripts(50, seed=0, split="train")
    assert all(task_split(t) == "train" for t in generate_tasks(50, seed=0, split="train"))
    assert len(sft) == 50


def test_split_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="split must be"):
        generate_tasks(1, seed=0, split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="heldout_share"):
        generate_tasks(1, seed=0, heldout_share=1.0)


def test_direct_answers_are_level_one_correct_and_make_no_call() -> None:
    tasks = generate_tasks(60, seed=4, levels=(1, 2))
    examples = demo_transcripts(60, seed=4, levels=(1, 2), failure_share=0.25, direct_share=0.5)
    direct = [(t, e) for t, e in zip(tasks, examples, strict=True) if not _calls(e)]
    failing = [e for e in examples if len(_calls(e)) == 2]
    small_clean = sum(
        t.level == 1 and len(_calls(e)) == 1 for t, e in zip(tasks, examples, strict=True)
    )
    assert len(failing) == 15  # direct answers take nothing from the failure share
    assert direct
    assert len(direct) == round(0.5 * (len(direct) + small_clean))
    for task, example in direct:
        assert task.level == 1
        assert [m.role for m in example.messages] == ["user", "assistant"]
        reply = example.messages[1].content
        assert reply.startswith("<reason>\n")
        assert reply.count("<answer>") == 1
        assert f"\\boxed{{{task.answer}}}" in reply
    # The same seed gives the same transcripts, and direct_share=0 changes nothing else.
    assert examples == demo_transcripts(
        60, seed=4, levels=(1, 2), failure_share=0.25, direct_share=0.5
    )
    plain = demo_transcripts(60, seed=4, levels=(1, 2), failure_share=0.25)
    assert all(_calls(e) for e in plain)
    assert [e for e in examples if _calls(e)] == [
        p for p, e in zip(plain, examples, strict=True) if _calls(e)
    ]
    with pytest.raises(ValueError, match="direct_share"):
        demo_transcripts(1, seed=0, direct_share=-0.1)
    with pytest.raises(ValueError, match="cannot have a failure"):
        to_transcript(tasks[0], example_id="x", failure="syntax", direct=True)
