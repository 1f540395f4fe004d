"""Group commit: operations issued in the same event-loop turn share one Redis round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


class Coalescer(Generic[Item, Outcome]):
    """Runs ``flush`` on every item submitted while the previous flush was in progress.

    Under load, hundreds of calls are enqueued (or completed) at once; sending them as one
    pipeline instead of one command each cuts the client's per-command overhead several times.
    A lone item is flushed right away, so nothing waits for company.
    """

    def __init__(self, flush: Callable[[list[Item]], Awaitable[list[Outcome]]]) -> None:
        self._flush = flush
        self._pending: list[tuple[Item, asyncio.Future[Outcome]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Outcome:
        """The outcome of ``item``, flushed together with whatever else is waiting."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    outcomes = await self._flush([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:
                    # Cancelled (shutdown): its submitters must not wait forever.
                    for _, future in [*batch, *self._pending]:
                        future.cancel()
                    raise
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if not future.done():
                        future.set_result(outcome)
        finally:
            self._flushing = None
