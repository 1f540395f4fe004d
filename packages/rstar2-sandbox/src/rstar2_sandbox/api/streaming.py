"""Batch responses streamed in request order, holding a bounded amount of memory.

A batch's results are written to the client as soon as every earlier one has been: item ``i``
goes out when it and items ``0..i-1`` are done. Results that finish before their turn wait in a
``ResultSpool``: serialised, in memory while all streamed responses together hold less than the
``ResponseBudget``, in an unlinked temporary file beyond it. So the front end's memory does not
grow with the batch size: besides the request itself it holds the budget, the results of the
calls running right now, and one write buffer per response.

Nothing is sent until the first result is ready, so a batch the queue refuses at once still gets
a plain 503. A failure after the response has started (say the queue refused a later item) cannot
change the status any more: the connection is then cut, which clients see as a broken response
and retry (``SandboxClient`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from typing import IO

from aiohttp import web

log = logging.getLogger(__name__)

# Results ready one after another are written together up to this many bytes.
WRITE_BYTES = 1 << 16


class ResponseBudget:
    """Bytes of finished, not yet sent results that all responses together keep in memory."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes if they fit."""
        if self.used_bytes + size > self.limit_bytes:
            return False
        self.used_bytes += size
        return True

    def give(self, size: int) -> None:
        """Return bytes reserved with ``take``."""
        self.used_bytes -= size


class ResultSpool:
    """The serialised results of one batch that are ready before their turn to be sent."""

    def __init__(self, budget: ResponseBudget, directory: str | None = None) -> None:
        self.budget = budget
        self.directory = directory
        self._memory: dict[int, bytes] = {}
        self._spilled: dict[int, tuple[int, int]] = {}  # index -> (offset, length) in the file
        self._failures: dict[int, BaseException] = {}
        self._file: IO[bytes] | None = None
        self._file_end = 0
        self._wanted: tuple[int, asyncio.Future[None]] | None = None
        self.closed = False
        self.spilled_bytes = 0

    def put(self, index: int, data: bytes) -> None:
        """Keep item ``index``'s result until it is taken (dropped once the spool is closed)."""
        if self.closed:
            return
        if self.budget.take(len(data)):
            self._memory[index] = data
        else:
            # Blocking, but a write of this size into the page cache is far shorter than a call.
            if self._file is None:
                # Unlinked from the start (it never outlives the process); close() closes it.
                self._file = tempfile.TemporaryFile(  # noqa: SIM115
                    dir=self.directory, prefix="rstar2-batch-"
                )
            os.pwrite(self._file.fileno(), data, self._file_end)
            self._spilled[index] = (self._file_end, len(data))
            self._file_end += len(data)
            self.spilled_bytes += len(data)
        self._wake(index)

    def fail(self, index: int, error: BaseException) -> None:
        """Item ``index`` produced no result: taking it raises ``error``."""
        if not self.closed:
            self._failures[index] = error
            self._wake(index)

    def first_failure(self) -> BaseException | None:
        """An error of any item so far (the earliest by index), if one failed."""
        return self._failures[min(self._failures)] if self._failures else None

    async def take(self, index: int) -> bytes:
        """Item ``index``'s result, once it is ready; it leaves the spool."""
        if not self.ready(index):
            future = asyncio.get_running_loop().create_future()
            self._wanted = (index, future)
            try:
                await future
            finally:
                self._wanted = None
        if index in self._failures:
            raise self._failures.pop(index)
        if index in self._memory:
            data = self._memory.pop(index)
            self.budget.give(len(data))
            return data
        offset, length = self._spilled.pop(index)
        assert self._file is not None
        return _read_at(self._file.fileno(), offset, length)

    def close(self) -> None:
        """Release memory and the spill file; later results are dropped."""
        self.closed = True
        for data in self._memory.values():
            self.budget.give(len(data))
        self._memory.clear()
        self._spilled.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def ready(self, index: int) -> bool:
        """Whether taking item ``index`` would not wait."""
        return index in self._memory or index in self._spilled or index in self._failures

    def _wake(self, index: int) -> None:
        if self._wanted is not None and self._wanted[0] == index:
            future = self._wanted[1]
            if not future.done():
                future.set_result(None)


def _read_at(fd: int, offset: int, length: int) -> bytes:
    chunks = []
    while length:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise OSError(f"spill file ended {length} bytes early")
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


async def stream_batch(
    request: web.Request,
    *,
    count: int,
    produce: Callable[[int], Awaitable[bytes]],
    head: bytes,
    tail: bytes,
    budget: ResponseBudget,
    spool_dir: str | None = None,
) -> web.StreamResponse:
    """Run ``produce(i)`` for every item at once; stream ``head``, the items joined by commas
    in order, then ``tail``.

    ``produce`` returns item ``i`` serialised as JSON. An exception from one (e.g. the queue
    refused the call) before anything was sent is raised here, after the other items are
    cancelled; after that, the connection is cut instead.
    """
    spool = ResultSpool(budget, spool_dir)

    async def run(index: int) -> None:
        try:
            data = await produce(index)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            spool.fail(index, exc)
        else:
            spool.put(index, data)

    tasks = [asyncio.ensure_future(run(index)) for index in range(count)]
    response: web.StreamResponse | None = None
    # Items ready one after another go out in one write (one chunk, one system call).
    pending = [head]
    pending_bytes = len(head)
    try:
        for index in range(count):
            if response is not None and not spool.ready(index):
                await response.write(b"".join(pending))
                pending, pending_bytes = [], 0
            data = await spool.take(index)
            if response is None:
                failure = spool.first_failure()
                if failure is not None:
                    raise failure
                response = await _start(request)
            if index:
                pending.append(b",")
            pending.append(data)
            pending_bytes += len(data)
            if pending_bytes >= WRITE_BYTES:
                await response.write(b"".join(pending))
                pending, pending_bytes = [], 0
        if response is None:
            response = await _start(request)
        pending.append(tail)
        await response.write(b"".join(pending))
        await response.write_eof()
        return response
    except Exception as exc:
        if response is None:
            raise
        # The status line is gone: cut the connection so the client sees a broken response.
        if not isinstance(exc, ConnectionError):
            log.error("batch response broken off after it started: %s", exc)
        if request.transport is not None:
            request.transport.abort()
        return response
    finally:
        spool.close()
        for task in tasks:
            task.cancel()
        # Calls still running finish in their slots; their results are dropped.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _start(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    return response
