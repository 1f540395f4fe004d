"""A private redis-server for the cluster tests: loopback, free port, temporary directory.

Locally the tests skip when the ``redis-server`` binary is missing; with ``RSTAR2_REQUIRE_REDIS=1``
(set by CI) they fail instead, so they can never be skipped silently there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis import ConnectionError as RedisConnectionError
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from rstar2_sandbox.cluster import ClusterSettings

from .helpers import Processes

REQUIRE_ENV = "RSTAR2_REQUIRE_REDIS"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server on a free loopback port, its files in ``workdir``: (url, process)."""
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{message}, and {REQUIRE_ENV}=1 makes the cluster tests mandatory")
        pytest.skip(message)
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir)]
    args += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = SyncRedis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except RedisConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server on port {port} did not start")
                time.sleep(0.05)
        client.close()
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the session; tests keep apart by key prefix."""
    with redis_server(tmp_path_factory.mktemp("redis")) as (url, _proc):
        yield url


@pytest.fixture
def settings() -> ClusterSettings:
    """A key prefix of its own per test, and short timings so faults resolve quickly."""
    return ClusterSettings(
        key_prefix=f"test:{uuid.uuid4().hex[:8]}",
        max_queue=50,
        lease_s=0.5,
        retry_after_s=0.2,
        frontend_ttl_s=5,
        result_ttl_s=30,
        result_timeout_s=20,
    )


@pytest_asyncio.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    redis_client = Redis.from_url(redis_url, decode_responses=True)
    yield redis_client
    await redis_client.aclose()


@pytest.fixture
def processes(redis_url: str, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(redis_url, f"faults:{uuid.uuid4().hex[:8]}", tmp_path)
    yield procs
    procs.kill_all()
