"""Trajectory quality record and the paper's Resample-on-Correct penalties."""

from __future__ import annotations

from dataclasses import dataclass, fields

NO_TOOL_CALL_ERROR_RATIO = 0.5
"""p_err of a trajectory that made no tool call: the paper's neutral prior."""


@dataclass(frozen=True)
class TrajectoryQuality:
    """What one rollout did, counted by the rollout loop.

    Failed tool calls are split by kind; a tool call that did not parse counts as a call with a
    parse error. ``answer_tags`` is the number of answer tags in the response; ``turns`` the
    number of assistant turns. ``turns`` is 0 when the engine failed the first request: such a
    rollout generated nothing, so it has no tool call and no answer tag either.
    ``truncated`` marks a rollout that ended without a final turn (response budget, turn limit,
    engine failure): its reward is 0 upstream, so Resample-on-Correct treats it as a negative like
    any other; the flag does not change its penalty.
    """

    tool_calls: int
    parse_errors: int
    runtime_errors: int
    timeouts: int
    other_errors: int
    answer_tags: int
    turns: int
    truncated: bool

    def __post_init__(self) -> None:
        for field in fields(self):
            if field.name == "truncated":
                continue
            name, value = field.name, getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not isinstance(self.truncated, bool):
            raise ValueError(f"truncated must be a bool, got {type(self.truncated).__name__}")
        if self.turns == 0:
            # Nothing was generated. answer_tags == 0 also keeps format_penalty off its division
            # by turns.
            for name, count in (("tool_calls", self.tool_calls), ("answer_tags", self.answer_tags)):
                if count != 0:
                    raise ValueError(f"{name} must be 0 when turns=0, got {count}")
        if self.failed_tool_calls > self.tool_calls:
            raise ValueError(
                f"failed tool calls (parse_errors + runtime_errors + timeouts + other_errors = "
                f"{self.failed_tool_calls}) must not exceed tool_calls={self.tool_calls}"
            )

    @property
    def failed_tool_calls(self) -> int:
        return self.parse_errors + self.runtime_errors + self.timeouts + self.other_errors

    @property
    def tool_error_ratio(self) -> float:
        """p_err = failed tool calls / tool calls, or 0.5 without any tool call."""
        if self.tool_calls == 0:
            return NO_TOOL_CALL_ERROR_RATIO
        return self.failed_tool_calls / self.tool_calls

    @property
    def format_penalty(self) -> float:
        """p_format = 1 without an answer tag, else min(1, (answer_tags - 1) / turns)."""
        if self.answer_tags == 0:
            return 1.0
        return min(1.0, (self.answer_tags - 1) / self.turns)

    @property
    def penalty(self) -> float:
        """p_total = p_err + p_format, in [0, 2]; lower is a cleaner trajectory."""
        return self.tool_error_ratio + self.format_penalty
