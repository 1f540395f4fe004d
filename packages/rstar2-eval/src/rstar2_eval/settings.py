"""What an evaluation samples: every setting explicit, recorded in ``run.json`` and the report.

Defaults are the paper's evaluation settings (rStar2-Agent: 16 samples per problem, temperature
0.6, responses of up to 30K tokens over up to 30 turns).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rstar2_data import PYTHON_TOOL_NAME, RELEASE_PYTHON_TOOL_NAME, python_tool_schema
from rstar2_scheduler.protocol import DEFAULT_TOOL_OUTPUT_CHARS, ChatConfig
from rstar2_scheduler.rollout import RolloutConfig

PAPER_SAMPLES = 16
PAPER_TEMPERATURE = 0.6
PAPER_MAX_TOKENS = 30_000
PAPER_MAX_TURNS = 30


class EvalSettings(BaseModel):
    """Sampling and tool settings of an evaluation (the same for every problem set)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: int = Field(default=PAPER_SAMPLES, ge=1, description="Samples per problem (k).")
    temperature: float = Field(default=PAPER_TEMPERATURE, ge=0, description="0 is greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(
        default=PAPER_MAX_TOKENS,
        ge=1,
        description="Response budget shared by all turns: model and tool-response tokens.",
    )
    max_turns: int = Field(default=PAPER_MAX_TURNS, ge=1, description="Assistant turns at most.")
    seed: int = Field(default=0, description="Root of every per-sample seed.")
    limit: int | None = Field(default=None, ge=1, description="First N problems of each set.")
    tool_timeout_s: float = Field(default=10.0, gt=0, le=300, description="Per tool call.")
    tool_memory_mb: int = Field(default=1024, gt=0, description="Per tool call.")
    tool_output_chars: int | None = Field(
        default=DEFAULT_TOOL_OUTPUT_CHARS,
        ge=2,
        description="Tool output shown to the model (head + marker + tail); None shows all.",
    )
    tool_name: str = Field(
        default=PYTHON_TOOL_NAME,
        description=f"The Python tool's name: {PYTHON_TOOL_NAME!r} (the paper's), or "
        f"{RELEASE_PYTHON_TOOL_NAME!r} as the released checkpoints were trained with.",
    )

    @field_validator("tool_name")
    @classmethod
    def _known_tool(cls, name: str) -> str:
        if name not in (PYTHON_TOOL_NAME, RELEASE_PYTHON_TOOL_NAME):
            raise ValueError(f"expected {PYTHON_TOOL_NAME} or {RELEASE_PYTHON_TOOL_NAME}")
        return name

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas offered to the model (rstar2-data's Python tool, named as set)."""
        schema = python_tool_schema()
        schema["function"]["name"] = self.tool_name
        return [schema]

    def rollout_config(self, chat: ChatConfig | None = None) -> RolloutConfig:
        """The rollout loop's configuration for these settings."""
        return RolloutConfig(
            max_turns=self.max_turns,
            max_response_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            tool_output_chars=self.tool_output_chars,
            tool_timeout_s=self.tool_timeout_s,
            tool_memory_mb=self.tool_memory_mb,
            chat=chat if chat is not None else ChatConfig(),
        )


def sample_seed(seed: int, benchmark: str, problem_id: str, sample_index: int) -> int:
    """The seed of one sample, from what identifies it alone.

    A resumed run, or one over a different subset of problems, draws exactly the samples an
    uninterrupted full run would.
    """
    key = f"{seed}\x00{benchmark}\x00{problem_id}\x00{sample_index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1
