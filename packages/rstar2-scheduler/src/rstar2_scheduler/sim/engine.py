"""``SimEngine``: a simulated continuous-batching inference engine for scheduler benchmarks.

It behaves like one vLLM instance at the level a rollout scheduler can observe: a paged KV cache
with prefix caching, a step loop that batches every running sequence, prefill and decode costs
that grow with the batch and the tokens it attends to, and recompute preemption of the newest
sequence when the cache runs out of blocks. Time passes through ``asyncio.sleep``, so on a
``VirtualTimeEventLoop`` an hour of engine time costs only the Python bookkeeping.

What is simulated, not computed: the output tokens are seeded random ids whose count is drawn
from ``SimEngineConfig.output_tokens`` and cut at ``max_new_tokens``; a drawn stop id ends the
completion early, and a completion that stops at its drawn length ends with the first stop id.
Every log-prob is 0.0. Outputs depend on the request's seed (or its id when it has none, or its
prompt when greedy), not on batching or preemption.
"""

from __future__ import annotations

import asyncio
import logging
import random
from array import array
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    KVStats,
    NamedTensors,
)
from rstar2_scheduler.sim.batching import Batcher, SimSequence
from rstar2_scheduler.sim.distributions import LogNormal
from rstar2_scheduler.sim.kv_blocks import BlockPool

logger = logging.getLogger(__name__)

_MAX_VOCAB = 1 << 16


class SimEngineConfig(BaseModel):
    """Capacity, batching limits and cost model of one simulated engine.

    The default costs are an order-of-magnitude calibration for a 14B dense model (40 layers,
    8 KV heads of 128, bf16: 160 KiB of KV per token) on one MI300X-class GPU: a decode step
    reads the weights (28 GB at ~3.7 TB/s effective: ~7.6 ms) plus the KV of every context
    token (~44 ns each), plus ~2 ms of scheduling and sampling; each sequence adds ~54 us of
    matmul work per step, and prefill costs ~36 us per token. ``num_blocks`` x ``block_size``
    = 610K tokens is what ~100 GB of KV cache holds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_blocks: int = Field(default=38_144, gt=0, description="KV cache size in blocks.")
    block_size: int = Field(default=16, gt=0, description="Tokens per KV block.")
    max_num_seqs: int = Field(default=256, gt=0, description="Most sequences in one batch.")
    max_prefill_tokens: int = Field(
        default=8192, gt=0, description="Prefill tokens admitted per step (one request always)."
    )
    watermark: float = Field(
        default=0.01, ge=0, lt=1, description="Fraction of blocks admission keeps free."
    )
    max_model_len: int | None = Field(
        default=None, gt=1, description="Longest prompt + output; default: what the cache holds."
    )
    prefix_caching: bool = Field(default=True, description="Reuse cached blocks of a prefix.")
    step_overhead_s: float = Field(default=9.5e-3, ge=0, description="Fixed cost of a step.")
    decode_s_per_seq: float = Field(default=54e-6, ge=0, description="Per running sequence.")
    attention_s_per_token: float = Field(
        default=44e-9, ge=0, description="Per context token of every running sequence, per step."
    )
    prefill_s_per_token: float = Field(default=36e-6, ge=0, description="Per prefilled token.")
    output_tokens: LogNormal = Field(
        default=LogNormal(median=500, sigma=1.0),
        description="Length of a completion before max_new_tokens cuts it.",
    )
    vocab_size: int = Field(default=_MAX_VOCAB, ge=2, le=_MAX_VOCAB)
    seed: int = Field(default=0, description="Seeds outputs of requests that carry no seed.")
    max_steps_per_event: int = Field(
        default=64,
        gt=0,
        description="Simulation granularity: decode steps computed at once between events.",
    )

    @model_validator(mode="after")
    def _check_model_len(self) -> SimEngineConfig:
        if self.max_model_len is not None and self.max_model_len > self.usable_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) exceeds the {self.usable_tokens} tokens "
                "the KV cache holds outside the watermark"
            )
        return self

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def usable_tokens(self) -> int:
        return (self.num_blocks - self.watermark_blocks) * self.block_size - 1

    @property
    def model_len(self) -> int:
        return self.max_model_len if self.max_model_len is not None else self.usable_tokens

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Duration of one decode step over ``batch`` sequences holding ``context_tokens``."""
        return (
            self.step_overhead_s
            + self.decode_s_per_seq * batch
            + self.attention_s_per_token * context_tokens
        )


class SimEngineCounters(BaseModel):
    """What a SimEngine did since it was created."""

    model_config = ConfigDict(extra="forbid")

    busy_s: float = Field(default=0.0, description="Time spent running steps.")
    steps: int = 0
    decode_tokens: int = Field(default=0, description="Tokens generated.")
    prefill_tokens: int = Field(default=0, description="Tokens prefilled (computed KV).")
    cached_tokens: int = Field(default=0, description="Prompt tokens served by the prefix cache.")
    recomputed_tokens: int = Field(default=0, description="Prefill of preempted sequences.")
    preemptions: int = 0
    finished: int = 0
    mid_request_swaps: int = Field(
        default=0, description="Weight updates that arrived while requests were in the engine."
    )


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SimEngine(Engine):
    """A simulated engine (see the module docstring); run it on a ``VirtualTimeEventLoop``."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"update_weights", "reset_prefix_cache"}
    )
    unsupported_reason: ClassVar[str] = "a simulated engine holds no weights to move"

    def __init__(self, config: SimEngineConfig | None = None, *, name: str = "sim") -> None:
        self.config = config or SimEngineConfig()
        self.name = name
        cfg = self.config
        self._batch = Batcher(
            BlockPool(cfg.num_blocks, prefix_caching=cfg.prefix_caching),
            block_size=cfg.block_size,
            max_num_seqs=cfg.max_num_seqs,
            max_prefill_tokens=cfg.max_prefill_tokens,
            watermark_blocks=cfg.watermark_blocks,
        )
        self._busy_s = 0.0
        self._steps = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self.weights_version: str | None = None
        self._mid_request_swaps = 0

    # -- Engine interface -------------------------------------------------------------------

    async def start(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._step_loop(), name=f"{self.name}-steps")

    async def close(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for seq in self._batch.clear():
            if not seq.future.done():
                seq.future.set_result(seq.result("abort"))

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        """Simulated: outputs do not depend on weights, but cached prefixes go stale and later
        results carry ``version``. Like a real engine it does not wait for running requests:
        keeping weights from changing mid-request is the caller's part (``TurnGate``); such
        updates are counted, and results keep the version their request arrived under."""
        if self._batch.running or self._batch.waiting:
            self._mid_request_swaps += 1
        await self.reset_prefix_cache()
        self.weights_version = version

    async def reset_prefix_cache(self) -> None:
        self._batch.pool.forget_prefixes()

    def kv_stats(self) -> KVStats:
        return KVStats(
            capacity_tokens=self.config.capacity_tokens,
            used_tokens=self._batch.pool.used_blocks * self.config.block_size,
            running=len(self._batch.running),
            waiting=len(self._batch.waiting),
            preemptions=self._batch.counters.preemptions,
            max_running=self.config.max_num_seqs,
        )

    @property
    def counters(self) -> SimEngineCounters:
        """A snapshot of what the engine did since it was created."""
        c = self._batch.counters
        return SimEngineCounters(
            busy_s=self._busy_s,
            steps=self._steps,
            decode_tokens=c.decode_tokens,
            prefill_tokens=c.prefill_tokens,
            cached_tokens=c.cached_tokens,
            recomputed_tokens=c.recomputed_tokens,
            preemptions=c.preemptions,
            finished=c.finished,
            mid_request_swaps=self._mid_request_swaps,
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt_len = len(request.prompt_ids)
        limit = self.config.model_len
        if prompt_len + request.sampling.max_new_tokens > limit:
            return GenerationResult(
                request_id=request.request_id,
                token_ids=(),
                logprobs=(),
                finish_reason="error",
                error=(
                    f"prompt ({prompt_len} tokens) + max_new_tokens "
                    f"({request.sampling.max_new_tokens}) exceeds max_model_len ({limit})"
                ),
            )
        await self.start()
        output, reason = self._draw_output(request)
        seq = SimSequence(request, output, reason, asyncio.get_running_loop().create_future())
        seq.version = self.weights_version
        batch = self._batch
        batch.waiting.append(seq)
        # Only a request that could join the batch at the next step ends a span of steps early:
        # behind other waiting requests, or with the batch full, it waits for a finish anyway.
        if len(batch.waiting) == 1 and len(batch.running) < self.config.max_num_seqs:
            self._notify()
        try:
            return await seq.future
        except asyncio.CancelledError:
            self._batch.drop(seq)
            raise

    # -- simulated outputs ------------------------------------------------------------------

    def _draw_output(self, request: GenerationRequest) -> tuple[array[int], FinishReason]:
        sampling = request.sampling
        if sampling.seed is not None:
            key: int | str = sampling.seed
        elif sampling.temperature == 0:
            key = f"greedy:{hash(request.prompt_ids)}"
        else:
            key = f"{self.config.seed}:{request.request_id}"
        rng = random.Random(key)
        length = self.config.output_tokens.sample_int(rng)
        reason: FinishReason = "stop"
        if length >= sampling.max_new_tokens:
            length, reason = sampling.max_new_tokens, "length"
        tokens = array("H", rng.randbytes(2 * length))
        vocab = self.config.vocab_size
        if vocab < _MAX_VOCAB:
            tokens = array("H", [t % vocab for t in tokens])
        # Ids outside the vocabulary can never be generated.
        valid_stops = [t for t in sampling.stop_token_ids if 0 <= t < vocab]
        stops = set(valid_stops)
        if stops:
            # A stop id drawn early ends the completion there, as in a real engine; a completion
            # that runs its drawn length without one ends with the first stop id.
            first = next((i for i, t in enumerate(tokens) if t in stops), None)
            if first is not None:
                tokens, reason = tokens[: first + 1], "stop"
            elif reason == "stop":
                tokens[-1] = valid_stops[0]
        return tokens, reason

    # -- the step loop ----------------------------------------------------------------------

    def _notify(self) -> None:
        if self._wake is not None:
            _done(self._wake)

    async def _pause(self, duration: float | None, *, interruptible: bool) -> float:
        """Sleep ``duration`` (forever if None), or until a request arrives when interruptible."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        future: asyncio.Future[None] = loop.create_future()
        handle = None if duration is None else loop.call_later(duration, _done, future)
        if interruptible:
            self._wake = future
        try:
            await future
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None
        return loop.time() - began

    async def _step_loop(self) -> None:
        cfg, batch = self.config, self._batch
        while True:
            if batch.idle:
                await self._pause(None, interruptible=True)
                continue
            preempted = batch.make_room()
            prefill = 0 if preempted else batch.admit()
            size, context = len(batch.running), batch.context_tokens
            steps = 1 if preempted or prefill else batch.steps_until_event(cfg.max_steps_per_event)
            durations = [cfg.decode_step_s(size, context + j * size) for j in range(steps)]
            durations[0] += prefill * cfg.prefill_s_per_token
            total = sum(durations)
            if steps > 1:
                elapsed = await self._pause(total, interruptible=True)
                if elapsed < total:
                    # A request arrived: finish the step in progress, then let it join.
                    done, spent = 0, 0.0
                    while done < steps and (spent < elapsed or done == 0):
                        spent += durations[done]
                        done += 1
                    await self._pause(spent - elapsed, interruptible=False)
                    steps, total = done, spent
            else:
                await self._pause(total, interruptible=False)
            self._busy_s += total
            self._steps += steps
            for seq in batch.advance(steps):
                if not seq.future.done():
                    seq.future.set_result(seq.result())
