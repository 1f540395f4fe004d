"""Row schemas shared by rstar2 datasets: math problems (RL, eval) and chat examples (SFT)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data.protocol import ToolCall

AnswerKind = Literal["integer", "expression"]


class MathProblem(BaseModel):
    """One math problem with its reference answer, as used by RL training and evaluation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Stable id, unique within its source.")
    source: str = Field(min_length=1, description="Dataset the row came from (hub id or file).")
    problem: str = Field(min_length=1, description="Problem statement shown to the model.")
    answer: str = Field(
        min_length=1, description='Normalized reference answer ("25", not "025" or 25.0).'
    )
    answer_kind: AnswerKind = Field(description="integer, or any other LaTeX expression.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Source-specific extras.")


Role = Literal["system", "user", "assistant", "tool"]


class ChatMessage(BaseModel):
    """One message in the OpenAI chat format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="Only on assistant messages (the protocol's ``ToolCall``)."
    )
    tool_call_id: str | None = Field(default=None, description="Only on tool messages.")
    name: str | None = Field(default=None, description="The tool's name, on tool messages.")


class ChatExample(BaseModel):
    """One SFT conversation with the tools its system prompt offers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="JSON function schemas offered to the model."
    )


class GradedSample(BaseModel):
    """One graded model answer to one problem: a JSONL line written by the evaluator.

    Label verification and difficulty filters read these, grouped by ``problem_id``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem_id: str = Field(min_length=1)
    sample_index: int = Field(ge=0, description="Which of the n samples of this problem.")
    answer: str | None = Field(description="Extracted final answer; None when there was none.")
    correct: bool = Field(description="Whether the answer matched the problem's label.")
    source: str | None = None
    benchmark: str | None = None
