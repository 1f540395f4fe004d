"""Processes the benchmark starts: a single-node ``serve``, or a local cluster (Redis, workers,
one front end), each stopped afterwards; and readings of their memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from rstar2_sandbox import SandboxClient
from rstar2_sandbox.bench import memory_mib

__all__ = ["LocalCluster", "free_port", "local_cluster", "memory_mib", "served", "wait_healthy"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    return env


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rstar2_sandbox.cli", *args, "--log-level", "WARNING"]


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> None:
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def served(pythonpath: str | None, *options: str) -> Iterator[tuple[str, int]]:
    """``rstar2-sandbox serve`` on a free port (from ``pythonpath`` first, when given): its URL
    and pid; stopped with SIGINT afterwards."""
    port = free_port()
    server = subprocess.Popen(
        _command("serve", "--port", str(port), *options), env=_environment(pythonpath)
    )
    try:
        yield f"http://127.0.0.1:{port}", server.pid
    finally:
        _stop(server)


async def wait_healthy(url: str, deadline_s: float, workers: int = 1) -> None:
    """Until ``url`` answers /healthz with at least ``workers`` workers."""
    client = SandboxClient(url, retries=0)
    deadline = time.monotonic() + deadline_s
    try:
        while True:
            try:
                health = await client.health()
                if int(health.get("workers", 0)) >= workers:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not report {workers} workers in {deadline_s} s")
            await asyncio.sleep(0.5)
    finally:
        await client.aclose()


@dataclass
class LocalCluster:
    """Redis, workers and one front end on this machine."""

    url: str
    redis_url: str
    prefix: str
    front: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)


@contextlib.contextmanager
def local_cluster(workers: int, pythonpath: str | None) -> Iterator[LocalCluster]:
    """A fresh Redis (no persistence) on a free port, ``workers`` workers of one fork-server each
    (default preloads) and a front end; all stopped afterwards."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("the step benchmark needs redis-server (apt-get install redis-server)")
    directory = tempfile.mkdtemp(prefix="rstar2-bench-redis-")
    redis_port, port = free_port(), free_port()
    options = ["--bind", "127.0.0.1", "--port", str(redis_port), "--dir", directory]
    options += ["--save", "", "--appendonly", "no"]
    redis = subprocess.Popen([binary, *options], stdout=subprocess.DEVNULL)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    prefix = "bench:step"
    env = _environment(pythonpath)
    cluster_args = ("--redis", redis_url, "--redis-prefix", prefix)
    started: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(0.5)
        for _ in range(workers):
            started.append(
                subprocess.Popen(_command("worker", *cluster_args, "--servers", "1"), env=env)
            )
        front = subprocess.Popen(_command("serve", "--port", str(port), *cluster_args), env=env)
        started.append(front)
        yield LocalCluster(f"http://127.0.0.1:{port}", redis_url, prefix, front, started[:-1])
    finally:
        for process in started:
            _stop(process, signal.SIGTERM)
        _stop(redis, signal.SIGTERM)
        shutil.rmtree(directory, ignore_errors=True)
