"""A minimal single-threaded event loop (epoll, timers, SIGCHLD) for the fork-server.

The fork-server forks once per run, and a fork costs time in proportion to what the parent maps:
importing asyncio alone makes every fork ~25% slower here. This loop does only what the
fork-server needs, with the standard library's ``selectors``.
"""

from __future__ import annotations

import heapq
import itertools
import os
import selectors
import signal
import time
from collections.abc import Callable

Callback = Callable[[], None]


class Timer:
    """A scheduled callback; ``cancel`` stops it from running."""

    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callback) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this timer."""
        self.cancelled = True


class Loop:
    """Readiness callbacks on file descriptors, timers, and a SIGCHLD callback."""

    def __init__(self, on_sigchld: Callback) -> None:
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = itertools.count()
        self._readers: dict[int, Callback] = {}
        self._writers: dict[int, Callback] = {}
        self.running = True
        # SIGCHLD is turned into a readable byte on a pipe, so it wakes the selector.
        self._wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self._on_sigchld = on_sigchld
        self.add_reader(self._wakeup_r, self._drain_wakeup)

    def _drain_wakeup(self) -> None:
        try:
            while os.read(self._wakeup_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._on_sigchld()

    def _update(self, fd: int) -> None:
        events = (selectors.EVENT_READ if fd in self._readers else 0) | (
            selectors.EVENT_WRITE if fd in self._writers else 0
        )
        registered = fd in self._selector.get_map()
        if events and registered:
            self._selector.modify(fd, events)
        elif events:
            self._selector.register(fd, events)
        elif registered:
            self._selector.unregister(fd)

    def add_reader(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` is readable."""
        self._readers[fd] = callback
        self._update(fd)

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd`` for reading."""
        if self._readers.pop(fd, None) is not None:
            self._update(fd)

    def add_writer(self, fd: int, callback: Callback) -> None:
        """Call ``callback`` whenever ``fd`` is writable."""
        self._writers[fd] = callback
        self._update(fd)

    def remove_writer(self, fd: int) -> None:
        """Stop watching ``fd`` for writing."""
        if self._writers.pop(fd, None) is not None:
            self._update(fd)

    def call_later(self, delay: float, callback: Callback) -> Timer:
        """Run ``callback`` once, ``delay`` seconds from now."""
        timer = Timer(time.monotonic() + delay, callback)
        heapq.heappush(self._timers, (timer.when, next(self._sequence), timer))
        return timer

    def run(self) -> None:
        """Dispatch events until ``running`` is cleared."""
        while self.running:
            timeout: float | None = None
            while self._timers and self._timers[0][2].cancelled:
                heapq.heappop(self._timers)
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            for key, events in self._selector.select(timeout):
                fd = key.fd
                if events & selectors.EVENT_READ and fd in self._readers:
                    self._readers[fd]()
                if events & selectors.EVENT_WRITE and fd in self._writers:
                    self._writers[fd]()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    timer.callback()
