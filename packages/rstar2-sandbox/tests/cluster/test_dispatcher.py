"""The front end's Redis dispatcher with in-process workers: results, bound, stats, recovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2_sandbox.cluster import ClusterSettings, RedisDispatcher
from rstar2_sandbox.dispatch import Dispatcher, QueueFullError
from rstar2_sandbox.models import RunRequest, RunStatus

from .conftest import redis_server
from .helpers import BackgroundWorker, EchoSandbox, wait_for_stats

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]


@pytest_asyncio.fixture
async def dispatcher(redis_url: str, settings: ClusterSettings) -> AsyncIterator[RedisDispatcher]:
    front = RedisDispatcher(redis_url, settings, refresh_s=0.1)
    await front.start()
    yield front
    await front.close()


@pytest_asyncio.fixture
async def node(redis_url: str, settings: ClusterSettings) -> AsyncIterator[BackgroundWorker]:
    started = BackgroundWorker.connected(redis_url, settings, EchoSandbox())
    yield started
    await started.close()


async def test_is_a_dispatcher(dispatcher: RedisDispatcher) -> None:
    assert isinstance(dispatcher, Dispatcher)
    assert dispatcher.stats().kind == "redis"


async def test_submitted_calls_come_back_to_their_callers(
    dispatcher: RedisDispatcher, node: BackgroundWorker
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
    first = BackgroundWorker.connected(redis_url, settings, sandbox)
    second = BackgroundWorker.connected(redis_url, settings, sandbox)
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
    old = BackgroundWorker.connected(redis_url, settings, stuck, slots=1, drain_timeout_s=0.2)
    calls = [asyncio.create_task(dispatcher.submit(RunRequest(code=str(n)))) for n in range(3)]
    await stuck.wait_running(2)  # it holds 2, the third waits in the queue
    # As after a restart of a Redis without persistence: queue, leases and liveness are gone.
    redis = dispatcher.queue.redis
    await redis.delete(*[key async for key in redis.scan_iter(f"{settings.key_prefix}:*")])
    echo = EchoSandbox()
    fresh = BackgroundWorker.connected(redis_url, settings, echo)
    results = await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [r.stdout for r in results] == ["0", "1", "2"]
    assert sorted(echo.calls) == ["0", "1", "2"]
    await fresh.close()
    await old.close()
