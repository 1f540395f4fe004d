"""An asyncio event loop that runs in virtual time.

When every task is blocked on a timer, the loop's clock jumps straight to the next timer instead
of sleeping. Code written for a real loop (``asyncio.sleep``, ``loop.call_later``,
``asyncio.timeout``) runs unchanged, so the production scheduler runs in simulation as is, and an
hour of simulated rollouts takes as long as the Python work it involves.

Virtual time is meant for pure-asyncio simulations: real I/O (sockets, subprocesses, threads
reporting back through the loop) still works, but the clock does not wait for it while timers
are pending, so its latency counts as zero.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualClock:
    def __init__(self, start: float) -> None:
        self.now = start


class _JumpingSelector(selectors.DefaultSelector):
    """Polls real I/O without blocking; a wait for a timer advances the virtual clock instead."""

    def __init__(self, clock: _VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            # Nothing is scheduled: only real I/O (e.g. another thread) can wake the loop.
            return super().select(None)
        self._clock.now += timeout
        return []


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and jumps to the next timer when idle."""

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_clock = _VirtualClock(start)
        super().__init__(selector=_JumpingSelector(self._virtual_clock))

    def time(self) -> float:
        return self._virtual_clock.now


def run_virtual(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run a coroutine to completion on a fresh ``VirtualTimeEventLoop`` (like ``asyncio.run``)."""
    with asyncio.Runner(debug=debug, loop_factory=VirtualTimeEventLoop) as runner:
        return runner.run(main)
