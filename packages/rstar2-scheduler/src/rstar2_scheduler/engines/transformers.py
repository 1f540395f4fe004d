"""An in-process transformers model behind the ``Engine`` interface (CPU or GPU).

Pending requests are batched by the engine itself: transformers' own continuous batching
(``generate_batch``) sees no free memory on CPU, and samples with one global generator and its
own log-prob convention, so this engine keeps an explicit KV token budget and its own sampling
(per-request seeds, log-probs of the temperature-scaled distribution). A request is admitted
while the sum of admitted reservations (prompt + ``max_new_tokens``) fits the budget, so a
running request can always finish and nothing is ever preempted. Requests that arrive while a
batch decodes join it at the next step: they are prefilled alone and their keys and values added
to the batch's, and rows with the same context (an RL group's samples) are prefilled once;
finished rows leave the batch at once.

Where the batch's keys and values live is a ``KVBatch``: on CPU a left-padded ``DynamicCache``
(``PaddedBatch``); on accelerators per-row slots of a preallocated cache with a grouped-query
decode attention and a CUDA-graph-compiled decode step (``SlotBatch``, ``slots.py``).

For RL the engine takes new weights in place (``update_weights``) between requests: it lets the
running requests finish on the weights they started with and holds new ones until the copy is
done, so the tokens of one result all come from one version of the weights, the version its
``weights_version`` names. It can ``sleep`` to give its memory to a colocated trainer; nothing is
cached across requests, so ``reset_prefix_cache`` has nothing to forget.
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
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM, PreTrainedModel

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
from rstar2_scheduler.engines.padded import KVBatch, PaddedBatch
from rstar2_scheduler.engines.sampling import Sampled, sample_next
from rstar2_scheduler.engines.slots import (
    DEFAULT_COMPILE_BUDGET_S,
    DEFAULT_MAX_COMPILED_GRAPHS,
    SlotBatch,
    slots_unsupported,
)

logger = logging.getLogger(__name__)

_StepFn = Callable[[list["_Row"]], Sampled]
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
    decode: Literal["auto", "padded", "slots"] = Field(
        default="auto",
        description="Where the batch's keys and values live. padded: a left-padded "
        "DynamicCache grown by concatenation (exact, simple; the CPU path). slots: per-row "
        "slots of a preallocated cache, written in place, with a grouped-query decode "
        "attention (the accelerator path; full-attention models only). auto: slots on an "
        "accelerator when the model supports them, else padded.",
    )
    compile: bool = Field(
        default=False,
        description="slots: run the decode step under torch.compile with CUDA graphs (mode "
        "reduce-overhead), within compile_budget_s and max_compiled_graphs, eager on any "
        "compiler error. Off by default until a GPU run shows it faster than eager decoding "
        "including its compile time (45 s on an H200 for Qwen3-0.6B).",
    )
    compile_budget_s: float = Field(
        default=DEFAULT_COMPILE_BUDGET_S,
        gt=0,
        description="compile: seconds of compiling after which decoding is eager for the rest "
        "of the engine's life (logged).",
    )
    max_compiled_graphs: int = Field(
        default=DEFAULT_MAX_COMPILED_GRAPHS,
        ge=1,
        description="compile: decode-step graphs (cache and window shapes) compiled after "
        "which decoding is eager for the rest of the engine's life (a recompile storm; "
        "logged).",
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
    support: list[tuple[int, ...]] = field(default_factory=list)

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

    def resolve(
        self, reason: FinishReason, error: str | None = None, *, version: str | None = None
    ) -> None:
        if not self.future.done():
            self.future.set_result(
                GenerationResult(
                    request_id=self.request.request_id,
                    token_ids=tuple(self.tokens),
                    logprobs=tuple(self.logprobs),
                    finish_reason=reason,
                    error=error,
                    weights_version=version,
                    support=tuple(self.support) if self.request.sampling.return_support else None,
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
        self._batch = self._make_batch(model, config)
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # Held around every forward step, so weights never change in the middle of one.
        self._model_lock = asyncio.Lock()
        self._asleep = False
        self.weights_version: str | None = None
        # Weight updates waiting for the running requests to finish: nothing new is admitted.
        self._swaps_waiting = 0
        self._drained = asyncio.Event()

    def _make_batch(self, model: PreTrainedModel, config: TransformersEngineConfig) -> KVBatch:
        mode = config.decode
        problem = slots_unsupported(model)
        if mode == "auto":
            mode = "slots" if self._device.type != "cpu" and problem is None else "padded"
        if mode == "slots":
            if problem is not None:
                raise ValueError(f"decode='slots': {type(model).__name__} cannot, {problem}")
            logger.info("%s: slot decoding (compiled: %s)", config.name, config.compile)
            return SlotBatch(
                model,
                self._device,
                max_slots=config.max_batch_size,
                compile=config.compile,
                compile_budget_s=config.compile_budget_s,
                max_compiled_graphs=config.max_compiled_graphs,
            )
        if model.config._attn_implementation == "flex_attention":
            # A trainer's choice for packed rows; decoding a padded batch with it would compile
            # a kernel per new shape.
            model.set_attn_implementation("sdpa")
        return PaddedBatch(model, self._device)

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
            row.resolve("abort", "engine closed", version=self.weights_version)
        self._running.clear()
        self._pending.clear()
        self._batch.release()

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=self.config.kv_budget_tokens,
            used_tokens=sum(row.length for row in self._running),
            running=len(self._running),
            waiting=len(self._pending),
            max_running=self.config.max_batch_size,
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
            if not self._running:
                self._drained.set()
            if len(self._running) < self._batch.rows:
                self._reset_batch()  # a caller cancelled: rebuild without its row
            joined = self._admit()
            if not self._running:
                self._reset_batch()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                if not self._batch.rows or (joined and not self._batch.can_join()):
                    await self._step(list(self._running), self._prefill)
                elif joined:
                    await self._step(joined, self._join)
                else:
                    await self._step(list(self._running), self._decode)
            except Exception as failure:
                logger.exception("%s: batch step failed", self.name)
                for row in self._running:
                    row.resolve(
                        "error",
                        f"{type(failure).__name__}: {failure}",
                        version=self.weights_version,
                    )
                self._running.clear()
                self._reset_batch()

    async def _step(self, rows: list[_Row], step: _StepFn) -> None:
        """Generate one token for each of ``rows`` (all running rows, or those joining the
        batch); finished rows leave the batch."""
        async with self._model_lock:
            sampled = await run_on_device(str(self._device), self._run, step, rows)
        for row, token, logprob, support in zip(rows, *sampled, strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if support is not None:
                row.support.append(support)
            reason = row.finish_reason()
            if reason is not None:
                row.resolve(reason, version=self.weights_version)
        batch = self._running  # in the order of the cache's rows
        keep = [index for index, row in enumerate(batch) if not row.future.done()]
        self._running = [batch[index] for index in keep]
        if not keep:
            self._reset_batch()
        elif len(keep) < len(batch):
            self._select(keep)

    def _run(self, step: _StepFn, rows: list[_Row]) -> Sampled:
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

    def _admit(self) -> list[_Row]:
        """Move waiting requests into the batch while they fit; returns the ones moved."""
        reserved = sum(row.reserved for row in self._running)
        admitted: list[_Row] = []
        while (
            not self._swaps_waiting
            and self._pending
            and len(self._running) < self.config.max_batch_size
        ):
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
        self._batch.clear()

    def _select(self, rows: list[int]) -> None:
        """Keep the batch rows ``rows``, in that order."""
        self._batch.keep(rows)

    @staticmethod
    def _contexts(rows: list[_Row]) -> tuple[list[tuple[int, ...]], list[int]]:
        return [(*row.request.prompt_ids, *row.tokens) for row in rows], [r.reserved for r in rows]

    @torch.inference_mode()
    def _prefill(self, rows: list[_Row]) -> Sampled:
        return self._sample(rows, self._batch.start(*self._contexts(rows)))

    @torch.inference_mode()
    def _join(self, rows: list[_Row]) -> Sampled:
        """Prefill ``rows`` (the last rows of ``_running``) alone and add them to the batch."""
        return self._sample(rows, self._batch.join(*self._contexts(rows)))

    @torch.inference_mode()
    def _decode(self, rows: list[_Row]) -> Sampled:
        tokens = [row.tokens[-1] for row in rows]
        return self._sample(rows, self._batch.step(tokens, [row.length - 1 for row in rows]))

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> Sampled:
        return sample_next(
            logits, [row.request.sampling for row in rows], [row.rng for row in rows]
        )

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Copy ``weights`` into the model between requests (names as in its ``state_dict``;
        dtype and device are converted) and label later results with ``version``. Running
        requests finish on the weights they started with; requests that arrive meanwhile wait
        for the new ones. A name the model lacks or a wrong shape raises ``ValueError`` before
        any weight changes."""
        self._swaps_waiting += 1
        try:
            while any(not row.future.done() for row in self._running):
                self._drained.clear()
                await self._drained.wait()
            async with self._model_lock:
                await run_on_device(str(self._device), self._load_weights, list(weights))
                self._reset_batch()  # cached keys and values came from the old weights
                self.weights_version = version
        finally:
            self._swaps_waiting -= 1
            if self._wakeup is not None:
                self._wakeup.set()  # requests held during the copy may start now

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
            self._batch.release()
            if self._device.type != "cpu":
                self.model.to(torch.device("cpu"))  # type: ignore[arg-type]
            self._asleep = True

    async def wake_up(self) -> None:
        """Move the weights back to the engine's device; generation works again."""
        async with self._model_lock:
            if self._asleep and self._device.type != "cpu":
                self.model.to(self._device)  # type: ignore[arg-type]
            self._asleep = False
