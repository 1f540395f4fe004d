"""A cluster worker: pulls batches of calls from Redis and runs them on a local sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

from redis.exceptions import RedisError

from rstar2_sandbox.cluster.coalesce import Coalescer
from rstar2_sandbox.cluster.messages import (
    Delivery,
    ResultMessage,
    TaskMessage,
    WorkerInfo,
    internal_error,
)
from rstar2_sandbox.cluster.queue import ClusterQueue, Completion
from rstar2_sandbox.models import RunResult
from rstar2_sandbox.protocol import Sandbox

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 64  # the paper's send workers batch up to 64 tool calls
LIVENESS_CACHE_S = 1.0


@dataclass
class WorkerCounters:
    """What one worker did since it started."""

    completed: int = 0
    """Results it wrote (the first for their call)."""
    duplicates: int = 0
    """Results it discarded because another worker had written one first."""
    gave_up: int = 0
    """Calls it failed with internal_error after too many deliveries or a bad entry."""
    orphaned: int = 0
    """Calls it dropped unrun because their front end is gone."""
    released: int = 0
    """Calls it handed back to the queue unrun on shutdown."""


class ClusterWorker:
    """Runs queued calls on ``sandbox`` with at most ``2 * slots`` of them held at once.

    Holding as many calls again as the sandbox has slots hides the Redis round trip; holding more
    would starve other workers. Reads take at most ``batch_size`` calls each.
    """

    def __init__(
        self,
        queue: ClusterQueue,
        sandbox: Sandbox,
        *,
        slots: int,
        batch_size: int = DEFAULT_BATCH_SIZE,
        worker_id: str | None = None,
        drain_timeout_s: float = 30.0,
        poll_s: float = 0.5,
        info: WorkerInfo | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.queue = queue
        self.sandbox = sandbox
        self.slots = slots
        self.batch_size = batch_size
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.drain_timeout_s = drain_timeout_s
        self.poll_s = poll_s
        self.info = info or WorkerInfo(slots=slots)
        self.counters = WorkerCounters()
        self._held: dict[str, TaskMessage] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._room = asyncio.Event()
        self._completer = Coalescer(queue.complete_many)
        self._alive_until: dict[str, float] = {}  # front end id -> when to check it again

    @property
    def max_held(self) -> int:
        return 2 * self.slots

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish (or hand back) the calls held."""
        settings = self.queue.settings
        await self.queue.ensure_group()
        await self.queue.heartbeat(self.worker_id, self.info)
        keeper_stop = asyncio.Event()
        keeper = asyncio.create_task(self._keep_alive(keeper_stop))
        logger.info(
            "worker %s serving: %d slots, batches of up to %d",
            self.worker_id,
            self.slots,
            self.batch_size,
        )
        next_claim = 0.0
        try:
            while not stop.is_set():
                free = self.max_held - len(self._held)
                if free <= 0:
                    self._room.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._room.wait(), self.poll_s)
                    continue
                count = min(free, self.batch_size)
                try:
                    deliveries: list[Delivery] = []
                    if time.monotonic() >= next_claim:
                        # Calls of dead workers go first: they have waited longest.
                        deliveries = await self.queue.claim_stale(self.worker_id, count)
                        if len(deliveries) < count:
                            next_claim = time.monotonic() + settings.lease_s / 2
                    if not deliveries:
                        deliveries = await self.queue.read_new(self.worker_id, count, self.poll_s)
                    await self._accept(deliveries)
                except RedisError:
                    # Redis restarting or failing over: keep trying (a restarted Redis without
                    # persistence lost the consumer group too).
                    logger.exception("worker %s lost Redis; retrying", self.worker_id)
                    await asyncio.sleep(self.poll_s)
                    with contextlib.suppress(RedisError):
                        await self.queue.ensure_group()
        finally:
            try:
                await self._drain()
            finally:
                keeper_stop.set()
                await keeper
            await self.queue.deregister(self.worker_id)
            logger.info("worker %s stopped: %s", self.worker_id, self.counters)

    async def _accept(self, deliveries: list[Delivery]) -> None:
        if not deliveries:
            return
        alive = await self._alive_frontends({d.reply_to for d in deliveries if d.reply_to})
        drop: list[str] = []
        max_deliveries = self.queue.settings.max_deliveries
        for delivery in deliveries:
            entry_id, request_id, reply_to = (
                delivery.entry_id,
                delivery.request_id,
                delivery.reply_to,
            )
            if request_id is None or reply_to is None:
                logger.error("dropping an entry no one can be answered for: %s", delivery.error)
                drop.append(entry_id)
            elif reply_to not in alive:
                logger.debug("dropping call %s: front end %s is gone", request_id, reply_to)
                drop.append(entry_id)
                self.counters.orphaned += 1
            elif delivery.task is None or delivery.deliveries > max_deliveries:
                reason = delivery.error or (
                    f"call {request_id} was handed to workers {delivery.deliveries} times "
                    f"(at most {max_deliveries}); the workers holding it died"
                )
                logger.warning("failing call %s: %s", request_id, reason)
                self.counters.gave_up += 1
                message = self._message(request_id, internal_error(reason), delivery.deliveries)
                await self._finish(entry_id, reply_to, message)
            else:
                self._held[entry_id] = delivery.task
                self._running[entry_id] = asyncio.create_task(
                    self._execute(entry_id, delivery.task, delivery.deliveries)
                )
        if drop:
            await self.queue.discard(drop)

    async def _alive_frontends(self, frontend_ids: set[str]) -> set[str]:
        """Which front ends are alive; a live one is not asked about again for a second.

        Dropping calls of vanished front ends only saves work, so a second of staleness costs
        nothing, while asking Redis before every batch would add a round trip to every call.
        """
        now = time.monotonic()
        unknown = {fid for fid in frontend_ids if self._alive_until.get(fid, 0.0) <= now}
        alive = await self.queue.alive_frontends(unknown) if unknown else set()
        if len(self._alive_until) > 1024:
            self._alive_until = {f: t for f, t in self._alive_until.items() if t > now}
        self._alive_until.update(dict.fromkeys(alive, now + LIVENESS_CACHE_S))
        return (frontend_ids - unknown) | alive

    async def _execute(self, entry_id: str, task: TaskMessage, deliveries: int) -> None:
        try:
            try:
                result = await self.sandbox.run(task.request)
            except Exception as exc:
                logger.exception("sandbox failed on call %s", task.request_id)
                result = internal_error(f"sandbox failed: {exc!r}")
            message = self._message(task.request_id, result, deliveries)
            await self._finish(entry_id, task.reply_to, message)
        finally:
            self._held.pop(entry_id, None)
            self._running.pop(entry_id, None)
            self._room.set()

    def _message(self, request_id: str, result: RunResult, deliveries: int) -> ResultMessage:
        return ResultMessage(
            request_id=request_id, result=result, worker=self.worker_id, deliveries=deliveries
        )

    async def _finish(self, entry_id: str, reply_to: str, message: ResultMessage) -> None:
        """Write the result of the call in ``entry_id`` unless another worker did first."""
        try:
            written = await self._completer.submit(Completion(entry_id, reply_to, message))
        except RedisError:
            # The call stays pending without a lease: another worker reclaims and reruns it.
            logger.exception("could not write the result of call %s", message.request_id)
            return
        if written:
            self.counters.completed += 1
        else:
            logger.info("discarding duplicate result of call %s", message.request_id)
            self.counters.duplicates += 1

    async def _keep_alive(self, stop: asyncio.Event) -> None:
        """Heartbeat and renew the leases of held calls, every third of the lease, until ``stop``.

        Every hundredth beat also forgets consumers of workers that died long ago (idle for 30
        leases, holding nothing), so the consumer group does not grow with every restart. It
        stops between beats: cancelling a Redis command midway costs a reconnection.
        """
        interval = self.queue.settings.lease_s / 3
        beats = 0
        while not stop.is_set():
            try:
                await self.queue.heartbeat(self.worker_id, self.info)
                await self.queue.renew(self.worker_id, list(self._held))
                if beats % 100 == 0:
                    await self.queue.prune_consumers(min_idle_s=30 * self.queue.settings.lease_s)
            except RedisError:
                logger.exception("worker %s could not renew its leases", self.worker_id)
            beats += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _drain(self) -> None:
        """Let running calls finish within ``drain_timeout_s``; hand the rest back unrun."""
        running = list(self._running.values())
        if running:
            logger.info("worker %s finishing %d call(s)", self.worker_id, len(running))
            await asyncio.wait(running, timeout=self.drain_timeout_s)
        unfinished = dict(self._held)
        for entry_id in unfinished:
            self._running[entry_id].cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if unfinished:
            logger.info("worker %s handing back %d call(s)", self.worker_id, len(unfinished))
            await self.queue.release(unfinished)
            self.counters.released += len(unfinished)
