"""An in-process transformers model behind the ``Engine`` interface (CPU or GPU).

Pending requests are batched by the engine itself: transformers' own continuous batching
(``generate_batch``) sees no free memory on CPU, so this engine keeps an explicit KV token budget.
A request is admitted while the sum of admitted reservations (prompt + ``max_new_tokens``) fits
the budget, so a running request can always finish and nothing is ever preempted. Requests that
arrive while a batch decodes join it at the next step: they are prefilled alone and their keys
and values appended to the batch's (left-padded), and rows with the same context (an RL group's
samples) are prefilled once; finished rows leave the KV cache at once.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from rstar2_scheduler.compute import run_on_device
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

_StepFn = Callable[[list["_Row"]], tuple[list[int], list[float]]]
"""One forward step over some batch rows: their next tokens and log-probs."""


class TransformersEngineConfig(BaseModel):
    """Batching limits of a ``TransformersEngine``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="transformers", min_length=1)
    kv_budget_tokens: int = Field(gt=0, description="KV cache capacity in tokens (all rows).")
    max_batch_size: int = Field(default=16, ge=1, description="Rows decoded together at most.")
    seed: int = Field(default=0, description="Seeds requests that bring no seed of their own.")
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads of torch during this engine's forward steps (None: "
        "torch's setting). On a CPU a small model decodes faster on one thread, where OpenMP's "
        "synchronisation costs more than the parallel work saves.",
    )


@dataclass(eq=False)
class _Row:
    request: GenerationRequest
    future: asyncio.Future[GenerationResult]
    rng: random.Random
    """The row's own sampling stream (seeded by its request), so its tokens do not depend on
    its batch."""
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
        rng = random.Random(seed if seed is not None else self._rng.getrandbits(63))
        row = _Row(request, asyncio.get_running_loop().create_future(), rng)
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
            joined = self._admit()
            if not self._running:
                self._reset_batch()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                if self._cache is None or (joined and not self._can_join()):
                    await self._step(list(self._running), self._prefill)
                elif joined:
                    await self._step(joined, self._join)
                else:
                    await self._step(list(self._running), self._decode)
            except Exception as failure:
                logger.exception("%s: batch step failed", self.name)
                for row in self._running:
                    row.resolve("error", f"{type(failure).__name__}: {failure}")
                self._running.clear()
                self._reset_batch()

    async def _step(self, rows: list[_Row], step: _StepFn) -> None:
        """Generate one token for each of ``rows`` (all running rows, or those joining the
        batch); finished rows leave the batch."""
        async with self._model_lock:
            tokens, logprobs = await run_on_device(str(self._device), self._run, step, rows)
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            reason = row.finish_reason()
            if reason is not None:
                row.resolve(reason)
        batch = self._running  # in the order of the cache's rows
        keep = [index for index, row in enumerate(batch) if not row.future.done()]
        self._running = [batch[index] for index in keep]
        if not keep:
            self._reset_batch()
        elif len(keep) < len(batch):
            self._select(keep)

    def _run(self, step: _StepFn, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """``step(rows)`` with the engine's torch thread count, restored after (the compute
        thread also runs other work, such as a trainer's update)."""
        threads = self.config.torch_threads
        if threads is None:
            return step(rows)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return step(rows)
        finally:
            torch.set_num_threads(previous)

    def _batch_rows(self) -> int:
        return 0 if self._attention is None else int(self._attention.shape[0])

    def _admit(self) -> list[_Row]:
        """Move waiting requests into the batch while they fit; returns the ones moved."""
        reserved = sum(row.reserved for row in self._running)
        admitted: list[_Row] = []
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
            admitted.append(row)
        return admitted

    def _reset_batch(self) -> None:
        self._cache = None
        self._attention = None

    def _select(self, rows: list[int]) -> None:
        """Keep (or copy) the batch rows ``rows``, in that order, in the cache and the mask."""
        assert self._cache is not None
        assert self._attention is not None
        index = torch.tensor(rows, dtype=torch.long, device=self._device)
        self._cache.batch_select_indices(index)
        self._attention = self._attention[index]

    @torch.inference_mode()
    def _prefill(self, rows: list[_Row]) -> tuple[list[int], list[float]]:
        # Rows with the same context (the samples of one prompt, in RL) are computed once and
        # their keys and values copied: most of an RL step's prefill is its repeated prompts.
        first: dict[tuple[int, ...], int] = {}
        source = [
            first.setdefault((*row.request.prompt_ids, *row.tokens), len(first)) for row in rows
        ]
        sequences = list(first)
        width = max(len(sequence) for sequence in sequences)
        input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
        attention = torch.zeros((len(sequences), width), dtype=torch.long)
        for index, sequence in enumerate(sequences):
            input_ids[index, width - len(sequence) :] = torch.tensor(sequence)
            attention[index, width - len(sequence) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        self._cache = DynamicCache(config=self.model.config)
        self._attention = attention.to(self._device)
        logits = self._logits(input_ids, positions)
        if len(sequences) < len(rows):
            self._select(source)
            logits = logits[torch.tensor(source, device=logits.device)]
        return self._sample(rows, logits)

    @torch.inference_mode()
    def _decode(self, rows: list[_Row]) -> tuple[list[int], list[float]]:
        assert self._attention is not None
        input_ids = torch.tensor([[row.tokens[-1]] for row in rows])
        positions = torch.tensor([[row.length - 1] for row in rows])
        ones = torch.ones((len(rows), 1), dtype=torch.long, device=self._device)
        self._attention = torch.cat([self._attention, ones], dim=-1)
        return self._sample(rows, self._logits(input_ids, positions))

    def _can_join(self) -> bool:
        """Whether new rows can be prefilled alone and appended to the cached batch: every
        layer's cache is a plain growing tensor (a sliding-window or other cache is re-prefilled
        with the whole batch instead)."""
        return self._cache is not None and all(
            type(layer) is DynamicLayer for layer in self._cache.layers
        )

    @torch.inference_mode()
    def _join(self, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """Prefill ``rows`` (the last rows of ``_running``) alone and append them to the batch;
        the running rows keep their cache, so a rollout back from a tool call costs its own
        prefill, not the whole batch's. Both sides are left-padded to the longer one."""
        cache, attention = self._cache, self._attention
        assert cache is not None
        assert attention is not None
        out = self._prefill(rows)
        joined, joined_attention = self._cache, self._attention
        assert joined is not None
        assert joined_attention is not None
        width = max(attention.shape[1], joined_attention.shape[1])

        def left_pad(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            missing = width - tensor.shape[-dim_from_end]
            return torch.nn.functional.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))

        for mine, theirs in zip(cache.layers, joined.layers, strict=True):
            assert isinstance(mine, DynamicLayer)  # checked by _can_join
            assert isinstance(theirs, DynamicLayer)
            assert mine.keys is not None
            assert mine.values is not None
            assert theirs.keys is not None
            assert theirs.values is not None
            mine.keys = torch.cat([left_pad(mine.keys, 2), left_pad(theirs.keys, 2)])
            mine.values = torch.cat([left_pad(mine.values, 2), left_pad(theirs.values, 2)])
        self._cache = cache
        self._attention = torch.cat([left_pad(attention, 1), left_pad(joined_attention, 1)])
        return out

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The next-token logits of every batch row, ``[rows, vocab]``; extends the cache."""
        output = self.model(
            input_ids=input_ids.to(self._device),
            attention_mask=self._attention,
            position_ids=positions.to(self._device),
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        return sample_next(
            logits,
            [row.request.sampling.temperature for row in rows],
            [row.request.sampling.top_p for row in rows],
            [row.rng for row in rows],
        )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Copy ``weights`` into the model between forward steps (names as in its
        ``state_dict``; dtype and device are converted). Running requests continue with the new
        weights after a re-prefill. A name the model lacks or a wrong shape raises
        ``ValueError`` before any weight changes."""
        async with self._model_lock:
            await run_on_device(str(self._device), self._load_weights, list(weights))
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
