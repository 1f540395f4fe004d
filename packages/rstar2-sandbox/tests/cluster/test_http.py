"""The HTTP service over a RedisDispatcher: 503 with Retry-After, workers and queue in /metrics."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rstar2_sandbox.app import create_app
from rstar2_sandbox.cluster import ClusterSettings, RedisDispatcher
from rstar2_sandbox.settings import ServerSettings

from .test_dispatcher import Node, wait_for_stats
from .test_worker import EchoSandbox

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

        node = Node(redis_url, cluster, EchoSandbox())
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
