"""What the model reads back from one tool call: the sandbox's output, truncated in the middle.

The same formatter renders SFT transcripts (``format_execution``) and rollouts
(``format_result``), so the model trains on the tool output it will later see.
"""

from __future__ import annotations

from rstar2_data.demo import Execution
from rstar2_sandbox.models import RunResult, RunStatus

DEFAULT_TOOL_OUTPUT_CHARS = 256

# Appended after the program's own output, so the model learns why the run stopped.
_STATUS_NOTES: dict[RunStatus, str] = {
    RunStatus.TIMEOUT: "TimeoutError: the program did not finish within the time limit.",
    RunStatus.MEMORY_EXCEEDED: "MemoryError: the program exceeded the memory limit.",
    RunStatus.OUTPUT_LIMIT_EXCEEDED: "Error: the program's output exceeded the output limit.",
    RunStatus.INTERNAL_ERROR: "Error: the tool could not run the program.",
}


def truncate_middle(text: str, max_chars: int | None) -> str:
    """Keep the first and last ``max_chars / 2`` characters with a marker between them."""
    if max_chars is None or len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    omitted = len(text) - max_chars
    return f"{text[:head]}\n... [{omitted} characters omitted] ...\n{text[len(text) - tail :]}"


class ToolOutputFormatter:
    """Renders one execution's stdout, stderr and status as the text of a tool response.

    ``max_chars`` bounds the shown output (head + marker + tail); ``None`` shows it all.
    """

    def __init__(self, max_chars: int | None = DEFAULT_TOOL_OUTPUT_CHARS) -> None:
        if max_chars is not None and max_chars < 2:
            raise ValueError(f"max_chars must be >= 2 or None, got {max_chars}")
        self.max_chars = max_chars

    def format(self, stdout: str, stderr: str, status: RunStatus) -> str:
        """The tool response text for one run."""
        text = stdout + stderr
        note = _STATUS_NOTES.get(status)
        if note is not None:
            text = f"{text}\n{note}" if text and not text.endswith("\n") else text + note
        return truncate_middle(text, self.max_chars)

    def format_result(self, result: RunResult) -> str:
        """A sandbox result, as a rollout shows it."""
        return self.format(result.stdout, result.stderr, result.status)

    def format_execution(self, execution: Execution) -> str:
        """An SFT transcript's execution (rstar2-data's demo runner), as a rollout would show it."""
        status = RunStatus.SUCCESS if execution.ok else RunStatus.RUNTIME_ERROR
        return self.format(execution.stdout, execution.stderr, status)

    def format_error(self, message: str) -> str:
        """A tool call that was not executed (it did not parse): the reason, for the model."""
        return truncate_middle(message, self.max_chars)
