"""The HTTP service over a RedisDispatcher: 503 with Retry-After, workers and queue in /metrics."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rstar2_sandbox.app import create_app
from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.cluster import (
    ClusterQueue,
    ClusterSettings,
    ClusterWorker,
    RedisDispatcher,
    connect,
)
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.local import LocalSandbox
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.settings import ServerSettings

from .helpers import BackgroundWorker, EchoSandbox, wait_for_stats

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster]


def gauge(metrics: str, name: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(f"rstar2_sandbox_{name} ")]
    return float(line.split()[1])


async def test_full_queue_is_503_and_metrics_show_the_cluster(
    redis_url: str, settings: ClusterSettings
) -> None:
    cluster = settings.model_copy(update={"max_queue": 3, "retry_after_s": 2.0})
    dispatcher = RedisDispatcher(redis_url, cluster, refresh_s=0.1)
    app = create_app(dispatcher, ServerSettings())
    async with TestClient(TestServer(app)) as http:
        health = await http.get("/healthz")
        assert health.status == 503  # no worker yet
        waiting = [
            asyncio.create_task(http.post("/v1/run", json={"code": f"print({n})"}))
            for n in range(3)
        ]
        await wait_for_stats(dispatcher, queue_depth=3)
        refused = await http.post("/v1/run", json={"code": "print(3)"})
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "2"
        assert (await refused.json())["error"] == "queue_full"
        metrics = await (await http.get("/metrics")).text()
        assert gauge(metrics, "queue_depth") == 3
        assert gauge(metrics, "workers") == 0

        node = BackgroundWorker.connected(redis_url, cluster, EchoSandbox())
        responses = await asyncio.gather(*waiting)
        assert [(await r.json())["stdout"] for r in responses] == [f"print({n})" for n in range(3)]
        await wait_for_stats(dispatcher, workers=1, queue_depth=0)
        metrics = await (await http.get("/metrics")).text()
        assert (gauge(metrics, "workers"), gauge(metrics, "slots")) == (1, 2)
        assert (await http.get("/healthz")).status == 200
        info = await (await http.get("/v1/info")).json()
        assert info["dispatcher"]["kind"] == "redis"
        assert info["dispatcher"]["workers"] == 1
        await node.close()


async def test_results_cross_the_cluster_intact(redis_url: str, settings: ClusterSettings) -> None:
    """A client of a cluster front end gets what the worker's executor produced, field by field."""
    requests = [
        RunRequest(code="print(sum(range(10)))"),
        RunRequest(code="import sys; print('err', file=sys.stderr); raise KeyError('k')"),
        RunRequest(code="while True: pass", timeout_s=0.5),
        RunRequest(code="print('y' * 5000)", output_limit_bytes=100),
        RunRequest(code="6 * 7", display_last_expr=True),
    ]
    async with LocalSandbox(ExecutorSettings(servers=1, slots=2, preload=[])) as local:
        queue = ClusterQueue(connect(redis_url), settings)
        worker = ClusterWorker(queue, local, slots=2, poll_s=0.05)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run(stop))
        server = TestServer(create_app(RedisDispatcher(redis_url, settings), ServerSettings()))
        await server.start_server()
        async with SandboxClient(str(server.make_url("")), batch_size=2) as client:
            remote = await client.run_many(requests)
        await server.close()
        stop.set()
        await serving
        await queue.redis.aclose()
        direct = await local.run_many(requests)

    def comparable(result: RunResult) -> dict[str, object]:
        # Timings vary, and so does how a run over its output cap ends (killed, or exited first).
        return result.model_dump(exclude={"wall_time_s", "cpu_time_s", "exit_code", "signal"})

    assert [r.status for r in remote] == [
        RunStatus.SUCCESS,
        RunStatus.RUNTIME_ERROR,
        RunStatus.TIMEOUT,
        RunStatus.OUTPUT_LIMIT_EXCEEDED,
        RunStatus.SUCCESS,
    ]
    assert [comparable(r) for r in remote] == [comparable(r) for r in direct]
    assert [(r.exit_code, r.signal) for r in remote[:2]] == [(0, None), (1, None)]
