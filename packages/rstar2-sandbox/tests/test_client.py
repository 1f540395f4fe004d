"""``SandboxClient`` (batching, retries) and the ``Sandbox`` conformance suite that
``LocalSandbox`` and ``SandboxClient`` both pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from rstar2_sandbox import (
    LocalSandbox,
    RunRequest,
    RunStatus,
    Sandbox,
    SandboxClient,
    SandboxClientError,
    SandboxUnavailableError,
    SyncSandboxClient,
)

from .conftest import free_port  # type: ignore[import-not-found]

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session", params=["local", "http"])
async def any_sandbox(
    request: pytest.FixtureRequest, sandbox: LocalSandbox, service_url: str
) -> AsyncIterator[Sandbox]:
    """Every ``Sandbox`` implementation (the local one is shared, so it is not closed here)."""
    if request.param == "local":
        yield sandbox
    else:
        client = SandboxClient(service_url, batch_size=3, max_concurrency=2)
        yield client
        await client.aclose()


# -- conformance ----------------------------------------------------------------------------


async def test_conforms_to_the_protocol(any_sandbox: Sandbox) -> None:
    assert isinstance(any_sandbox, Sandbox)


async def test_run_returns_the_result(any_sandbox: Sandbox) -> None:
    result = await any_sandbox.run(RunRequest(code="print(sum(range(10)))"))
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == "45\n"


async def test_run_many_keeps_order_across_batches(any_sandbox: Sandbox) -> None:
    requests = [RunRequest(code=f"print({i} * {i})") for i in range(10)]
    results = await any_sandbox.run_many(requests)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(10)]


async def test_run_many_of_nothing(any_sandbox: Sandbox) -> None:
    assert await any_sandbox.run_many([]) == []


async def test_statuses_survive_the_transport(any_sandbox: Sandbox) -> None:
    results = await any_sandbox.run_many(
        [
            RunRequest(code="raise KeyError('k')"),
            RunRequest(code="while True: pass", timeout_s=0.5),
            RunRequest(code="print('y' * 5000)", output_limit_bytes=100),
        ]
    )
    assert [r.status for r in results] == [
        RunStatus.RUNTIME_ERROR,
        RunStatus.TIMEOUT,
        RunStatus.OUTPUT_LIMIT_EXCEEDED,
    ]
    assert results[2].stdout == "y" * 100
    assert results[2].stderr == (
        "sandbox: stdout exceeded the output limit of 100 bytes (at least 5001 bytes were "
        "written); the run was stopped\n"
    )


# -- client behaviour ---------------------------------------------------------------------------


async def test_client_error_is_not_retried(service_url: str) -> None:
    async with SandboxClient(service_url, retries=3, batch_size=100) as client:
        with pytest.raises(SandboxClientError) as caught:
            await client.run_many([RunRequest(code="1")] * 100)  # over max_batch=64
        assert caught.value.status == 422


async def test_retries_503_honouring_retry_after() -> None:
    """A stub that refuses twice, then answers: the client gets through."""
    calls: list[float] = []

    async def flaky(request: web.Request) -> web.Response:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) <= 2:
            headers = {"Retry-After": "1"}
            return web.json_response({"error": "queue_full"}, status=503, headers=headers)
        return web.json_response({"status": "success", "stdout": "ok\n"})

    app = web.Application()
    app.router.add_post("/v1/run", flaky)
    server = TestServer(app, host="127.0.0.1", port=free_port())
    await server.start_server()
    try:
        async with SandboxClient(str(server.make_url("")), retries=3, max_backoff_s=1) as client:
            result = await client.run(RunRequest(code="print('ok')"))
    finally:
        await server.close()
    assert result.stdout == "ok\n"
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.45  # Retry-After (1 s, with jitter down to half)


async def test_retries_connection_errors_until_the_service_is_up(service_url: str) -> None:
    port = free_port()

    async def start_later() -> TestServer:
        await asyncio.sleep(1.0)

        async def proxy(request: web.Request) -> web.Response:
            return web.json_response({"status": "success", "stdout": "late\n"})

        app = web.Application()
        app.router.add_post("/v1/run", proxy)
        server = TestServer(app, host="127.0.0.1", port=port)
        await server.start_server()
        return server

    starter = asyncio.create_task(start_later())
    async with SandboxClient(f"http://127.0.0.1:{port}", retries=10, backoff_s=0.2) as client:
        result = await client.run(RunRequest(code="1"))
    server = await starter
    await server.close()
    assert result.stdout == "late\n"


async def test_gives_up_after_the_retries() -> None:
    client = SandboxClient(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01)
    with pytest.raises(SandboxUnavailableError, match="failed 3 times"):
        await client.run(RunRequest(code="1"))
    await client.aclose()


async def test_sync_client(service_url: str) -> None:
    def use_blocking_client() -> tuple[str, list[str]]:
        with SyncSandboxClient(service_url, batch_size=2) as client:
            single = client.run(RunRequest(code="print(3)")).stdout
            many = client.run_many([RunRequest(code=f"print({i})") for i in range(5)])
        return single, [r.stdout for r in many]

    # From a worker thread, as synchronous code would call it, while this loop serves.
    single, many = await asyncio.to_thread(use_blocking_client)
    assert single == "3\n"
    assert many == [f"{i}\n" for i in range(5)]
