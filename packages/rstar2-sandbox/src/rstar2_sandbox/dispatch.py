"""The front end's queue interface (``Dispatcher``) and its in-process implementation.

The HTTP app hands every call to a ``Dispatcher``. ``LocalDispatcher`` keeps a bounded in-process
queue feeding this machine's ``ExecutorPool``; the cluster's Redis dispatcher implements the same
protocol, so ``create_app`` serves either.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.executor.pool import ExecutorPool
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.isolation import IsolationReport
from rstar2_sandbox.models import RunRequest, RunResult

DEFAULT_MAX_QUEUE = 16384


class QueueFullError(Exception):
    """The dispatcher's queue is at its bound; the caller should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: float, message: str = "the execution queue is full") -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DispatcherStats(BaseModel):
    """A snapshot of a dispatcher, for /healthz, /v1/info and /metrics."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="Which dispatcher: 'local' or 'redis'.")
    queue_depth: int = Field(ge=0, description="Calls accepted and waiting for a slot.")
    queue_limit: int = Field(ge=0, description="Waiting calls allowed before 503.")
    in_flight: int = Field(ge=0, description="Calls running now.")
    workers: int = Field(ge=0, description="Execution processes (fork-servers or workers) up.")
    slots: int = Field(ge=0, description="Calls that can run at once.")
    restarts: int = Field(default=0, ge=0, description="Executors restarted after dying.")
    preloaded: list[str] = Field(default_factory=list, description="Modules preloaded.")
    isolation: IsolationReport | None = Field(
        default=None, description="Isolation features of the executors, where known."
    )


@runtime_checkable
class Dispatcher(Protocol):
    """Accepts calls from the HTTP front end and returns their results."""

    async def start(self) -> None:
        """Connect or start executors; called once before serving."""
        ...

    async def close(self) -> None:
        """Release everything; calls in flight end."""
        ...

    async def submit(self, request: RunRequest) -> RunResult:
        """Run one call; raises ``QueueFullError`` when the queue is at its bound."""
        ...

    def stats(self) -> DispatcherStats:
        """A snapshot of queue and executors."""
        ...


class LocalDispatcher:
    """A bounded in-process queue in front of this machine's fork-servers."""

    def __init__(
        self,
        settings: ExecutorSettings | None = None,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.pool = ExecutorPool(settings)
        self.max_queue = max_queue
        self._accepted = 0  # calls between submit and result
        self._mean_wall_s = 0.01

    async def start(self) -> None:
        """Start the fork-servers."""
        await self.pool.start()

    async def close(self) -> None:
        """Stop the fork-servers."""
        await self.pool.close()

    @property
    def queue_depth(self) -> int:
        """Accepted calls still waiting for a slot."""
        return max(0, self._accepted - self.pool.busy)

    def retry_after_s(self) -> float:
        """How long until the queue has drained enough to take more, roughly."""
        drain = self.queue_depth * self._mean_wall_s / max(1, self.pool.slots)
        return min(30.0, max(0.1, drain))

    async def submit(self, request: RunRequest) -> RunResult:
        """Queue one call and wait for its result."""
        # Accepted calls beyond the slots are the ones waiting: at most ``max_queue`` of them.
        if self._accepted - self.pool.slots >= self.max_queue:
            raise QueueFullError(self.retry_after_s())
        self._accepted += 1
        started = time.monotonic()
        try:
            result = await self.pool.run(request)
        finally:
            self._accepted -= 1
        # A slow moving average of call duration, for Retry-After estimates.
        self._mean_wall_s += 0.01 * ((time.monotonic() - started) - self._mean_wall_s)
        return result

    def stats(self) -> DispatcherStats:
        """Queue, slots and isolation of the local pool."""
        return DispatcherStats(
            kind="local",
            queue_depth=self.queue_depth,
            queue_limit=self.max_queue,
            in_flight=self.pool.busy,
            workers=self.pool.live_servers,
            slots=self.pool.slots,
            restarts=self.pool.restarts,
            preloaded=self.pool.preloaded,
            isolation=self.pool.isolation,
        )
