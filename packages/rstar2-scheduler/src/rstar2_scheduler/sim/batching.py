"""Continuous-batching bookkeeping of a simulated engine: admission, growth, preemption.

Time inside the batch is counted in decode steps. A running sequence's length is its length at
admission plus the steps run since, so a step costs nothing per sequence: only the sequences
that cross into a new KV block or finish during a span of steps are touched. This is what lets
a paper-scale rollout phase run in seconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from array import array
from collections import deque
from dataclasses import dataclass, field

from rstar2_scheduler.engine import FinishReason, GenerationRequest, GenerationResult
from rstar2_scheduler.sim.kv_blocks import BlockPool, extend_hashes


@dataclass(eq=False, slots=True)
class SimSequence:
    """One request inside a simulated engine."""

    request: GenerationRequest
    output: array[int]  # every token it will generate
    finish_reason: FinishReason
    future: asyncio.Future[GenerationResult]
    generated: int = 0  # frozen while waiting; while running: base + batch step
    preempted: bool = False
    blocks: list[int] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)  # hashes of its full blocks known so far
    base: int = 0
    capacity: int = 0  # tokens its blocks hold
    boundary: int = 0  # the step that needs its next block
    serial: int = 0  # admission number; tells a stale finish entry from a live one
    version: str | None = None  # the engine's weights version when the request arrived

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def result(self, reason: FinishReason | None = None) -> GenerationResult:
        n = self.generated
        return GenerationResult(
            request_id=self.request.request_id,
            token_ids=tuple(self.output[:n]),
            logprobs=(0.0,) * n,
            finish_reason=reason or self.finish_reason,
            weights_version=self.version,
        )


@dataclass(slots=True)
class BatchCounters:
    decode_tokens: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    finished: int = 0


class Batcher:
    """The waiting queue and the running batch of one engine over a ``BlockPool``.

    Policy, as in vLLM: running sequences get the blocks they need first; when blocks run out
    the newest running sequence is preempted (its KV freed; it is recomputed when readmitted
    from the front of the queue); waiting sequences are admitted first come, first served while
    their blocks fit above the watermark, the batch has room, and the step's prefill budget
    allows (a lone request always fits).
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        block_size: int,
        max_num_seqs: int,
        max_prefill_tokens: int,
        watermark_blocks: int,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.watermark_blocks = watermark_blocks
        self.counters = BatchCounters()
        self.step = 0
        self.running: dict[SimSequence, None] = {}  # in admission order
        self.waiting: deque[SimSequence] = deque()
        self._crossings: dict[int, set[SimSequence]] = {}
        self._ends: list[tuple[int, int, SimSequence]] = []
        self._serials = itertools.count(1)
        self._base_sum = 0  # sum of prompt_len + base over the running sequences

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def context_tokens(self) -> int:
        """Tokens the running sequences attend to."""
        return self._base_sum + len(self.running) * self.step

    def blocks_needed(self, steps: int) -> int:
        """Blocks the running sequences lack to grow by ``steps`` tokens each."""
        size, start, total = self.block_size, self.step, 0
        for t in range(start, start + steps):
            group = self._crossings.get(t)
            if group:
                total += len(group) * (1 + (start + steps - 1 - t) // size)
        return total

    def make_room(self) -> bool:
        """Preempt the newest sequences until every running one can grow by a token."""
        preempted = False
        while self.running and self.blocks_needed(1) > self.pool.free_blocks:
            victim = next(reversed(self.running))
            self._leave(victim)
            self._evict(victim)
            victim.preempted = True
            self.waiting.appendleft(victim)
            self.counters.preemptions += 1
            preempted = True
        return preempted

    def admit(self) -> int:
        """Move waiting sequences into the batch; returns the tokens to prefill this step."""
        size, counters = self.block_size, self.counters
        prefill = 0
        reserved = self.blocks_needed(1)  # the running sequences' next tokens come first
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            length = seq.prompt_len + seq.generated
            hits = self.pool.cached_prefix(self._chain(seq))
            cached = min(len(hits) * size, length - 1)  # the last token is always computed
            new_blocks = -(-(length + 1) // size) - len(hits)
            compute = length - cached
            taken = new_blocks + self.pool.unreferenced(hits) + reserved
            if taken > self.pool.free_blocks - self.watermark_blocks or (
                prefill and prefill + compute > self.max_prefill_tokens
            ):
                break
            self.waiting.popleft()
            self.pool.acquire(hits)
            seq.blocks = hits + self.pool.allocate(new_blocks)
            self._join(seq, length)
            prefill += compute
            counters.prefill_tokens += compute
            counters.cached_tokens += cached
            if seq.preempted:
                counters.recomputed_tokens += compute
        return prefill

    def steps_until_event(self, limit: int) -> int:
        """Steps (at most ``limit``) to run before a sequence finishes or blocks run out."""
        while self._ends and not self._live(self._ends[0]):
            heapq.heappop(self._ends)
        steps = max(1, min(limit, self._ends[0][0] - self.step)) if self._ends else limit
        free = self.pool.free_blocks
        if self.blocks_needed(steps) <= free:
            return steps
        low, high = 1, steps - 1  # one step fits: make_room ran
        while low < high:
            mid = (low + high + 1) // 2
            if self.blocks_needed(mid) <= free:
                low = mid
            else:
                high = mid - 1
        return low

    def advance(self, steps: int) -> list[SimSequence]:
        """Run ``steps`` decode steps; returns the sequences that finished (their KV freed)."""
        size, start = self.block_size, self.step
        end = start + steps
        for t in range(start, end):
            group = self._crossings.pop(t, None)
            for seq in group or ():
                count = 1 + (end - 1 - t) // size
                seq.blocks += self.pool.allocate(count)
                seq.capacity += count * size
                seq.boundary = t + count * size
                self._crossings.setdefault(seq.boundary, set()).add(seq)
        self.step = end
        self.counters.decode_tokens += steps * len(self.running)
        finished: list[SimSequence] = []
        while self._ends and self._ends[0][0] <= end:
            entry = heapq.heappop(self._ends)
            if self._live(entry):
                seq = entry[2]
                self._leave(seq)
                self._evict(seq)
                finished.append(seq)
        self.counters.finished += len(finished)
        return finished

    def drop(self, seq: SimSequence) -> None:
        """Forget a sequence whose caller went away."""
        if seq in self.running:
            self._leave(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []

    def clear(self) -> list[SimSequence]:
        """Remove every sequence, freeing its blocks; returns them."""
        everyone = [*self.running, *self.waiting]
        for seq in everyone:
            self.drop(seq)
        return everyone

    # -- internals -------------------------------------------------------------------------

    def _join(self, seq: SimSequence, length: int) -> None:
        seq.capacity = len(seq.blocks) * self.block_size
        seq.base = seq.generated - self.step
        seq.boundary = self.step + seq.capacity - length
        seq.serial = next(self._serials)
        self.running[seq] = None
        self._crossings.setdefault(seq.boundary, set()).add(seq)
        finish = self.step + len(seq.output) - seq.generated
        heapq.heappush(self._ends, (finish, seq.serial, seq))
        self._base_sum += seq.prompt_len + seq.base

    def _leave(self, seq: SimSequence) -> None:
        del self.running[seq]
        group = self._crossings[seq.boundary]
        group.discard(seq)
        if not group:
            del self._crossings[seq.boundary]
        self._base_sum -= seq.prompt_len + seq.base
        seq.generated = seq.base + self.step

    def _live(self, entry: tuple[int, int, SimSequence]) -> bool:
        seq = entry[2]
        return seq.serial == entry[1] and seq in self.running

    def _chain(self, seq: SimSequence) -> list[int]:
        """Hashes of every full block of the sequence's tokens, extending what it knew."""
        size, prompt = self.block_size, seq.request.prompt_ids
        start = len(seq.chain) * size
        if seq.prompt_len + seq.generated - start >= size:
            if start < len(prompt):
                tail = prompt[start:] + tuple(seq.output[: seq.generated])
            else:
                tail = tuple(seq.output[start - len(prompt) : seq.generated])
            seq.chain = extend_hashes(seq.chain, tail, size)
        return seq.chain

    def _evict(self, seq: SimSequence) -> None:
        """Free a sequence's blocks, keeping its full blocks findable in the prefix cache."""
        self.pool.release(seq.blocks, self._chain(seq))
        seq.blocks = []
