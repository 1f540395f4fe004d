"""An in-process transformers model behind the ``Engine`` interface (CPU or GPU).

Pending requests are batched by the engine itself: transformers' own continuous batching
(``generate_batch``) sees no free memory on CPU, so this engine keeps an explicit KV token budget.
A request is admitted while the sum of admitted reservations (prompt + ``max_new_tokens``) fits
the budget, so a running request can always finish and nothing is ever preempted. Requests that
arrive while a batch decodes join it at the next step: the batch is re-prefilled with them
(left-padded); finished rows leave the KV cache at once.

For RL the engine takes new weights in place (``update_weights``, between forward steps) and can
``sleep`` to give its memory to a colocated trainer; nothing is cached across requests, so
``reset_prefix_cache`` has nothing to forget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
)
from rstar2_scheduler.engines.sampling import sample_next

logger = logging.getLogger(__name__)


class TransformersEngineConfig(BaseModel):
    """Batching limits of a ``TransformersEngine``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="transformers", min_length=1)
    kv_budget_tokens: int = Field(gt=0, description="KV cache capacity in tokens (all rows).")
    max_batch_size: int = Field(default=16, ge=1, description="Rows decoded together at most.")
    seed: int = Field(default=0, description="Seeds requests that bring no seed of their own.")


@dataclass(eq=False)
class _Row:
    request: GenerationRequest
    future: asyncio.Future[GenerationResult]
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @property
    def reserved(self) -> int:
        return len(self.request.prompt_ids) + self.request.sampling.max_new_tokens

    @property
    def length(self) -> int:
        return len(self.request.prompt_ids) + len(self.tokens)

    def finish_reason(self) -> FinishReason | None:
        sampling = self.request.sampling
        if self.tokens and self.tokens[-1] in sampling.stop_token_ids:
            return "stop"
        if len(self.tokens) >= sampling.max_new_tokens:
            return "length"
        return None

    def resolve(self, reason: FinishReason, error: str | None = None) -> None:
        if not self.future.done():
            self.future.set_result(
                GenerationResult(
                    request_id=self.request.request_id,
                    token_ids=tuple(self.tokens),
                    logprobs=tuple(self.logprobs),
                    finish_reason=reason,
                    error=error,
                )
            )


class TransformersEngine(Engine):
    """Generates with a transformers causal LM, batching concurrent requests under a KV budget.

    ``kv_stats`` reports the budget as capacity and the tokens of running requests as used (the
    padded batch may hold more in memory until the next re-prefill).
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"update_weights", "reset_prefix_cache", "sleep"}
    )

    def __init__(self, model: PreTrainedModel, config: TransformersEngineConfig) -> None:
        model.eval()  # type: ignore[no-untyped-call]  # torch's Module.eval is untyped
        self.model = model
        self.config = config
        self.name = config.name
        self._device = next(model.parameters()).device
        self._vocab_size = int(model.config.vocab_size)
        self._max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self._rng = random.Random(config.seed)
        self._pending: deque[_Row] = deque()
        self._running: list[_Row] = []
        self._cache: DynamicCache | None = None
        self._attention: torch.Tensor | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # Held around every forward step, so weights never change in the middle of one.
        self._model_lock = asyncio.Lock()
        self._asleep = False
        self.weights_version: str | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        config: TransformersEngineConfig,
        *,
        device: str = "cpu",
        **model_kwargs: Any,
    ) -> TransformersEngine:
        """Load a checkpoint (a local directory or hub id) with ``AutoModelForCausalLM``."""
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(path), **model_kwargs)
        model.to(torch.device(device))  # type: ignore[arg-type]  # transformers' stub of .to is wrong
        return cls(model, config)

    async def start(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.create_task(self._serve(), name=f"{self.name}-batcher")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for row in [*self._running, *self._pending]:
            row.resolve("abort", "engine closed")
        self._running.clear()
        self._pending.clear()
        self._reset_batch()

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=self.config.kv_budget_tokens,
            used_tokens=sum(row.length for row in self._running),
            running=len(self._running),
            waiting=len(self._pending),
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        problem = self._reject_reason(request)
        if problem is not None:
            return GenerationResult.failed(request.request_id, problem)
        await self.start()
        assert self._wakeup is not None  # set by start()
        seed = request.sampling.seed
        # On the model's device: torch.multinomial draws with a generator of the probs' device.
        generator = torch.Generator(device=self._device).manual_seed(
            seed if seed is not None else self._rng.getrandbits(63)
        )
        row = _Row(request, asyncio.get_running_loop().create_future(), generator)
        self._pending.append(row)
        self._wakeup.set()
        # A cancelled caller cancels the future too; the batcher then drops the row.
        return await row.future

    def _reject_reason(self, request: GenerationRequest) -> str | None:
        if self._asleep:
            return f"engine {self.name!r} is asleep; call wake_up() first"
        reserved = len(request.prompt_ids) + request.sampling.max_new_tokens
        if reserved > self.config.kv_budget_tokens:
            return (
                f"prompt ({len(request.prompt_ids)} tokens) + max_new_tokens "
                f"({request.sampling.max_new_tokens}) exceeds kv_budget_tokens "
                f"({self.config.kv_budget_tokens})"
            )
        if self._max_positions is not None and reserved > self._max_positions:
            return (
                f"prompt + max_new_tokens = {reserved} exceeds the model's "
                f"max_position_embeddings ({self._max_positions})"
            )
        bad = [token for token in request.prompt_ids if not 0 <= token < self._vocab_size]
        if bad:
            return f"prompt_ids {bad[:5]} are outside the vocabulary [0, {self._vocab_size})"
        return None

    async def _serve(self) -> None:
        assert self._wakeup is not None
        while True:
            self._running = [row for row in self._running if not row.future.done()]
            if len(self._running) < self._batch_rows():
                self._reset_batch()  # a caller cancelled: rebuild without its row
            admitted = self._admit()
            if not self._running:
                self._reset_batch()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            rows = list(self._running)
            try:
                await self._step(rows, prefill=admitted or self._cache is None)
            except Exception as failure:
                logger.exception("%s: batch step failed", self.name)
                for row in rows:
                    row.resolve("error", f"{type(failure).__name__}: {failure}")
                self._running.clear()
                self._reset_batch()

    async def _step(self, rows: list[_Row], *, prefill: bool) -> None:
        """Generate one token for every running row; finished rows leave the batch."""
        step = self._prefill if prefill else self._decode
        async with self._model_lock:
            tokens, logprobs = await asyncio.to_thread(step, rows)
        keep: list[int] = []
        for index, (row, token, logprob) in enumerate(zip(rows, tokens, logprobs, strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            reason = row.finish_reason()
            if reason is not None:
                row.resolve(reason)
            elif not row.future.done():
                keep.append(index)
        self._running = [rows[index] for index in keep]
        if not keep:
            self._reset_batch()
        elif len(keep) < len(rows):
            self._shrink(keep)

    def _batch_rows(self) -> int:
        return 0 if self._attention is None else int(self._attention.shape[0])

    def _admit(self) -> bool:
        reserved = sum(row.reserved for row in self._running)
        admitted = False
        while self._pending and len(self._running) < self.config.max_batch_size:
            row = self._pending[0]
            if row.future.done():
                self._pending.popleft()
                continue
            if reserved + row.reserved > self.config.kv_budget_tokens:
                break  # first come, first served: later requests wait too
            self._pending.popleft()
            self._running.append(row)
            reserved += row.reserved
            admitted = True
        return admitted

    def _reset_batch(self) -> None:
        self._cache = None
        self._attention = None

    def _shrink(self, keep: list[int]) -> None:
        assert self._cache is not None
        assert self._attention is not None
        index = torch.tensor(keep, dtype=torch.long, device=self._device)
        self._cache.batch_select_indices(index)
        self._attention = self._attention[index]

    @torch.inference_mode()
    def _prefill(self, rows: list[_Row]) -> tuple[list[int], list[float]]:
        sequences = [[*row.request.prompt_ids, *row.tokens] for row in rows]
        width = max(len(sequence) for sequence in sequences)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for index, sequence in enumerate(sequences):
            input_ids[index, width - len(sequence) :] = torch.tensor(sequence)
            attention[index, width - len(sequence) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        self._cache = DynamicCache(config=self.model.config)
        self._attention = attention.to(self._device)
        return self._forward(rows, input_ids, positions)

    @torch.inference_mode()
    def _decode(self, rows: list[_Row]) -> tuple[list[int], list[float]]:
        assert self._attention is not None
        input_ids = torch.tensor([[row.tokens[-1]] for row in rows])
        positions = torch.tensor([[row.length - 1] for row in rows])
        ones = torch.ones((len(rows), 1), dtype=torch.long, device=self._device)
        self._attention = torch.cat([self._attention, ones], dim=-1)
        return self._forward(rows, input_ids, positions)

    def _forward(
        self, rows: list[_Row], input_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[list[int], list[float]]:
        output = self.model(
            input_ids=input_ids.to(self._device),
            attention_mask=self._attention,
            position_ids=positions.to(self._device),
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return sample_next(
            output.logits[:, -1, :],
            [row.request.sampling.temperature for row in rows],
            [row.request.sampling.top_p for row in rows],
            [row.generator for row in rows],
        )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Copy ``weights`` into the model between forward steps (names as in its
        ``state_dict``; dtype and device are converted). Running requests continue with the new
        weights after a re-prefill. A name the model lacks or a wrong shape raises
        ``ValueError`` before any weight changes."""
        async with self._model_lock:
            await asyncio.to_thread(self._load_weights, list(weights))
            self._reset_batch()  # cached keys and values came from the old weights
        self.weights_version = version

    def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        targets = self.model.state_dict()
        for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                known = ", ".join(sorted(targets)[:5])
                raise ValueError(
                    f"update_weights: the model has no weight {name!r} (it has {known}, ...)"
                )
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model's "
                    f"is {tuple(target.shape)}"
                )
        with torch.no_grad():
            for name, tensor in weights:
                targets[name].copy_(tensor)

    async def reset_prefix_cache(self) -> None:
        """Nothing to do: no keys or values outlive the request that computed them."""

    async def sleep(self, level: int = 1) -> None:
        """Free memory while no request runs: the batch's KV cache, and the weights move to the
        host when they live on an accelerator. Only level 1 exists here (level 2, discarding
        the weights, would lose buffers that are not in the ``state_dict``). Requests made
        while asleep fail at once."""
        if level != 1:
            raise ValueError(f"{type(self).__name__} supports sleep level 1 only, got {level}")
        if self._running or self._pending:
            raise RuntimeError(
                f"engine {self.name!r} cannot sleep with {len(self._running)} running and "
                f"{len(self._pending)} waiting requests"
            )
        async with self._model_lock:
            self._reset_batch()
            if self._device.type != "cpu":
                self.model.to(torch.device("cpu"))  # type: ignore[arg-type]
            self._asleep = True

    async def wake_up(self) -> None:
        """Move the weights back to the engine's device; generation works again."""
        async with self._model_lock:
            if self._asleep and self._device.type != "cpu":
                self.model.to(self._device)  # type: ignore[arg-type]
            self._asleep = False
