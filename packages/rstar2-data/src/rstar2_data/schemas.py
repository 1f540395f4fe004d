"""Row schemas shared by rstar2 datasets: math problems (RL, eval) and chat examples (SFT)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
