"""The inference-engine interface: token ids in, token ids and sampling log-probs out.

Every engine (in-process transformers, vLLM, an OpenAI-compatible server, the simulator)
implements ``Engine`` and passes the same conformance suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "abort", "error"]


class SamplingParams(BaseModel):
    """How to sample one completion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(gt=0, description="Most tokens to generate.")
    temperature: float = Field(default=1.0, ge=0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop_token_ids: tuple[int, ...] = Field(
        default=(), description="Generation ends after emitting any of these (it is kept)."
    )
    seed: int | None = Field(default=None, description="Per-request seed where supported.")


class GenerationRequest(BaseModel):
    """One completion request over token ids."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(min_length=1)
    prompt_ids: tuple[int, ...] = Field(min_length=1)
    sampling: SamplingParams


class GenerationResult(BaseModel):
    """The generated token ids with the log-prob of each under the sampling distribution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = Field(description="One per generated token.")
    finish_reason: FinishReason
    error: str | None = Field(default=None, description="Set when finish_reason is 'error'.")

    @classmethod
    def failed(cls, request_id: str, error: str) -> Self:
        """A request that generated nothing because of ``error``."""
        return cls(
            request_id=request_id, token_ids=(), logprobs=(), finish_reason="error", error=error
        )


class KVStats(BaseModel):
    """A snapshot of an engine's KV cache and queue, from the engine's own statistics."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity_tokens: int = Field(ge=0, description="KV cache size in tokens.")
    used_tokens: int = Field(ge=0, description="Tokens currently held in the KV cache.")
    running: int = Field(default=0, ge=0, description="Requests being decoded.")
    waiting: int = Field(default=0, ge=0, description="Requests queued, not yet scheduled.")
    preemptions: int = Field(default=0, ge=0, description="Preemptions since start (cumulative).")

    @property
    def usage(self) -> float:
        """Fraction of the KV cache in use, in [0, 1]."""
        return min(1.0, self.used_tokens / self.capacity_tokens) if self.capacity_tokens else 0.0

    @property
    def free_tokens(self) -> int:
        """Tokens the cache can still hold."""
        return max(0, self.capacity_tokens - self.used_tokens)


class Engine(ABC):
    """An inference engine that generates from token ids; safe to call concurrently."""

    name: str

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion. Engine failures come back as ``finish_reason='error'``."""

    @abstractmethod
    def kv_stats(self) -> KVStats:
        """Current KV-cache and queue statistics."""

    async def start(self) -> None:  # noqa: B027 - optional hook; most engines need no set-up
        """Load models or open connections; idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; pending requests finish with ``finish_reason='abort'``."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
