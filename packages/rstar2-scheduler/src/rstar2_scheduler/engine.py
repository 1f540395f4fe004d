"""The inference-engine interface: token ids in, token ids and sampling log-probs out.

Every engine (in-process transformers, vLLM, an OpenAI-compatible server, the simulator)
implements ``Engine`` and passes the same conformance suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Literal, Self, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    # Annotations only: the simulator and the command line never load torch.
    import torch

FinishReason = Literal["stop", "length", "abort", "error"]

Capability = Literal["update_weights", "reset_prefix_cache", "sleep"]
"""Optional engine operations: receive new weights, forget cached prefixes, sleep and wake up."""

NamedTensors: TypeAlias = Iterable[tuple[str, "torch.Tensor"]]
"""Weights as ``(parameter name, tensor)`` pairs, e.g. ``model.state_dict().items()``; an
iterable, so a trainer can stream them in buckets without holding a second copy."""


class UnsupportedOperationError(RuntimeError):
    """The engine cannot do this (e.g. push weights into a remote OpenAI-compatible server)."""


class SamplingParams(BaseModel):
    """How to sample one completion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(gt=0, description="Most tokens to generate.")
    temperature: float = Field(default=1.0, ge=0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(
        default=0, ge=0, description="Draw among the k most likely tokens only; 0: no limit."
    )
    stop_token_ids: tuple[int, ...] = Field(
        default=(), description="Generation ends after emitting any of these (it is kept)."
    )
    seed: int | None = Field(default=None, description="Per-request seed where supported.")
    return_support: bool = Field(
        default=False,
        description="Report each sampled token's support, the ids the sampler could draw (its "
        "top-p / top-k set), with the log-prob renormalised over them: a trainer renormalising "
        "over the same ids then recomputes the sampling log-prob exactly at any top_p and "
        "temperature. Engines that cannot report supports fail the request.",
    )


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
    loss_mask: tuple[int, ...] | None = Field(
        default=None,
        description="Per token: 1 to train on it, 0 where the engine has no sampling log-prob for "
        "it (e.g. a stop token a text server dropped and the client restored). None: all 1.",
    )
    counted_tokens: int | None = Field(
        default=None,
        ge=0,
        description="The engine's own count of the tokens it generated, when token_ids are not "
        "the ids it sampled (a text server's usage.completion_tokens, its text re-encoded "
        "locally). Response budgets count this. None: len(token_ids).",
    )
    reencoded: bool = Field(
        default=False,
        description="token_ids were re-encoded from the completion text, not returned as ids.",
    )
    weights_version: str | None = Field(
        default=None,
        description="The version label of the weights that sampled these tokens (the ``version`` "
        "of the engine's last acknowledged ``update_weights``); None where the engine records "
        "none. Weights change only between two generate calls, so one label covers every token.",
    )
    support: tuple[tuple[int, ...], ...] | None = Field(
        default=None,
        description="Per token, when the request asked for it (return_support): the ids the "
        "sampler could draw, its top-p / top-k set (empty: the whole vocabulary, as for a "
        "greedy token); each log-prob is then renormalised over its set.",
    )

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs; one each"
            )
        if self.support is not None and len(self.support) != len(self.token_ids):
            raise ValueError(
                f"{len(self.token_ids)} tokens but {len(self.support)} support sets; one each"
            )
        if self.loss_mask is not None and (
            len(self.loss_mask) != len(self.token_ids) or set(self.loss_mask) - {0, 1}
        ):
            raise ValueError("loss_mask needs one 0 or 1 per token")
        return self

    @property
    def generated_tokens(self) -> int:
        """Tokens the engine generated, by its own count: what a response budget spends."""
        return len(self.token_ids) if self.counted_tokens is None else self.counted_tokens

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
    max_running: int | None = Field(
        default=None,
        ge=1,
        description="Most requests the engine decodes at once (its batch limit); None: unknown.",
    )

    @property
    def usage(self) -> float:
        """Fraction of the KV cache in use, in [0, 1]."""
        return min(1.0, self.used_tokens / self.capacity_tokens) if self.capacity_tokens else 0.0

    @property
    def free_tokens(self) -> int:
        """Tokens the cache can still hold."""
        return max(0, self.capacity_tokens - self.used_tokens)


class Engine(ABC):
    """An inference engine that generates from token ids; safe to call concurrently.

    RL needs more than generation: new weights after each step, a prefix cache reset (cached
    prefixes were computed with the old weights), and, when training shares the accelerator,
    ``sleep``/``wake_up`` to free its memory during the update. Engines list what they support
    in ``capabilities``; the others raise ``UnsupportedOperationError`` saying why.
    """

    name: str
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    unsupported_reason: ClassVar[str] = "this engine does not implement it"

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate one completion. Engine failures come back as ``finish_reason='error'``."""

    @abstractmethod
    def kv_stats(self) -> KVStats:
        """Current KV-cache and queue statistics."""

    def supports(self, capability: Capability) -> bool:
        """Whether ``capability`` is implemented (the operation does not raise)."""
        return capability in self.capabilities

    def _unsupported(self, operation: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"engine {self.name!r} ({type(self).__name__}) cannot {operation}: "
            f"{self.unsupported_reason}"
        )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Load new policy weights (names as in the model's ``state_dict``), then drop cached
        prefixes. Call it between rollout phases: requests in flight may see either weights.

        ``version`` labels the weights where the engine records one (e.g. the RL step).
        """
        raise self._unsupported("update weights")

    async def reset_prefix_cache(self) -> None:
        """Forget cached prefixes, which were computed with the previous weights."""
        raise self._unsupported("reset its prefix cache")

    async def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for a colocated trainer (level 1 keeps the weights on the
        host, level 2 discards them: the next ``update_weights`` must bring all of them)."""
        raise self._unsupported("sleep")

    async def wake_up(self) -> None:
        """Take back what ``sleep`` freed; generation works again."""
        raise self._unsupported("wake up")

    async def start(self) -> None:  # noqa: B027 - optional hook; most engines need no set-up
        """Load models or open connections; idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; pending requests finish with ``finish_reason='abort'``."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
