"""The virtual-time event loop: timers fire in order at exact virtual times, without waiting."""

from __future__ import annotations

import asyncio
import time

import pytest

from rstar2_scheduler.sim import VirtualTimeEventLoop, run_virtual


def test_sleeps_wake_in_order_at_their_virtual_deadline() -> None:
    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        woke: list[tuple[float, float]] = []

        async def nap(seconds: float) -> None:
            await asyncio.sleep(seconds)
            woke.append((seconds, loop.time()))

        await asyncio.gather(*(nap(s) for s in (3600.0, 2.5, 0.125, 900.0)))
        return woke

    began = time.perf_counter()
    woke = run_virtual(main())
    assert [s for s, _ in woke] == [0.125, 2.5, 900.0, 3600.0]
    assert all(at == pytest.approx(s, abs=1e-9) for s, at in woke)
    # An hour of virtual sleeping costs no real waiting.
    assert time.perf_counter() - began < 1.0


def test_timeouts_and_call_at_use_the_virtual_clock() -> None:
    async def main() -> tuple[float, float, list[float]]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        loop.call_at(50.0, lambda: fired.append(loop.time()))
        loop.call_later(10.0, lambda: fired.append(loop.time()))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.sleep(1e6)
        timed_out_at = loop.time()
        await asyncio.sleep(40.0)
        return timed_out_at, loop.time(), fired

    timed_out_at, end, fired = run_virtual(main())
    assert timed_out_at == pytest.approx(30.0)
    assert end == pytest.approx(70.0)
    assert fired == pytest.approx([10.0, 50.0])


def test_clock_does_not_move_while_tasks_are_ready() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        for _ in range(1000):
            await asyncio.sleep(0)
        return loop.time()

    assert run_virtual(main()) == 0.0


def test_real_io_from_a_thread_still_completes() -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        value = await loop.run_in_executor(None, lambda: 6 * 7)
        return value, loop.time()

    assert run_virtual(main()) == (42, 0.0)


def test_loop_starts_at_the_given_time() -> None:
    loop = VirtualTimeEventLoop(start=100.0)
    try:
        assert loop.time() == 100.0
        loop.run_until_complete(asyncio.sleep(5.0))
        assert loop.time() == pytest.approx(105.0)
    finally:
        loop.close()
