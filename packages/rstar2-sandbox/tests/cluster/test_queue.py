"""The Redis queue layer: bound, delivery, leases, reclaim, first-writer-wins results."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis

from rstar2_sandbox.cluster import (
    ClusterQueue,
    ClusterSettings,
    Completion,
    ResultMessage,
    TaskMessage,
    WorkerInfo,
)
from rstar2_sandbox.isolation import IsolationFeature, IsolationReport
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]


def task(n: int, reply_to: str = "fe") -> TaskMessage:
    return TaskMessage(
        request_id=f"r{n}", reply_to=reply_to, request=RunRequest(code=f"print({n})")
    )


def result(n: int, worker: str = "w", deliveries: int = 1) -> ResultMessage:
    return ResultMessage(
        request_id=f"r{n}",
        result=RunResult(status=RunStatus.SUCCESS, stdout=f"{n}\n"),
        worker=worker,
        deliveries=deliveries,
    )


async def make_queue(redis: Redis, settings: ClusterSettings) -> ClusterQueue:
    queue = ClusterQueue(redis, settings)
    await queue.ensure_group()
    await queue.ensure_group()  # a second front end or worker starting must not fail
    return queue


async def test_call_travels_from_enqueue_to_front_end(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    assert await queue.enqueue(task(1))
    (delivery,) = await queue.read_new("w1", count=10, block_s=0.1)
    assert delivery.task == task(1)
    assert delivery.deliveries == 1
    assert await queue.complete(Completion(delivery.entry_id, "fe", result(1)))
    assert await queue.pop_results("fe", count=10, timeout_s=0.1) == [result(1)]
    assert await redis.xlen(queue.stream) == 0
    assert await redis.xpending(queue.stream, "workers") == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }


async def test_batches_are_at_most_count(redis: Redis, settings: ClusterSettings) -> None:
    queue = await make_queue(redis, settings)
    for n in range(5):
        assert await queue.enqueue(task(n))
    first = await queue.read_new("w1", count=3, block_s=0.1)
    second = await queue.read_new("w2", count=3, block_s=0.1)
    assert [d.task.request_id for d in first if d.task] == ["r0", "r1", "r2"]
    assert [d.task.request_id for d in second if d.task] == ["r3", "r4"]
    assert await queue.read_new("w1", count=3, block_s=0.05) == []


async def test_full_queue_refuses_until_calls_are_taken(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings.model_copy(update={"max_queue": 3}))
    assert [await queue.enqueue(task(n)) for n in range(4)] == [True, True, True, False]
    # A call handed to a worker no longer waits: it frees a place.
    (delivery,) = await queue.read_new("w1", count=1, block_s=0.1)
    assert await queue.enqueue(task(5))
    assert not await queue.enqueue(task(6))
    stats = await queue.stats()
    assert (stats.queue_depth, stats.in_flight) == (3, 1)
    await queue.complete(Completion(delivery.entry_id, "fe", result(0)))
    assert not await queue.enqueue(task(6))


async def test_stale_call_is_claimed_only_after_the_lease(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    await queue.enqueue(task(1))
    (held,) = await queue.read_new("dead", count=1, block_s=0.1)
    assert await queue.claim_stale("alive", count=10) == []
    await asyncio.sleep(settings.lease_s + 0.1)
    (claimed,) = await queue.claim_stale("alive", count=10)
    assert claimed.entry_id == held.entry_id
    assert claimed.task == task(1)
    assert claimed.deliveries == 2
    # The claim resets the lease: a third worker racing for it gets nothing.
    assert await queue.claim_stale("other", count=10) == []


async def test_renewed_lease_keeps_a_call(redis: Redis, settings: ClusterSettings) -> None:
    queue = await make_queue(redis, settings)
    await queue.enqueue(task(1))
    (held,) = await queue.read_new("slow", count=1, block_s=0.1)
    for _ in range(4):
        await asyncio.sleep(settings.lease_s / 2)
        await queue.renew("slow", [held.entry_id])
    assert await queue.claim_stale("other", count=10) == []
    stats = await queue.stats()
    assert (stats.queue_depth, stats.in_flight) == (0, 1)


async def test_only_the_first_result_reaches_the_front_end(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    await queue.enqueue(task(1))
    (first,) = await queue.read_new("w1", count=1, block_s=0.1)
    await asyncio.sleep(settings.lease_s + 0.1)
    (second,) = await queue.claim_stale("w2", count=1)
    assert await queue.complete(Completion(second.entry_id, "fe", result(1, "w2", 2)))
    assert not await queue.complete(Completion(first.entry_id, "fe", result(1, "w1", 1)))
    assert await queue.pop_results("fe", count=10, timeout_s=0.1) == [result(1, "w2", 2)]
    assert await queue.pop_results("fe", count=10, timeout_s=0.1) == []
    assert await redis.xlen(queue.stream) == 0
    # What stays behind is a small marker of the winner, and it expires.
    marker = await redis.get(queue.done_key("r1"))
    assert marker is not None
    assert json.loads(marker) == {"worker": "w2", "deliveries": 2}
    assert 0 < await redis.pttl(queue.done_key("r1")) <= settings.result_ttl_s * 1000


async def test_malformed_entry_is_reported_with_its_ids(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    await redis.xadd(queue.stream, {"id": "r9", "reply": "fe", "request": '{"code": 5}'})
    await redis.xadd(queue.stream, {"request": "{}"})
    bad_body, no_ids = await queue.read_new("w1", count=10, block_s=0.1)
    assert bad_body.task is None
    assert (bad_body.request_id, bad_body.reply_to) == ("r9", "fe")
    assert bad_body.error is not None
    assert "'request'" in bad_body.error
    assert "code" in bad_body.error
    assert no_ids.task is None
    assert no_ids.error is not None
    assert "['id', 'reply']" in no_ids.error


async def test_released_calls_are_queued_anew(redis: Redis, settings: ClusterSettings) -> None:
    queue = await make_queue(redis, settings)
    for n in range(2):
        await queue.enqueue(task(n))
    held = await queue.read_new("stopping", count=2, block_s=0.1)
    await queue.release({d.entry_id: d.task for d in held if d.task})
    again = await queue.read_new("w2", count=10, block_s=0.1)
    assert [d.task for d in again] == [task(0), task(1)]
    assert [d.deliveries for d in again] == [1, 1]
    assert {d.entry_id for d in again}.isdisjoint(d.entry_id for d in held)
    assert await redis.xlen(queue.stream) == 2


async def test_front_end_liveness(redis: Redis, settings: ClusterSettings) -> None:
    queue = await make_queue(redis, settings)
    assert not await queue.touch_frontend("a")  # had never been alive
    assert await queue.touch_frontend("a")
    await queue.touch_frontend("b")
    assert await queue.alive_frontends({"a", "b", "c"}) == {"a", "b"}
    await queue.drop_frontend("a")
    assert await queue.alive_frontends({"a", "b"}) == {"b"}


def report(active: bool) -> IsolationReport:
    feature = IsolationFeature(active=active, detail="" if active else "not permitted")
    return IsolationReport.model_validate(dict.fromkeys(IsolationReport.model_fields, feature))


async def test_stats_merge_what_live_workers_report(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    assert (await queue.stats()).isolation is None  # nothing known without workers
    await queue.heartbeat(
        "w1", WorkerInfo(slots=4, preloaded=["numpy", "sympy"], isolation=report(True))
    )
    await queue.heartbeat("w2", WorkerInfo(slots=8, preloaded=["numpy"], isolation=report(False)))
    stats = await queue.stats()
    assert (stats.workers, stats.slots, stats.preloaded) == (2, 12, ("numpy",))
    assert stats.isolation is not None
    assert not stats.isolation.network_namespace.active  # active only where active on all
    await queue.deregister("w2")
    stats = await queue.stats()
    assert (stats.workers, stats.slots, stats.preloaded) == (1, 4, ("numpy", "sympy"))
    assert stats.isolation == report(True)
    await asyncio.sleep(settings.lease_s + 0.1)  # w1 stops heartbeating: its lease runs out
    stats = await queue.stats()
    assert (stats.workers, stats.slots, stats.isolation) == (0, 0, None)


async def test_deregister_keeps_a_consumer_that_still_holds_calls(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    await queue.enqueue(task(1))
    await queue.read_new("w1", count=1, block_s=0.1)
    await queue.deregister("w1")
    await asyncio.sleep(settings.lease_s + 0.1)
    (claimed,) = await queue.claim_stale("w2", count=1)
    assert claimed.task == task(1)


async def test_unreadable_result_is_skipped_not_fatal(
    redis: Redis, settings: ClusterSettings, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await make_queue(redis, settings)
    await redis.rpush(queue.reply_key("fe"), "not json", result(1).model_dump_json())
    assert await queue.pop_results("fe", count=10, timeout_s=0.1) == [result(1)]
    assert "unreadable result for front end fe" in caplog.text


async def test_prune_forgets_only_idle_consumers_holding_nothing(
    redis: Redis, settings: ClusterSettings
) -> None:
    queue = await make_queue(redis, settings)
    for n in range(3):
        await queue.enqueue(task(n))

    async def take_and_finish(consumer: str) -> None:
        (delivery,) = await queue.read_new(consumer, count=1, block_s=0.1)
        assert delivery.task is not None
        n = int(delivery.task.request_id[1:])
        await queue.complete(Completion(delivery.entry_id, "fe", result(n)))

    await queue.read_new("holds-a-call", count=1, block_s=0.1)
    await take_and_finish("died-empty")
    await asyncio.sleep(0.3)
    await take_and_finish("active")
    assert await queue.prune_consumers(min_idle_s=0.2) == 1
    consumers = await redis.xinfo_consumers(queue.stream, "workers")
    assert sorted(c["name"] for c in consumers) == ["active", "holds-a-call"]
