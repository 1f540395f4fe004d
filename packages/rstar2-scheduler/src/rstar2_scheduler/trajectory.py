"""Rollout records: one trajectory of token ids with its mask, log-probs and turn records."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_algo import TrajectoryQuality
from rstar2_data.protocol import ToolCall
from rstar2_sandbox.models import RunStatus
from rstar2_scheduler.engine import FinishReason

StopReason = Literal["no_tool_call", "end_of_sequence", "max_turns", "budget", "engine_error"]
"""Why a rollout ended: a turn without a tool call; the model emitted end-of-sequence instead of
end-of-turn; the last allowed turn called a tool; the response budget ran out (the turn hit it, or
the next tool response would not fit); the engine failed or aborted the request."""

# Sandbox statuses that Resample-on-Correct counts under "other_errors".
_OTHER_FAILURES = frozenset(
    {RunStatus.MEMORY_EXCEEDED, RunStatus.OUTPUT_LIMIT_EXCEEDED, RunStatus.INTERNAL_ERROR}
)


class TurnRecord(BaseModel):
    """One assistant turn: what the model generated and what its tool call did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    text: str = Field(description="The model's text of this turn (end-of-turn token excluded).")
    model_tokens: int = Field(
        ge=0, description="Tokens the model generated, by the engine's count (the budget's)."
    )
    reencoded_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Ids this turn holds in the trajectory when they were re-encoded from a text "
        "server's completion (None: the engine's own ids, model_tokens of them).",
    )
    glue_tokens: int = Field(
        default=0, ge=0, description="Tool-response and template tokens appended after (mask 0)."
    )
    finish_reason: FinishReason
    generation_s: float = Field(ge=0, description="Wall time of the engine request.")
    weights_version: str | None = Field(
        default=None,
        description="The engine's label of the weights that generated this turn (None: the "
        "engine records none).",
    )
    tool_call: ToolCall | None = Field(default=None, description="The first call, when parsed.")
    parse_error: str | None = Field(default=None, description="Why the tool call did not parse.")
    ignored_tool_calls: int = Field(default=0, ge=0, description="Calls after the first.")
    answered: bool = Field(
        default=False, description="The call was executed or its parse error reported."
    )
    executed: bool = Field(default=False, description="The call ran in the sandbox.")
    sandbox_status: RunStatus | None = None
    tool_latency_s: float | None = Field(default=None, ge=0, description="Sandbox round trip.")
    tool_response: str | None = Field(
        default=None, description="The text shown to the model (None when not shown)."
    )


def count_quality(
    turns: list[TurnRecord], *, answer_tags: int, stop_reason: StopReason
) -> TrajectoryQuality:
    """Count what Resample-on-Correct reads of a trajectory: its tool calls and failures by kind.

    A tool call counts when it was answered: executed in the sandbox, or rejected with a parse
    error. A call in the last allowed turn is never answered and is not counted; a call whose
    response did not fit the budget was answered and counts. Sandbox memory, output-limit and
    internal failures count as ``other_errors``. Every stop but a final turn (``no_tool_call``,
    ``end_of_sequence``) is truncated.
    """
    statuses = [turn.sandbox_status for turn in turns if turn.executed]
    return TrajectoryQuality(
        tool_calls=sum(turn.answered for turn in turns),
        parse_errors=sum(turn.answered and turn.parse_error is not None for turn in turns),
        runtime_errors=statuses.count(RunStatus.RUNTIME_ERROR),
        timeouts=statuses.count(RunStatus.TIMEOUT),
        other_errors=sum(status in _OTHER_FAILURES for status in statuses),
        answer_tags=answer_tags,
        turns=len(turns),
        truncated=stop_reason not in ("no_tool_call", "end_of_sequence"),
    )


class Trajectory(BaseModel):
    """One rollout: prompt ids, append-only response ids, mask, log-probs and turn records.

    ``response_ids``, ``loss_mask``, ``logprobs`` and ``versions`` align token by token. Model
    tokens have mask 1, the engine's sampling log-prob (the behaviour policy's; mask 0 and 0.0
    for a token the engine has no log-prob for) and the version label of the weights that
    sampled them; tool responses and template glue have mask 0, 0.0 and no version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str
    problem_id: str
    engine: str = Field(description="Name of the engine that generated every turn.")
    prompt_ids: list[int] = Field(min_length=1)
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[str | None] = Field(
        description="Per response token: the weights version that sampled it (None for tool "
        "and template tokens, and where the engine records no version)."
    )
    support: list[list[int]] | None = Field(
        default=None,
        description="Per response token, when the rollout asked for supports "
        "(RolloutConfig.return_support): the ids its sampler could draw, over which its "
        "log-prob is renormalised (empty: the whole vocabulary, as for tool and template "
        "tokens). None: every log-prob is over the whole vocabulary.",
    )
    turns: list[TurnRecord]
    stop_reason: StopReason
    error: str | None = Field(default=None, description="Engine error, when stop is engine_error.")
    quality: TrajectoryQuality = Field(description="What Resample-on-Correct reads of it.")
    response_text: str = Field(description="Decoded response, tool responses included.")

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        lengths = {
            len(self.response_ids),
            len(self.loss_mask),
            len(self.logprobs),
            len(self.versions),
        }
        if len(lengths) != 1:
            raise ValueError(
                "response_ids, loss_mask, logprobs and versions must have one entry per response "
                f"token; got {len(self.response_ids)}, {len(self.loss_mask)}, "
                f"{len(self.logprobs)}, {len(self.versions)}"
            )
        if any(bit not in (0, 1) for bit in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if self.support is not None and len(self.support) != len(self.response_ids):
            raise ValueError(
                f"support must have one entry per response token; got {len(self.support)} for "
                f"{len(self.response_ids)} tokens"
            )
        return self

    @property
    def input_ids(self) -> list[int]:
        """Prompt followed by response: the sequence the trainer scores."""
        return self.prompt_ids + self.response_ids

    @property
    def response_tokens(self) -> int:
        """Response tokens as the budget counted them: the engine's count of model tokens plus
        the glue. Equals ``len(response_ids)`` unless a text server's completions were
        re-encoded into other token counts."""
        return sum(turn.model_tokens + turn.glue_tokens for turn in self.turns)

    @property
    def truncated(self) -> bool:
        """Ended without a final turn; RL gives such a rollout reward 0."""
        return self.quality.truncated
