"""A stateless front end's side of the cluster: enqueue calls in Redis, await their results."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from rstar2_sandbox.cluster.coalesce import Coalescer
from rstar2_sandbox.cluster.messages import TaskMessage, internal_error
from rstar2_sandbox.cluster.queue import ClusterQueue, QueueStats, connect
from rstar2_sandbox.cluster.settings import ClusterSettings
from rstar2_sandbox.dispatch import DispatcherStats, QueueFullError
from rstar2_sandbox.models import RunRequest, RunResult

logger = logging.getLogger(__name__)

REPLY_BATCH = 1024


@dataclass
class _Waiter:
    task: TaskMessage
    future: asyncio.Future[RunResult]


class RedisDispatcher:
    """``Dispatcher`` whose queue is Redis: any number of these can serve one cluster.

    Each front end has an id; workers push results to its reply list and drop its queued calls
    once its liveness key lapses, so a restarted front end leaves no work running for nobody.
    Its clients resubmit (``SandboxClient`` retries on connection errors): a resubmitted call is
    a new call. Should its own liveness key ever lapse (a stalled loop, a restarted Redis), it
    queues its outstanding calls again; results are first-writer-wins per call, so none doubles.
    """

    def __init__(
        self,
        url: str,
        settings: ClusterSettings | None = None,
        *,
        refresh_s: float = 1.0,
    ) -> None:
        self.url = url
        self.settings = settings or ClusterSettings()
        self.frontend_id = f"frontend-{uuid.uuid4().hex[:12]}"
        self.refresh_s = refresh_s
        self._redis: Redis[str] | None = None
        self._queue: ClusterQueue | None = None
        self._waiters: dict[str, _Waiter] = {}
        # Calls submitted together are queued in one round trip.
        self._enqueuer: Coalescer[TaskMessage, bool] = Coalescer(
            lambda tasks: self.queue.enqueue_many(tasks)
        )
        self._loops: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()
        self._cluster = QueueStats(queue_depth=0, in_flight=0, workers=0)
        self.unclaimed_results = 0
        """Results that arrived for no waiter (it timed out or its client went away)."""

    @property
    def queue(self) -> ClusterQueue:
        """The Redis queue (once started)."""
        if self._queue is None:
            raise RuntimeError("RedisDispatcher is not started; call start() first")
        return self._queue

    async def start(self) -> None:
        """Connect, create the queue if needed and start receiving results."""
        self._redis = connect(self.url)
        self._queue = ClusterQueue(self._redis, self.settings)
        await self._queue.ensure_group()
        await self._queue.touch_frontend(self.frontend_id)
        self._cluster = await self._queue.stats()
        self._closing.clear()
        self._loops = [
            asyncio.create_task(self._receive_results()),
            asyncio.create_task(self._refresh()),
        ]
        logger.info("front end %s queues calls in %s", self.frontend_id, self.url)

    async def close(self) -> None:
        """Stop; calls still waiting get ``QueueFullError`` (retryable) and workers drop them."""
        # The loops stop between Redis commands (cancelling one midway costs a reconnection);
        # only a Redis that stopped answering makes them be cancelled.
        self._closing.set()
        if self._loops:
            _, stuck = await asyncio.wait(self._loops, timeout=self.refresh_s + 5)
            for loop in stuck:
                loop.cancel()
            await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        # Calls still waiting are refused as retryable (503 over HTTP), not failed: their
        # clients resubmit them to another front end instead of taking a bogus internal_error.
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(
                    QueueFullError(self.settings.retry_after_s, "the front end is shutting down")
                )
        if self._queue is not None:
            with contextlib.suppress(RedisError):
                await self._queue.drop_frontend(self.frontend_id)
        if self._redis is not None:
            await self._redis.aclose()  # type: ignore[attr-defined]  # stubs predate aclose
        self._redis = self._queue = None

    async def submit(self, request: RunRequest) -> RunResult:
        """Queue one call and wait for its result; ``QueueFullError`` when it cannot be queued."""
        request_id = uuid.uuid4().hex
        task = TaskMessage(request_id=request_id, reply_to=self.frontend_id, request=request)
        waiter = _Waiter(task, asyncio.get_running_loop().create_future())
        self._waiters[request_id] = waiter
        try:
            retry_after_s = self.settings.retry_after_s
            try:
                accepted = await self._enqueuer.submit(task)
            except RedisError as exc:
                # Retryable like a full queue: the call was not accepted.
                logger.error("could not queue call %s: %s", request_id, exc)
                raise QueueFullError(
                    retry_after_s, f"the cluster queue is unreachable: {exc}"
                ) from exc
            if not accepted:
                raise QueueFullError(retry_after_s)
            timeout = self.settings.result_timeout_s
            try:
                return await asyncio.wait_for(waiter.future, timeout)
            except TimeoutError:
                logger.error("no result for call %s within %.0f s", request_id, timeout)
                return internal_error(f"no result from the cluster within {timeout:g} s")
        finally:
            del self._waiters[request_id]

    def stats(self) -> DispatcherStats:
        """Cluster-wide counts, refreshed from Redis every ``refresh_s``."""
        return DispatcherStats(
            kind="redis",
            queue_depth=self._cluster.queue_depth,
            queue_limit=self.settings.max_queue,
            in_flight=self._cluster.in_flight,
            workers=self._cluster.workers,
            slots=self._cluster.slots,
            preloaded=list(self._cluster.preloaded),
            isolation=self._cluster.isolation,
        )

    async def _pause(self) -> None:
        """Wait ``refresh_s``, or less when closing."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), self.refresh_s)

    async def _receive_results(self) -> None:
        while not self._closing.is_set():
            try:
                results = await self.queue.pop_results(
                    self.frontend_id, REPLY_BATCH, timeout_s=self.refresh_s
                )
            except RedisError:
                logger.exception("could not read results from Redis; retrying")
                await self._pause()
                continue
            for message in results:
                waiter = self._waiters.get(message.request_id)
                if waiter is None or waiter.future.done():
                    self.unclaimed_results += 1
                else:
                    waiter.future.set_result(message.result)

    async def _refresh(self) -> None:
        """Keep the liveness key fresh and the cluster counts current."""
        while not self._closing.is_set():
            await self._pause()
            try:
                if not await self.queue.touch_frontend(self.frontend_id):
                    await self._recover()
                self._cluster = await self.queue.stats()
            except RedisError:
                logger.exception("could not refresh front end %s in Redis", self.frontend_id)

    async def _recover(self) -> None:
        outstanding = [w.task for w in self._waiters.values() if not w.future.done()]
        logger.warning(
            "front end %s was presumed gone by the cluster; queueing its %d call(s) again",
            self.frontend_id,
            len(outstanding),
        )
        await self.queue.ensure_group()
        await self.queue.requeue(outstanding)
