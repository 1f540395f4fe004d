"""The cluster's queue in Redis: one stream with a consumer group, results written once.

Layout under ``key_prefix`` (``P``):

- ``P:tasks``: stream of queued calls; consumer group ``workers``. A worker reads entries with
  XREADGROUP, holds them in its pending list while they run, renews its lease on them (XCLAIM
  JUSTID resets their idle time) and removes them (XACK + XDEL) once the result is written.
  Entries idle past the lease belong to a dead worker and are claimed by a live one.
- ``P:done:<request id>``: a small marker (worker, deliveries) written with SET NX with the
  result: the first writer wins, so a call run twice (its first worker was presumed dead) still
  yields one result. Only the marker stays (for ``result_ttl_s``); the result itself travels in
  the reply list.
- ``P:reply:<front end id>``: list the first writer pushes results to; the front end pops it.
- ``P:frontend:<front end id>``: liveness key of a front end, refreshed while it runs.
- ``P:workers``: sorted set of worker ids scored by when their lease expires (server clock);
  ``P:worker_info``: hash of what each reported (slots, preloads, isolation).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from rstar2_sandbox.cluster import scripts
from rstar2_sandbox.cluster.messages import Delivery, ResultMessage, TaskMessage, WorkerInfo
from rstar2_sandbox.cluster.settings import ClusterSettings
from rstar2_sandbox.isolation import IsolationReport

logger = logging.getLogger(__name__)

GROUP = "workers"


@dataclass(frozen=True)
class QueueStats:
    """Cluster-wide counts as seen in Redis."""

    queue_depth: int
    """Calls queued but not yet handed to a worker."""
    in_flight: int
    """Calls handed to a worker and not yet done."""
    workers: int
    """Workers whose last heartbeat is younger than their lease."""
    slots: int = 0
    """Calls those workers can run at once."""
    preloaded: tuple[str, ...] = ()
    """Modules every one of them preloads."""
    isolation: IsolationReport | None = None
    """Isolation in force on all of them (None while none is known)."""

    @classmethod
    def of(cls, queue_depth: int, in_flight: int, infos: list[WorkerInfo | None]) -> QueueStats:
        """Counts plus the live workers' reports (None: a worker whose report is unreadable)."""
        known = [info for info in infos if info is not None]
        reports = [info.isolation for info in known if info.isolation is not None]
        preloaded = set.intersection(*(set(i.preloaded) for i in known)) if known else set()
        return cls(
            queue_depth=queue_depth,
            in_flight=in_flight,
            workers=len(infos),
            slots=sum(info.slots for info in known),
            preloaded=tuple(sorted(preloaded)),
            isolation=IsolationReport.merge(reports) if reports else None,
        )


@dataclass(frozen=True)
class Completion:
    """A call's result, ready to be written: which entry it ends and who waits for it."""

    entry_id: str
    reply_to: str
    message: ResultMessage


def connect(url: str, max_connections: int = 64) -> Redis[str]:
    """A client whose concurrent commands share at most ``max_connections`` connections.

    Thousands of concurrent calls would otherwise each open a connection to Redis.
    """
    pool: BlockingConnectionPool[Any] = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, decode_responses=True
    )
    # decode_responses is the pool's; repeated here for the type of the client.
    return Redis(connection_pool=pool, decode_responses=True)


def _worker_info(raw: str) -> WorkerInfo | None:
    try:
        return WorkerInfo.model_validate_json(raw)
    except ValidationError:
        logger.warning("unreadable worker report in Redis: %.200s", raw)
        return None


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class ClusterQueue:
    """Every Redis operation of the cluster; front ends and workers share this one class."""

    def __init__(self, redis: Redis[str], settings: ClusterSettings) -> None:
        self.redis = redis
        self.settings = settings
        prefix = settings.key_prefix
        self.stream = f"{prefix}:tasks"
        self.workers_key = f"{prefix}:workers"
        self.info_key = f"{prefix}:worker_info"
        self._prefix = prefix
        self._enqueue = redis.register_script(scripts.ENQUEUE)
        self._complete = redis.register_script(scripts.COMPLETE)
        self._heartbeat = redis.register_script(scripts.HEARTBEAT)
        self._live_workers = redis.register_script(scripts.LIVE_WORKERS)
        self._prune_consumers = redis.register_script(scripts.PRUNE_CONSUMERS)

    def done_key(self, request_id: str) -> str:
        return f"{self._prefix}:done:{request_id}"

    def reply_key(self, frontend_id: str) -> str:
        return f"{self._prefix}:reply:{frontend_id}"

    def frontend_key(self, frontend_id: str) -> str:
        return f"{self._prefix}:frontend:{frontend_id}"

    async def ensure_group(self) -> None:
        """Create the stream and its consumer group unless they exist (safe to race)."""
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # --- front end side ---------------------------------------------------------------------

    async def enqueue(self, task: TaskMessage) -> bool:
        """Append a call; False when ``max_queue`` calls already wait for a worker."""
        (accepted,) = await self.enqueue_many([task])
        return accepted

    async def enqueue_many(self, tasks: list[TaskMessage]) -> list[bool]:
        """``enqueue`` for many calls in one round trip (each checked against the bound)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task in tasks:
                fields = task.to_fields()
                args = [fields["id"], fields["reply"], fields["request"]]
                await self._enqueue(
                    keys=[self.stream], args=[GROUP, self.settings.max_queue, *args], client=pipe
                )
            entries = await pipe.execute()
        return [entry is not None for entry in entries]

    async def pop_results(
        self, frontend_id: str, count: int, timeout_s: float
    ) -> list[ResultMessage]:
        """Wait up to ``timeout_s`` for results addressed to a front end; pop up to ``count``."""
        # BLMPOP (Redis >= 7) pops a whole batch in one round trip; the stubs lack it.
        reply = await self.redis.execute_command(  # type: ignore[no-untyped-call]  # untyped stub
            "BLMPOP", timeout_s, 1, self.reply_key(frontend_id), "LEFT", "COUNT", count
        )
        if reply is None:
            return []
        _key, items = cast(tuple[str, list[str]], reply)
        results: list[ResultMessage] = []
        for item in items:
            try:
                results.append(ResultMessage.model_validate_json(item))
            except ValidationError as exc:
                # Its caller cannot be known; it gets internal_error at its result timeout.
                logger.error("unreadable result for front end %s: %s", frontend_id, exc)
        return results

    async def touch_frontend(self, frontend_id: str) -> bool:
        """Refresh a front end's liveness key; False when it had lapsed (or never existed)."""
        previous = await self.redis.set(
            self.frontend_key(frontend_id), "1", px=_ms(self.settings.frontend_ttl_s), get=True
        )
        return previous is not None

    async def drop_frontend(self, frontend_id: str) -> None:
        """Mark a front end gone: workers discard its queued calls, its replies are freed."""
        await self.redis.delete(self.frontend_key(frontend_id), self.reply_key(frontend_id))

    async def stats(self) -> QueueStats:
        """Queue depth, calls running, live workers."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(self.stream)
            pipe.xpending(self.stream, GROUP)
            queued, pending = await pipe.execute()
        infos = await self._live_workers(keys=[self.workers_key, self.info_key])
        running = int(pending["pending"])
        return QueueStats.of(
            queue_depth=max(0, int(queued) - running),
            in_flight=running,
            infos=[_worker_info(raw) for raw in infos],
        )

    # --- worker side ------------------------------------------------------------------------

    async def read_new(self, consumer: str, count: int, block_s: float) -> list[Delivery]:
        """Take up to ``count`` calls never delivered before, waiting up to ``block_s``."""
        reply = await self.redis.xreadgroup(
            GROUP, consumer, {self.stream: ">"}, count=count, block=_ms(block_s)
        )
        deliveries: list[Delivery] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                deliveries.append(Delivery.parse(entry_id, fields, deliveries=1))
        return deliveries

    async def claim_stale(self, consumer: str, count: int) -> list[Delivery]:
        """Take up to ``count`` calls whose worker stopped renewing its lease.

        XCLAIM with a minimum idle time is atomic: when two workers race for an entry, the first
        claim resets its idle time and the second gets nothing.
        """
        lease = _ms(self.settings.lease_s)
        stale = await self.redis.xpending_range(
            self.stream, GROUP, min="-", max="+", count=count, idle=lease
        )
        if not stale:
            return []
        counts = {str(item["message_id"]): int(item["times_delivered"]) for item in stale}
        claimed = await self.redis.xclaim(  # type: ignore[no-untyped-call]  # untyped stub
            self.stream, GROUP, consumer, min_idle_time=lease, message_ids=list(counts)
        )
        return [
            Delivery.parse(entry_id, fields or {}, deliveries=counts[entry_id] + 1)
            for entry_id, fields in cast(list[tuple[str, dict[str, str]]], claimed)
        ]

    async def renew(self, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of calls this worker holds, so no one presumes it dead."""
        if entry_ids:
            await self.redis.xclaim(  # type: ignore[no-untyped-call]  # untyped stub
                self.stream, GROUP, consumer, min_idle_time=0, message_ids=entry_ids, justid=True
            )

    async def complete(self, done: Completion) -> bool:
        """Write a call's result (first writer wins) and remove the call from the stream.

        Returns False when another worker had already written a result: this one is discarded.
        """
        (written,) = await self.complete_many([done])
        return written

    async def complete_many(self, completions: list[Completion]) -> list[bool]:
        """``complete`` for many calls in one round trip."""
        ttl = _ms(self.settings.result_ttl_s)
        async with self.redis.pipeline(transaction=False) as pipe:
            for done in completions:
                message = done.message
                await self._complete(
                    keys=[
                        self.done_key(message.request_id),
                        self.reply_key(done.reply_to),
                        self.stream,
                    ],
                    args=[
                        message.model_dump_json(include={"worker", "deliveries"}),
                        message.model_dump_json(),
                        ttl,
                        GROUP,
                        done.entry_id,
                    ],
                    client=pipe,
                )
            written = await pipe.execute()
        return [bool(flag) for flag in written]

    async def discard(self, entry_ids: list[str]) -> None:
        """Remove calls from the stream without a result (their front end is gone)."""
        if entry_ids:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xack(self.stream, GROUP, *entry_ids)
                pipe.xdel(self.stream, *entry_ids)
                await pipe.execute()

    def _append(self, pipe: Pipeline[str], tasks: Iterable[TaskMessage]) -> None:
        for task in tasks:
            pipe.xadd(self.stream, cast(Any, task.to_fields()))

    async def requeue(self, tasks: list[TaskMessage]) -> None:
        """Queue calls again, past the bound: they were admitted once already."""
        if tasks:
            async with self.redis.pipeline(transaction=False) as pipe:
                self._append(pipe, tasks)
                await pipe.execute()

    async def release(self, held: dict[str, TaskMessage]) -> None:
        """Hand calls (by entry id) back to the queue unrun, e.g. on shutdown: queued anew."""
        if held:
            async with self.redis.pipeline(transaction=True) as pipe:
                self._append(pipe, held.values())
                pipe.xack(self.stream, GROUP, *held)
                pipe.xdel(self.stream, *held)
                await pipe.execute()

    async def alive_frontends(self, frontend_ids: set[str]) -> set[str]:
        """Which of these front ends still refresh their liveness key."""
        ordered = sorted(frontend_ids)
        if not ordered:
            return set()
        flags = await self.redis.mget([self.frontend_key(fid) for fid in ordered])
        return {fid for fid, flag in zip(ordered, flags, strict=True) if flag is not None}

    async def heartbeat(self, worker_id: str, info: WorkerInfo) -> None:
        """Record that a worker is alive and what it offers (and forget long-dead ones)."""
        await self._heartbeat(
            keys=[self.workers_key, self.info_key],
            args=[worker_id, _ms(self.settings.lease_s), info.model_dump_json()],
        )

    async def prune_consumers(self, min_idle_s: float) -> int:
        """Forget consumers idle for ``min_idle_s`` that hold no call; how many were removed."""
        pruned = await self._prune_consumers(keys=[self.stream], args=[GROUP, _ms(min_idle_s)])
        return int(pruned)

    async def deregister(self, worker_id: str) -> None:
        """Remove a stopping worker from the count, and its consumer once it holds nothing."""
        await self.redis.zrem(self.workers_key, worker_id)
        await self.redis.hdel(self.info_key, worker_id)
        held = await self.redis.xpending_range(
            self.stream, GROUP, min="-", max="+", count=1, consumername=worker_id
        )
        if held:
            logger.warning("worker %s still holds calls; they will be reclaimed", worker_id)
        else:
            # DELCONSUMER drops the consumer's pending entries, hence only when it holds none.
            await self.redis.xgroup_delconsumer(  # type: ignore[no-untyped-call]  # untyped stub
                self.stream, GROUP, worker_id
            )
