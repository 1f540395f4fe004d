"""Seeded demo datasets: integer-answer problems for RL and tool-using SFT transcripts."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Literal

from rstar2_data.demo.runner import Execution, run_python
from rstar2_data.demo.tasks import FAMILIES, LEVELS, Level, TaskInstance
from rstar2_data.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    REASON_CLOSE,
    REASON_OPEN,
    ToolCall,
)
from rstar2_data.schemas import ChatExample, ChatMessage, MathProblem
from rstar2_data.tools import PYTHON_TOOL_NAME, python_tool_arguments, python_tool_schema

DEMO_SOURCE = "rstar2/demo"
ToolResponseFormatter = Callable[[Execution], str]
Split = Literal["all", "train", "heldout"]
SPLITS: tuple[Split, ...] = ("all", "train", "heldout")
DEFAULT_HELDOUT_SHARE = 0.1
# Rejection sampling for a split: this many draws per wanted problem before giving up.
_DRAWS_PER_ROW = 1000


def task_split(task: TaskInstance, heldout_share: float = DEFAULT_HELDOUT_SHARE) -> Split:
    """``heldout`` or ``train``, from a hash of the problem itself (family and numbers).

    The partition depends on nothing else (not the seed, the count or the other problems), so
    a held-out set and any training set drawn with the same share never share a problem.
    """
    digest = hashlib.sha256(f"{task.family}|{task.stdin}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return "heldout" if fraction < heldout_share else "train"


def plain_tool_response(execution: Execution) -> str:
    """What the program printed, followed by its error when it failed."""
    return execution.stdout + execution.stderr


def generate_tasks(
    n: int,
    *,
    seed: int,
    levels: Sequence[Level] = LEVELS,
    families: Sequence[str] | None = None,
    split: Split = "all",
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
) -> list[TaskInstance]:
    """``n`` problems drawn uniformly over the given families and levels; same seed, same list.

    ``split`` keeps only the problems of one side of ``task_split`` (``all``: every draw), so a
    ``train`` and a ``heldout`` list are disjoint whatever their seeds.
    """
    names = list(families) if families is not None else list(FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown demo families {unknown}; expected some of {sorted(FAMILIES)}")
    if not names or not levels:
        raise ValueError("demo generation needs at least one family and one level")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 < heldout_share < 1.0:
        raise ValueError(f"heldout_share must be in (0, 1), got {heldout_share}")
    rng = random.Random(seed)
    tasks: list[TaskInstance] = []
    for _ in range(_DRAWS_PER_ROW * max(n, 1)):
        if len(tasks) == n:
            return tasks
        task = FAMILIES[rng.choice(names)](rng, rng.choice(list(levels)))
        if split == "all" or task_split(task, heldout_share) == split:
            tasks.append(task)
    raise ValueError(
        f"could not draw {n} {split} problems from families {names} at levels {list(levels)}"
    )


def to_problem(task: TaskInstance, *, problem_id: str) -> MathProblem:
    """The RL row of one demo task."""
    return MathProblem(
        id=problem_id,
        source=DEMO_SOURCE,
        problem=task.problem,
        answer=str(task.answer),
        answer_kind="integer",
        metadata={"family": task.family, "level": task.level},
    )


def demo_problems(
    n: int,
    *,
    seed: int,
    levels: Sequence[Level] = LEVELS,
    families: Sequence[str] | None = None,
    split: Split = "all",
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
) -> list[MathProblem]:
    """``n`` seeded demo problems as ``MathProblem`` rows (``split``: see ``generate_tasks``)."""
    tasks = generate_tasks(
        n, seed=seed, levels=levels, families=families, split=split, heldout_share=heldout_share
    )
    prefix = "demo" if split == "all" else f"demo-{split}"
    return [to_problem(task, problem_id=f"{prefix}-{seed}-{i}") for i, task in enumerate(tasks)]


# A planted bug, the reasoning that notices it, and how to break the call: (code, stdin) -> call.
_FAILURES: dict[str, tuple[str, Callable[[str, str], tuple[str, str]]]] = {
    "missing_stdin": (
        "The program reads its numbers from standard input, but I passed none. "
        "I will run it again with the numbers as input.",
        lambda code, stdin: (code, ""),
    ),
    "name_typo": (
        "I misspelled `print`. Fixing the name and running it again.",
        lambda code, stdin: (_replace_last(code, "print(", "pritn("), stdin),
    ),
    "syntax": (
        "A parenthesis is left open, so the code does not parse. I will close it and retry.",
        lambda code, stdin: (_replace_last(code, ")", ""), stdin),
    ),
}


# What a teacher that skips the tool says: its own arithmetic is exact, a small model's is not.
_DIRECT_PLAN = "I can work this one out without running code."


def _boxed_answer(answer: object) -> str:
    return f"{ANSWER_OPEN}\n\\boxed{{{answer}}}\n{ANSWER_CLOSE}"


def _replace_last(text: str, old: str, new: str) -> str:
    head, sep, tail = text.rpartition(old)
    if not sep:
        raise ValueError(f"cannot plant a bug: {old!r} not in the program")
    return head + new + tail


def _assistant_call(content: str, call_id: str, code: str, stdin: str) -> ChatMessage:
    call = ToolCall.of(PYTHON_TOOL_NAME, python_tool_arguments(code, stdin), id=call_id)
    return ChatMessage(role="assistant", content=content, tool_calls=[call])


def _tool_message(call_id: str, content: str) -> ChatMessage:
    return ChatMessage(role="tool", content=content, tool_call_id=call_id, name=PYTHON_TOOL_NAME)


def to_transcript(
    task: TaskInstance,
    *,
    example_id: str,
    failure: str | None = None,
    direct: bool = False,
    tool_response: ToolResponseFormatter = plain_tool_response,
) -> ChatExample:
    """An SFT conversation solving ``task`` with the Python tool, in the agent protocol.

    The assistant reasons inside the reasoning block (left open across tool turns, as the
    generation prompt pre-fills its opening tag), calls the tool, reads the real output of
    running the call, and ends with one answer block holding ``\\boxed{}``. With ``failure``
    set to a planted-bug name, the first call fails and a corrected call follows. With
    ``direct``, the assistant states the (correct) answer without calling the tool, as a teacher
    that trusts its own arithmetic does.
    """
    messages = [ChatMessage(role="user", content=task.problem)]
    if direct:
        if failure is not None:
            raise ValueError("a direct answer makes no tool call, so it cannot have a failure")
        answer = f"{REASON_OPEN}\n{_DIRECT_PLAN}\n{REASON_CLOSE}\n{_boxed_answer(task.answer)}"
        messages.append(ChatMessage(role="assistant", content=answer))
        return ChatExample(
            id=example_id, source=DEMO_SOURCE, messages=messages, tools=[python_tool_schema()]
        )
    opening = f"{REASON_OPEN}\n{task.plan}\n"
    if failure is not None:
        if failure not in _FAILURES:
            raise ValueError(f"unknown failure {failure!r}; expected one of {sorted(_FAILURES)}")
        fix, plant = _FAILURES[failure]
        bad_code, bad_stdin = plant(task.code, task.stdin)
        failed = run_python(bad_code, bad_stdin)
        if failed.ok:
            raise RuntimeError(f"planted bug {failure!r} did not fail for {task.family}")
        messages += [
            _assistant_call(opening, "call_0", bad_code, bad_stdin),
            _tool_message("call_0", tool_response(failed)),
        ]
        opening = f"{fix}\n"
    result = run_python(task.code, task.stdin)
    if not result.ok or result.stdout.strip() != str(task.answer):
        # The generator's answer and the program disagree: a bug in rstar2, never in the data.
        raise RuntimeError(f"{task.family} solver printed {result.stdout!r} for {task.answer}")
    call_id = f"call_{len(messages) // 2}"
    printed = result.stdout.strip()
    messages += [
        _assistant_call(opening, call_id, task.code, task.stdin),
        _tool_message(call_id, tool_response(result)),
        ChatMessage(
            role="assistant",
            content=(
                f"The program printed {printed}, so the answer is {printed}.\n{REASON_CLOSE}\n"
                f"{_boxed_answer(printed)}"
            ),
        ),
    ]
    return ChatExample(
        id=example_id, source=DEMO_SOURCE, messages=messages, tools=[python_tool_schema()]
    )


def demo_transcripts(
    n: int,
    *,
    seed: int,
    levels: Sequence[Level] = LEVELS,
    families: Sequence[str] | None = None,
    failure_share: float = 0.25,
    direct_share: float = 0.0,
    tool_response: ToolResponseFormatter = plain_tool_response,
    split: Split = "all",
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
) -> list[ChatExample]:
    """``n`` seeded transcripts; ``round(failure_share * n)`` of them recover from a failed call.

    Of the level-1 transcripts without a failure, ``round(direct_share * count)`` answer
    without the tool (``to_transcript``'s ``direct``): the smallest problems are the ones a
    teacher model works out itself. ``tool_response`` renders an execution as the tool message
    text, so a caller can match its rollout's tool-response format exactly. ``split``: see
    ``generate_tasks``.
    """
    for name, share in (("failure_share", failure_share), ("direct_share", direct_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {share}")
    tasks = generate_tasks(
        n, seed=seed, levels=levels, families=families, split=split, heldout_share=heldout_share
    )
    rng = random.Random(f"{seed}:failures")
    modes = sorted(_FAILURES)
    # Which transcripts fail is drawn before their modes, in index order: seeded data stays put.
    failing = sorted(rng.sample(range(n), round(failure_share * n)))
    failures = {i: rng.choice(modes) for i in failing}
    small = [i for i, task in enumerate(tasks) if task.level == 1 and i not in failures]
    direct = set(random.Random(f"{seed}:direct").sample(small, round(direct_share * len(small))))
    return [
        to_transcript(
            task,
            example_id=f"demo-sft-{seed}-{i}",
            failure=failures.get(i),
            direct=i in direct,
            tool_response=tool_response,
        )
        for i, task in enumerate(tasks)
    ]
