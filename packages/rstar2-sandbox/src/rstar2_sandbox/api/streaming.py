"""Batch responses streamed in request order, within a fixed window of bytes.

A batch's results are written to the client as soon as every earlier one has been: item ``i``
goes out when it and items ``0..i-1`` are done. Results that finish before their turn wait in a
``ResultSpool``: serialised, in memory while all streamed responses together hold less than the
``ResponseBudget``, in an unlinked temporary file beyond it. Calls are admitted in order, a
bounded number ahead of the one being written (``ahead``), and only while the batch's window
(``window_bytes``) has room for the results waiting or being written plus, for each running call,
the largest result it can produce (``result_bytes``: both of its output caps): a client that does
not read stops its batch from running further, and a batch whose calls may print a lot runs fewer
of them at once. So what a batch's results take in the front end, waiting or arriving, stays
within its window (JSON escaping of control characters aside); over all batches the budget bounds
the memory of waiting results, and a batch's temporary file holds at most its window.

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

# A result's fields besides its two output streams, and the sandbox's notes on its limits.
RESULT_OVERHEAD_BYTES = 4096
# Results ready one after another are written together up to this many bytes; a larger one is
# written in slices of this size.
WRITE_BYTES = 1 << 16


def result_bytes(output_limit_bytes: int) -> int:
    """The largest result of a call with this cap on each output stream, serialised."""
    return 2 * output_limit_bytes + RESULT_OVERHEAD_BYTES


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
        self.held_bytes = 0
        """Bytes of results put and not yet taken, in memory or on disk."""

    def put(self, index: int, data: bytes) -> None:
        """Keep item ``index``'s result until it is taken (dropped once the spool is closed)."""
        if self.closed:
            return
        self.held_bytes += len(data)
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
        else:
            offset, length = self._spilled.pop(index)
            assert self._file is not None
            data = _read_at(self._file.fileno(), offset, length)
        self.held_bytes -= len(data)
        return data

    def close(self) -> None:
        """Release memory and the spill file; later results are dropped."""
        self.closed = True
        for data in self._memory.values():
            self.budget.give(len(data))
        self._memory.clear()
        self._spilled.clear()
        self.held_bytes = 0
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
    window_bytes: int,
    ahead: int,
    reserve: Callable[[int], int],
    spool_dir: str | None = None,
) -> web.StreamResponse:
    """Run ``produce(i)`` for every item; stream ``head``, the items joined by commas in order,
    then ``tail``.

    Items start in order, at most ``ahead`` of them running at once, each only while this
    batch's results not yet written (waiting, or taken and being written) and the ``reserve(i)``
    bytes of every running item (the largest result it can produce) fit in ``window_bytes``; one
    item always may run.
    ``produce`` returns item ``i`` serialised as JSON. An exception from one (e.g. the queue
    refused the call) before anything was sent is raised here, after the other items are
    cancelled; after that, the connection is cut instead.
    """
    spool = ResultSpool(budget, spool_dir)
    tasks: dict[int, asyncio.Task[None]] = {}
    reserved: dict[int, int] = {}
    admitted = 0
    # Items ready one after another go out in one write (one chunk, one system call); until
    # written, the results among them still take room in the window.
    pending = [head]
    pending_bytes = len(head)
    unsent = 0

    def admit() -> None:
        nonlocal admitted
        while admitted < count and len(tasks) < ahead and not spool.closed:
            need = reserve(admitted)
            in_use = spool.held_bytes + unsent + sum(reserved.values())
            if in_use and in_use + need > window_bytes:
                return
            reserved[admitted] = need
            tasks[admitted] = asyncio.ensure_future(run(admitted))
            admitted += 1

    async def run(index: int) -> None:
        try:
            data = await produce(index)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            spool.fail(index, exc)
        else:
            spool.put(index, data)
        del tasks[index], reserved[index]
        admit()

    admit()
    response: web.StreamResponse | None = None
    try:
        for index in range(count):
            if response is not None and not spool.ready(index):
                await _send(response, pending)
                pending, pending_bytes, unsent = [], 0, 0
                admit()
            data = await spool.take(index)
            unsent += len(data)
            if response is None:
                failure = spool.first_failure()
                if failure is not None:
                    raise failure
                response = await _start(request)
            if index:
                pending.append(b",")
            pending.append(data)
            pending_bytes += len(data)
            del data  # written below: not kept while waiting for the next item
            if pending_bytes >= WRITE_BYTES:
                await _send(response, pending)
                pending, pending_bytes, unsent = [], 0, 0
            admit()
        if response is None:
            response = await _start(request)
        pending.append(tail)
        await _send(response, pending)
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
        running = list(tasks.values())
        for task in running:
            task.cancel()
        # Calls still running finish in their slots; their results are dropped.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running, return_exceptions=True)


async def _send(response: web.StreamResponse, parts: list[bytes]) -> None:
    """Write ``parts`` in order: small ones joined into one write, a large one in slices of
    ``WRITE_BYTES`` (each write is copied once more on its way out; slices keep that copy small
    and let the client's pace, not the result's size, set what waits in the socket's buffer)."""
    small: list[bytes] = []
    for part in parts:
        if len(part) <= WRITE_BYTES:
            small.append(part)
            continue
        if small:
            await response.write(b"".join(small))
            small = []
        view = memoryview(part)
        for offset in range(0, len(part), WRITE_BYTES):
            await response.write(view[offset : offset + WRITE_BYTES])
    if small:
        await response.write(b"".join(small))


async def _start(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    return response
