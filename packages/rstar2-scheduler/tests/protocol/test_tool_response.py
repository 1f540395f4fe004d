"""Tool output as the model sees it: status notes and middle truncation."""

from __future__ import annotations

import pytest

from rstar2_data.demo import demo_transcripts, run_python
from rstar2_sandbox.models import RunResult, RunStatus
from rstar2_scheduler.protocol import ToolOutputFormatter, truncate_middle


def test_truncate_keeps_head_and_tail() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    out = truncate_middle(text, 256)
    head, marker, tail = out.split("\n")
    assert head == text[:128]
    assert tail == text[-128:]
    assert marker == "... [744 characters omitted] ..."
    assert truncate_middle("short", 256) == "short"
    assert truncate_middle(text, None) == text


def test_default_limit_is_256_characters() -> None:
    result = RunResult(status=RunStatus.SUCCESS, stdout="x" * 300 + "END")
    shown = ToolOutputFormatter().format_result(result)
    assert shown.startswith("x" * 128)
    assert shown.endswith("x" * 125 + "END")
    assert "[47 characters omitted]" in shown


@pytest.mark.parametrize(
    ("status", "note"),
    [
        (RunStatus.TIMEOUT, "TimeoutError"),
        (RunStatus.MEMORY_EXCEEDED, "MemoryError"),
        (RunStatus.OUTPUT_LIMIT_EXCEEDED, "output limit"),
        (RunStatus.INTERNAL_ERROR, "could not run"),
    ],
)
def test_failures_carry_a_note(status: RunStatus, note: str) -> None:
    shown = ToolOutputFormatter(None).format_result(RunResult(status=status, stdout="partial"))
    assert shown.startswith("partial\n")
    assert note in shown


def test_runtime_error_shows_stdout_then_traceback() -> None:
    result = RunResult(status=RunStatus.RUNTIME_ERROR, stdout="1\n", stderr="Traceback ...\n")
    assert ToolOutputFormatter().format_result(result) == "1\nTraceback ...\n"


def test_sft_transcripts_use_the_rollout_format() -> None:
    formatter = ToolOutputFormatter(40)
    example = demo_transcripts(
        1, seed=1, failure_share=1.0, tool_response=formatter.format_execution
    )[0]
    failing = example.messages[1].tool_calls[0].function.arguments  # type: ignore[index]
    execution = run_python(failing["code"], failing["input"])
    assert not execution.ok
    expected = formatter.format(execution.stdout, execution.stderr, RunStatus.RUNTIME_ERROR)
    assert example.messages[2].content == expected
    assert len(expected) < len(execution.stdout + execution.stderr)


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_chars must be >= 2"):
        ToolOutputFormatter(0)
