"""Batch responses are streamed in request order: memory does not grow with the batch, results that
finish early wait within a budget (then on disk), and refusals are reported as they can be."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from rstar2_sandbox import (
    BatchResponse,
    DispatcherStats,
    RunRequest,
    RunResult,
    RunStatus,
    ServerSettings,
    create_app,
)
from rstar2_sandbox.api import streaming
from rstar2_sandbox.api.codejudge import BatchResult
from rstar2_sandbox.api.streaming import ResponseBudget, ResultSpool, stream_batch
from rstar2_sandbox.dispatch import QueueFullError

from .conftest import free_port, start_serve  # type: ignore[import-not-found]

in_session_loop = pytest.mark.asyncio(loop_scope="session")


class ScriptedDispatcher:
    """Runs nothing: ``code`` says what to answer. ``sleep S; print N`` waits S seconds and
    answers N bytes of output; ``refuse after S`` raises ``QueueFullError`` after S seconds."""

    def __init__(self, slots: int = 10**6) -> None:
        self.cancelled = 0
        self.submitted = 0
        self.slots = slots

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def submit(self, request: RunRequest) -> RunResult:
        self.submitted += 1
        words = request.code.split()
        try:
            if words[0] == "refuse":
                await asyncio.sleep(float(words[2]))
                raise QueueFullError(2.0)
            await asyncio.sleep(float(words[1].rstrip(";")))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return RunResult(status=RunStatus.SUCCESS, stdout=request.code + "." * int(words[3]))

    def stats(self) -> DispatcherStats:
        return DispatcherStats(kind="scripted", queue_depth=0, queue_limit=10**6, in_flight=0,
                               workers=1, slots=self.slots)  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def scripted() -> AsyncIterator[tuple[str, ScriptedDispatcher, ResponseBudget]]:
    """A service over a ``ScriptedDispatcher`` with a 1 MiB response budget."""
    dispatcher = ScriptedDispatcher()
    app = create_app(dispatcher, ServerSettings(response_buffer_mb=1))
    server = TestServer(app, host="127.0.0.1", port=free_port())
    await server.start_server()
    from rstar2_sandbox.api.common import RESPONSE_BUDGET

    yield str(server.make_url("")).rstrip("/"), dispatcher, app[RESPONSE_BUDGET]
    await server.close()


# -- the spool ----------------------------------------------------------------------------------


@in_session_loop
async def test_spool_keeps_what_fits_in_memory_and_spills_the_rest(tmp_path: object) -> None:
    budget = ResponseBudget(limit_bytes=250)
    spool = ResultSpool(budget, str(tmp_path))
    items = [bytes([65 + i]) * 100 for i in range(6)]
    for index in reversed(range(6)):  # finished out of order: all wait
        spool.put(index, items[index])
    assert budget.used_bytes == 200  # two fit, four went to disk
    assert spool.spilled_bytes == 400
    assert [await spool.take(index) for index in range(6)] == items
    assert budget.used_bytes == 0
    spool.close()
    assert os.listdir(str(tmp_path)) == []  # the spill file is unlinked from the start


@in_session_loop
async def test_spool_waits_for_an_item_and_reports_failures() -> None:
    spool = ResultSpool(ResponseBudget(1 << 20))
    waiter = asyncio.create_task(spool.take(0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    spool.fail(1, QueueFullError(1.0))
    spool.put(0, b"zero")
    assert await waiter == b"zero"
    assert isinstance(spool.first_failure(), QueueFullError)
    with pytest.raises(QueueFullError):
        await spool.take(1)


def test_closed_spool_drops_results_and_returns_its_budget() -> None:
    budget = ResponseBudget(1 << 20)
    spool = ResultSpool(budget)
    spool.put(3, b"x" * 1000)
    spool.close()
    spool.put(4, b"y" * 1000)
    assert budget.used_bytes == 0


# -- streaming over HTTP ------------------------------------------------------------------------


def scripted_batch(plan: list[tuple[float, int]]) -> dict[str, object]:
    """Calls that sleep S and print N bytes, each capped (for the window) just above N."""
    return {
        "requests": [
            {"code": f"sleep {s}; print {n}", "output_limit_bytes": n + 100} for s, n in plan
        ]
    }


@in_session_loop
async def test_results_stream_in_order_past_the_budget(
    scripted: tuple[str, ScriptedDispatcher, ResponseBudget],
) -> None:
    url, _, budget = scripted
    # In each batch the first item is the slowest: the others wait for it, within the batch's
    # window (1 MiB); two batches at once wait for more than the budget (1 MiB) holds.
    plan = [(0.3, 10)] + [(0.01 * (i % 3), 100_000) for i in range(30)]

    async def one_batch(session: aiohttp.ClientSession) -> bytes:
        async with session.post(url + "/v1/run/batch", json=scripted_batch(plan)) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json; charset=utf-8"
            assert response.headers.get("Transfer-Encoding") == "chunked"
            return await response.read()

    async with aiohttp.ClientSession() as session:
        bodies = await asyncio.gather(one_batch(session), one_batch(session))
    for body in bodies:
        results = BatchResponse.model_validate_json(body).results
        assert [r.stdout for r in results] == [f"sleep {s}; print {n}" + "." * n for s, n in plan]
    assert budget.used_bytes == 0


@in_session_loop
async def test_codejudge_batch_streams_the_same_shape(
    scripted: tuple[str, ScriptedDispatcher, ResponseBudget],
) -> None:
    url, _, _ = scripted
    submissions = [
        {"type": "python", "solution": f"sleep {0.05 * (3 - i)}; print 3", "sub_id": i}
        for i in range(4)
    ] + [{"type": "python", "solution": "refuse after 0.1"}]
    body = {"type": "batch", "sub_id": "b", "submissions": submissions}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/run/long-batch", json=body) as response,
    ):
        reply = BatchResult.model_validate_json(await response.read())
    assert reply.sub_id == "b"
    assert [r.sub_id for r in reply.results[:4]] == [0, 1, 2, 3]
    assert all(r.success and r.stdout.endswith("...") for r in reply.results[:4])
    # A refused call is reported in place, as Code Judge does; the batch goes on.
    assert reply.results[4].reason == "queue_timeout"


@in_session_loop
async def test_a_refusal_before_anything_was_sent_is_a_503(
    scripted: tuple[str, ScriptedDispatcher, ResponseBudget],
) -> None:
    url, dispatcher, _ = scripted
    requests = [{"code": "sleep 0.2; print 1"}, {"code": "refuse after 0"}]
    requests += [{"code": "sleep 5; print 1"}] * 3
    requests = [{**r, "output_limit_bytes": 1000} for r in requests]
    before = dispatcher.cancelled
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/run/batch", json={"requests": requests}) as response,
    ):
        assert response.status == 503
        assert response.headers["Retry-After"] == "2"
        assert (await response.json())["error"] == "queue_full"
    # The rest of the batch was called off, not left running for nobody.
    assert dispatcher.cancelled - before == 3


@in_session_loop
async def test_a_refusal_after_the_stream_started_cuts_the_connection(
    scripted: tuple[str, ScriptedDispatcher, ResponseBudget],
) -> None:
    url, _, budget = scripted
    requests = [{"code": "sleep 0; print 1"}, {"code": "refuse after 0.3"}]
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/run/batch", json={"requests": requests}) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    assert budget.used_bytes == 0


@in_session_loop
async def test_a_client_that_leaves_calls_off_the_rest(
    scripted: tuple[str, ScriptedDispatcher, ResponseBudget],
) -> None:
    url, dispatcher, budget = scripted
    before = dispatcher.cancelled
    requests = [{"code": "sleep 0; print 200000", "output_limit_bytes": 200_100}]
    requests += [{"code": "sleep 3; print 1", "output_limit_bytes": 1000}] * 5
    async with aiohttp.ClientSession() as session:
        response = await session.post(url + "/v1/run/batch", json={"requests": requests})
        assert response.status == 200
        await response.content.readexactly(1000)
        response.close()
    for _ in range(100):
        if dispatcher.cancelled - before == 5:
            break
        await asyncio.sleep(0.05)
    assert dispatcher.cancelled - before == 5
    assert budget.used_bytes == 0


@in_session_loop
async def test_a_client_that_does_not_read_stops_its_batch() -> None:
    """Calls are admitted only while the batch's waiting results and the largest results of its
    running calls fit its window (1 MiB here): a client that reads nothing holds its batch
    still."""
    dispatcher = ScriptedDispatcher(slots=4)  # 64 calls ahead at most
    app = create_app(dispatcher, ServerSettings(response_buffer_mb=1))
    server = TestServer(app, host="127.0.0.1", port=free_port())
    await server.start_server()
    from rstar2_sandbox.api.common import RESPONSE_BUDGET

    budget = app[RESPONSE_BUDGET]
    items = 300
    try:
        async with aiohttp.ClientSession() as session:
            body = scripted_batch([(0.0, 1_000_000)] * items)
            response = await session.post(str(server.make_url("/v1/run/batch")), json=body)
            assert response.status == 200
            await asyncio.sleep(1.0)
            stalled = dispatcher.submitted
            await asyncio.sleep(0.5)
            # Held still: what the socket buffers took (some MiB), the window, 64 ahead.
            assert dispatcher.submitted == stalled
            assert stalled < 64 + 40, stalled
            assert budget.used_bytes <= 1 << 20
            results = BatchResponse.model_validate_json(await response.read()).results
            response.release()
    finally:
        await server.close()
    assert len(results) == items
    assert dispatcher.submitted == items
    assert all(len(r.stdout) == len("sleep 0.0; print 1000000") + 1_000_000 for r in results)
    assert budget.used_bytes == 0


# -- the front end's memory, through a real ``serve`` ---------------------------------------------


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise KeyError("VmHWM")


@pytest.fixture(scope="module")
def served_small_budget() -> Iterator[tuple[str, int]]:
    url, server = start_serve(
        "--servers", "1", "--preload", "", "--response-buffer-mb", "16", "--log-level", "WARNING"
    )
    yield url, server.pid
    server.send_signal(signal.SIGINT)
    server.wait(30)


class StalledResponse:
    """A response whose client reads nothing until ``reading`` is set."""

    def __init__(self) -> None:
        self.reading = asyncio.Event()
        self.written = 0

    async def write(self, data: bytes | memoryview) -> None:
        await self.reading.wait()
        self.written += len(data)

    async def write_eof(self) -> None:
        pass


@in_session_loop
async def test_a_result_being_written_still_takes_room_in_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While item 0 is written to a client that does not read, its bytes count in the window:
    item 1, whose largest result would not fit beside it, does not start."""
    response = StalledResponse()

    async def start(request: object) -> StalledResponse:
        return response

    monkeypatch.setattr(streaming, "_start", start)
    started: list[int] = []

    async def produce(index: int) -> bytes:
        started.append(index)
        return b"x" * 600_000

    batch = asyncio.ensure_future(
        stream_batch(
            None,  # type: ignore[arg-type]  # used only by the replaced _start
            count=4,
            produce=produce,
            head=b"[",
            tail=b"]",
            budget=ResponseBudget(16 << 20),
            window_bytes=1 << 20,
            ahead=8,
            reserve=lambda index: 600_000,
        )
    )
    await asyncio.sleep(0.2)
    assert started == [0]
    response.reading.set()
    await batch
    assert started == [0, 1, 2, 3]
    assert response.written == 4 * 600_000 + 3 + 2  # the items, their commas, "[" and "]"


@pytest.mark.slow
@in_session_loop
async def test_front_end_memory_does_not_grow_with_the_batch(
    served_small_budget: tuple[str, int],
) -> None:
    """A batch whose results total 256 MiB, most finished while the first item still runs, goes
    through a front end that never holds more than a small part of it."""
    url, pid = served_small_budget
    mib = 1 << 20
    writer = f"import sys\nsys.stdout.write('x' * {4 * mib})"
    requests = [{"code": "import time\ntime.sleep(2)\nprint('first')"}]
    requests += [{"code": writer, "output_limit_bytes": 8 * mib}] * 64
    body = json.dumps({"requests": requests})
    idle = peak_rss_mib(pid)
    received, successes, head, overlap = 0, 0, b"", b""
    marker = b'"status":"success"'
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/run/batch", data=body) as response,
    ):
        assert response.status == 200
        # Read as it comes, counting results: the test holds no copy of the response either.
        async for chunk in response.content.iter_chunked(1 << 20):
            received += len(chunk)
            head = head or chunk[:100]
            window = overlap + chunk
            successes += window.count(marker)
            overlap = window[-(len(marker) - 1) :]
    assert head.startswith(b'{"results":[{"status":"success"')
    assert b'"stdout":"first\\n"' in head  # the slow first item came first
    assert successes == 65
    assert received > 64 * 4 * mib
    assert overlap.endswith(b"}]}")
    peak = peak_rss_mib(pid)
    # The budget (16 MiB), the few results in flight (4 slots, each a few copies of 4 MiB) and
    # the runtime: far below the 256 MiB of results, let alone the several copies a whole
    # response took before.
    assert peak - idle < 140, (idle, peak)
