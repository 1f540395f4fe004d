"""Group commit: concurrent submissions share flushes; outcomes and errors reach each caller."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_sandbox.cluster.coalesce import Coalescer

pytestmark = pytest.mark.asyncio


class Recorder:
    """A flush that doubles its items, records each batch and can be made to fail or wait."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.fail = False
        self.release = asyncio.Event()
        self.release.set()

    async def flush(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await self.release.wait()
        if self.fail:
            raise ConnectionError("redis went away")
        return [2 * item for item in items]


async def test_a_lone_item_is_flushed_at_once() -> None:
    recorder = Recorder()
    assert await asyncio.wait_for(Coalescer(recorder.flush).submit(21), 1) == 42
    assert recorder.batches == [[21]]


async def test_items_arriving_during_a_flush_share_the_next_one() -> None:
    recorder = Recorder()
    recorder.release.clear()
    coalescer = Coalescer(recorder.flush)
    first = asyncio.create_task(coalescer.submit(0))
    await asyncio.sleep(0.01)  # the first flush is in progress, holding item 0
    rest = [asyncio.create_task(coalescer.submit(n)) for n in range(1, 50)]
    await asyncio.sleep(0.01)
    recorder.release.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [2 * n for n in range(1, 50)]
    assert recorder.batches == [[0], list(range(1, 50))]


async def test_a_failed_flush_fails_its_items_only() -> None:
    recorder = Recorder()
    recorder.fail = True
    coalescer = Coalescer(recorder.flush)
    outcomes = await asyncio.gather(
        *(coalescer.submit(n) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    recorder.fail = False
    assert await coalescer.submit(5) == 10  # the coalescer keeps working
