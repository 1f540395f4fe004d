"""The front end's Redis dispatcher with in-process workers: results, bound, stats, recovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2_sandbox.cluster import ClusterQueue, ClusterSettings, ClusterWorker, RedisDispatcher
from rstar2_sandbox.cluster.queue import connect
from rstar2_sandbox.dispatch import Dispatcher, QueueFullError
from rstar2_sandbox.models import RunRequest, RunStatus

from .conftest import redis_server
from .test_worker import EchoSandbox

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]


@pytest_asyncio.fixture
async def dispatcher(redis_url: str, settings: ClusterSettings) -> AsyncIterator[RedisDispatcher]:
    front = RedisDispatcher(redis_url, settings, refresh_s=0.1)
    await front.start()
    yield front
    await front.close()


class Node:
    """One worker with its own Redis connection, serving in the background."""

    def __init__(
        self, redis_url: str, settings: ClusterSettings, sandbox: EchoSandbox, slots: int = 2
    ) -> None:
        self.queue = ClusterQueue(connect(redis_url), settings)
        self.worker = ClusterWorker(
            self.queue, sandbox, slots=slots, poll_s=0.05, drain_timeout_s=0.2
        )
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.worker.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        await self.queue.redis.aclose()


@pytest_asyncio.fixture
async def node(redis_url: str, settings: ClusterSettings) -> AsyncIterator[Node]:
    started = Node(redis_url, settings, EchoSandbox())
    yield started
    await started.close()


async def wait_for_stats(dispatcher: RedisDispatcher, **expected: int) -> None:
    """Stats refresh from Redis periodically: poll until they show ``expected``."""
    for _ in range(100):
        if {key: getattr(dispatcher.stats(), key) for key in expected} == expected:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"stats never reached {expected}: {dispatcher.stats()}")


async def test_is_a_dispatcher(dispatcher: RedisDispatcher) -> None:
    assert isinstance(dispatcher, Dispatcher)
    assert dispatcher.stats().kind == "redis"


async def test_submitted_calls_come_back_to_their_callers(
    dispatcher: RedisDispatcher, node: Node
) -> None:
    codes = [f"print({n})" for n in range(40)]
    results = await asyncio.gather(*(dispatcher.submit(RunRequest(code=c)) for c in codes))
    assert [r.stdout for r in results] == codes
    assert dispatcher.unclaimed_results == 0


async def test_stats_show_workers_slots_and_queue(
    dispatcher: RedisDispatcher, redis_url: str, settings: ClusterSettings
) -> None:
    await wait_for_stats(dispatcher, workers=0, slots=0, queue_depth=0)
    sandbox = EchoSandbox()
    sandbox.gate.clear()
    first = Node(redis_url, settings, sandbox)
    second = Node(redis_url, settings, sandbox)
    calls = [asyncio.create_task(dispatcher.submit(RunRequest(code="1"))) for _ in range(10)]
    # Two workers of 2 slots hold 4 calls each; 2 wait.
    await wait_for_stats(dispatcher, workers=2, slots=4, in_flight=8, queue_depth=2)
    assert dispatcher.stats().queue_limit == settings.max_queue
    sandbox.gate.set()
    await asyncio.gather(*calls)
    await second.close()
    await wait_for_stats(dispatcher, workers=1, slots=2, in_flight=0, queue_depth=0)
    await first.close()


async def test_full_queue_raises_with_retry_after(
    redis_url: str, settings: ClusterSettings
) -> None:
    front = RedisDispatcher(redis_url, settings.model_copy(update={"max_queue": 5}))
    await front.start()
    waiting = [asyncio.create_task(front.submit(RunRequest(code="1"))) for _ in range(5)]
    await asyncio.sleep(0.2)
    with pytest.raises(QueueFullError) as refused:
        await front.submit(RunRequest(code="1"))
    assert refused.value.retry_after_s == settings.retry_after_s
    await front.close()
    # Closing refuses the calls still waiting as retryable instead of leaving them hanging.
    for outcome in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(outcome, QueueFullError)
        assert "shutting down" in str(outcome)


async def test_unreachable_redis_refuses_calls_as_retryable(
    tmp_path: Path, settings: ClusterSettings
) -> None:
    with redis_server(tmp_path) as (url, proc):
        front = RedisDispatcher(url, settings)
        await front.start()
        proc.kill()
        proc.wait()
        with pytest.raises(QueueFullError, match="unreachable"):
            await front.submit(RunRequest(code="1"))
        await front.close()


async def test_no_result_in_time_answers_internal_error(
    redis_url: str, settings: ClusterSettings
) -> None:
    front = RedisDispatcher(redis_url, settings.model_copy(update={"result_timeout_s": 0.3}))
    await front.start()
    result = await front.submit(RunRequest(code="1"))  # no worker runs
    await front.close()
    assert result.status is RunStatus.INTERNAL_ERROR
    assert "within 0.3 s" in result.stderr


async def test_calls_survive_a_redis_that_lost_everything(
    dispatcher: RedisDispatcher, redis_url: str, settings: ClusterSettings
) -> None:
    stuck = EchoSandbox()
    stuck.gate.clear()
    old = Node(redis_url, settings, stuck, slots=1)
    calls = [asyncio.create_task(dispatcher.submit(RunRequest(code=str(n)))) for n in range(3)]
    await stuck.wait_running(2)  # it holds 2, the third waits in the queue
    # As after a restart of a Redis without persistence: queue, leases and liveness are gone.
    redis = dispatcher.queue.redis
    await redis.delete(*[key async for key in redis.scan_iter(f"{settings.key_prefix}:*")])
    fresh = Node(redis_url, settings, EchoSandbox())
    results = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [r.stdout for r in results] == ["0", "1", "2"]
    assert sorted(fresh.worker.sandbox.calls) == ["0", "1", "2"]
    await fresh.close()
    await old.close()
