"""Worker logic against a real Redis: batching, reclaim, retry-once, dedup, orphans, shutdown.

The sandbox here echoes the code (see ``EchoSandbox``); the fault tests run real workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from rstar2_sandbox.cluster import (
    ClusterQueue,
    ClusterSettings,
    Completion,
    ResultMessage,
    TaskMessage,
)
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus

from .helpers import BackgroundWorker, EchoSandbox

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]


def task(n: int | str, reply_to: str = "fe") -> TaskMessage:
    return TaskMessage(request_id=f"r{n}", reply_to=reply_to, request=RunRequest(code=str(n)))


@pytest_asyncio.fixture
async def queue(redis: Redis, settings: ClusterSettings) -> ClusterQueue:
    queue = ClusterQueue(redis, settings)
    await queue.ensure_group()
    await queue.touch_frontend("fe")
    return queue


class Workers:
    """Starts workers on one queue and stops whichever are still running at teardown."""

    def __init__(self, queue: ClusterQueue) -> None:
        self.queue = queue
        self.started: list[BackgroundWorker] = []

    def start(
        self, sandbox: EchoSandbox, *, slots: int, batch_size: int = 64, drain_timeout_s: float = 5
    ) -> BackgroundWorker:
        started = BackgroundWorker(
            self.queue, sandbox, slots=slots, batch_size=batch_size, drain_timeout_s=drain_timeout_s
        )
        self.started.append(started)
        return started


@pytest_asyncio.fixture
async def workers(queue: ClusterQueue) -> AsyncIterator[Workers]:
    pool = Workers(queue)
    yield pool
    for started in pool.started:
        await started.close()


async def collect(queue: ClusterQueue, count: int, reply_to: str = "fe") -> list[ResultMessage]:
    results: list[ResultMessage] = []
    while len(results) < count:
        popped = await queue.pop_results(reply_to, count=count, timeout_s=5)
        assert popped, f"only {len(results)} of {count} results arrived"
        results += popped
    return results


async def test_worker_runs_every_call_once(queue: ClusterQueue, workers: Workers) -> None:
    sandbox = EchoSandbox()
    for n in range(30):
        await queue.enqueue(task(n))
    running = workers.start(sandbox, slots=2, batch_size=3)
    results = await collect(queue, 30)
    await running.close()
    assert sorted(r.request_id for r in results) == sorted(f"r{n}" for n in range(30))
    assert all(r.result.stdout == r.request_id[1:] for r in results)
    assert sorted(sandbox.calls) == sorted(str(n) for n in range(30))
    assert running.worker.counters.completed == 30
    stats = await queue.stats()
    assert (stats.queue_depth, stats.in_flight, stats.workers) == (0, 0, 0)


async def test_worker_holds_at_most_twice_its_slots(queue: ClusterQueue, workers: Workers) -> None:
    sandbox = EchoSandbox()
    sandbox.gate.clear()
    for n in range(10):
        await queue.enqueue(task(n))
    running = workers.start(sandbox, slots=2, batch_size=64)
    await asyncio.sleep(0.5)
    stats = await queue.stats()
    assert (stats.queue_depth, stats.in_flight, stats.workers) == (6, 4, 1)
    sandbox.gate.set()
    await collect(queue, 10)
    await running.close()


async def test_call_of_a_dead_worker_is_retried_once(
    queue: ClusterQueue, settings: ClusterSettings, workers: Workers
) -> None:
    await queue.enqueue(task(1))
    await queue.read_new("died", count=1, block_s=0.1)
    sandbox = EchoSandbox()
    running = workers.start(sandbox, slots=1)
    (result,) = await collect(queue, 1)
    assert result.result.status is RunStatus.SUCCESS
    assert result.deliveries == 2
    assert sandbox.calls == ["1"]
    await running.close()


async def test_call_whose_workers_died_twice_fails_with_internal_error(
    queue: ClusterQueue, settings: ClusterSettings, workers: Workers
) -> None:
    await queue.enqueue(task(1))
    await queue.read_new("died", count=1, block_s=0.1)
    await asyncio.sleep(settings.lease_s + 0.1)
    assert len(await queue.claim_stale("died-too", count=1)) == 1
    await asyncio.sleep(settings.lease_s + 0.1)
    sandbox = EchoSandbox()
    running = workers.start(sandbox, slots=1)
    (result,) = await collect(queue, 1)
    assert result.result.status is RunStatus.INTERNAL_ERROR
    assert "3 times (at most 2)" in result.result.stderr
    assert sandbox.calls == []  # not run a third time
    await running.close()
    assert running.worker.counters.gave_up == 1
    assert await queue.redis.xlen(queue.stream) == 0


async def test_late_result_of_a_presumed_dead_worker_is_discarded(
    queue: ClusterQueue, settings: ClusterSettings, workers: Workers
) -> None:
    await queue.enqueue(task(1))
    (slow,) = await queue.read_new("slow", count=1, block_s=0.1)
    running = workers.start(EchoSandbox(), slots=1)
    (first,) = await collect(queue, 1)
    assert first.worker == running.worker.worker_id
    late = ResultMessage(
        request_id="r1",
        result=RunResult(status=RunStatus.SUCCESS, stdout="late"),
        worker="slow",
        deliveries=1,
    )
    assert not await queue.complete(Completion(slow.entry_id, "fe", late))
    assert await queue.pop_results("fe", count=10, timeout_s=0.2) == []
    await running.close()


async def test_bad_entries_and_crashes_answer_internal_error(
    queue: ClusterQueue, workers: Workers
) -> None:
    await queue.redis.xadd(queue.stream, {"id": "bad", "reply": "fe", "request": "{}"})
    await queue.redis.xadd(queue.stream, {"request": "{}"})  # no ids: nobody to answer
    await queue.enqueue(task("explode"))
    running = workers.start(EchoSandbox(), slots=1)
    results = {r.request_id: r.result for r in await collect(queue, 2)}
    assert results["bad"].status is RunStatus.INTERNAL_ERROR
    assert "'request'" in results["bad"].stderr
    assert results["rexplode"].status is RunStatus.INTERNAL_ERROR
    assert "executor crashed" in results["rexplode"].stderr
    await running.close()
    assert await queue.redis.xlen(queue.stream) == 0


async def test_calls_of_a_vanished_front_end_are_dropped_unrun(
    queue: ClusterQueue, workers: Workers
) -> None:
    for n in range(3):
        await queue.enqueue(task(n, reply_to="gone"))
    await queue.enqueue(task(9))
    sandbox = EchoSandbox()
    running = workers.start(sandbox, slots=1)
    (result,) = await collect(queue, 1)
    assert result.request_id == "r9"
    await running.close()
    assert sandbox.calls == ["9"]
    assert running.worker.counters.orphaned == 3
    assert await queue.redis.xlen(queue.stream) == 0


async def test_shutdown_finishes_running_calls(queue: ClusterQueue, workers: Workers) -> None:
    sandbox = EchoSandbox()
    sandbox.gate.clear()
    for n in range(2):
        await queue.enqueue(task(n))
    running = workers.start(sandbox, slots=1)
    await sandbox.wait_running(2)
    running.stop.set()
    await asyncio.sleep(0.2)
    assert not running.task.done()  # waits for its calls
    sandbox.gate.set()
    await asyncio.wait_for(running.task, 5)
    assert len(await collect(queue, 2)) == 2
    assert running.worker.counters.released == 0


async def test_shutdown_hands_back_calls_it_cannot_finish(
    queue: ClusterQueue, workers: Workers
) -> None:
    stuck = EchoSandbox()
    stuck.gate.clear()
    for n in range(5):
        await queue.enqueue(task(n))
    first = workers.start(stuck, slots=1, drain_timeout_s=0.2)
    await stuck.wait_running(2)
    await first.close()
    assert first.worker.counters.released == 2
    stats = await queue.stats()
    assert (stats.queue_depth, stats.in_flight, stats.workers) == (5, 0, 0)
    consumers = await queue.redis.xinfo_consumers(queue.stream, "workers")
    assert first.worker.worker_id not in {c["name"] for c in consumers}
    second = workers.start(EchoSandbox(), slots=2)
    results = await collect(queue, 5)
    assert sorted(r.request_id for r in results) == [f"r{n}" for n in range(5)]
    assert all(r.deliveries == 1 for r in results)  # handing back is not a failed delivery
    await second.close()
