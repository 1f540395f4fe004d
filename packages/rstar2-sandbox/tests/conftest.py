"""Shared fixtures: one executor pool per session (starting one preloads numpy and sympy), and
checks that runs leave no process behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from rstar2_sandbox import (
    ExecutorSettings,
    LocalDispatcher,
    LocalSandbox,
    ServerSettings,
    create_app,
)

# Planted before any fork-server starts: no run may ever see it.
SECRET = "rstar2-planted-secret-5f2c9e"
os.environ["RSTAR2_TEST_SECRET"] = SECRET

SLOTS = 4


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_serve(*options: str, timeout_s: float = 60) -> tuple[str, subprocess.Popen[bytes]]:
    """``rstar2-sandbox serve OPTIONS`` in its own process on a free loopback port, returned
    once ``/healthz`` answers: its base URL and process (the caller stops it)."""
    port = free_port()
    command = [sys.executable, "-m", "rstar2_sandbox.cli", "serve", "--port", str(port)]
    server = subprocess.Popen([*command, *options])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2).close()
            return url, server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.3)


def cpython_run(code: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter from a file ``main.py``, as a user would run it; the
    file's absolute path (tracebacks, ``__file__``) shortened to ``main.py``, as the sandbox
    names it."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "main.py")
        with open(path, "w") as handle:
            handle.write(code)
        done = subprocess.run(
            [sys.executable, "main.py"], cwd=directory, input=stdin, capture_output=True, text=True
        )
    done.stdout = done.stdout.replace(path, "main.py")
    done.stderr = done.stderr.replace(path, "main.py")
    return done


def processes_of_uids(uids: range) -> list[tuple[int, int, str]]:
    """(pid, uid, state) of every process (zombies included) whose real uid is in ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        uid = int(fields["Uid"].split()[0])
        if uid in uids:
            found.append((int(entry), uid, fields["State"].strip()))
    return found


def children_of(pid: int, but: list[int] | None = None) -> list[int]:
    """Direct children of ``pid``, except those in ``but``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split() if int(p) not in (but or [])]
    except OSError:
        return []


def leftovers(sandbox: LocalSandbox) -> list[str]:
    """Processes a finished run left behind: any process of a slot uid, or a child of a
    fork-server other than its template (a zombie left unreaped, an orphan left alive). Empty
    when all is clean."""
    pool = sandbox.pool
    found = []
    if pool.isolation.unprivileged_uid.active:
        uids = range(pool.settings.uid_base, pool.settings.uid_base + pool.slots)
        found += [f"pid {p} uid {u} state {s}" for p, u, s in processes_of_uids(uids)]
    templates = pool.template_pids
    for server in pool.server_pids:
        found += [f"child {c} of fork-server {server}" for c in children_of(server, templates)]
    return found


@pytest.fixture(scope="session")
def executor_settings() -> ExecutorSettings:
    """Two fork-servers with numpy and sympy preloaded: the default shape, smaller."""
    return ExecutorSettings(servers=2, slots=SLOTS, preload=["numpy", "sympy"])


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def sandbox(executor_settings: ExecutorSettings) -> AsyncIterator[LocalSandbox]:
    """A started ``LocalSandbox``; after the session, no fork-server may remain."""
    async with LocalSandbox(executor_settings) as local:
        pids = local.pool.server_pids
        yield local
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def no_leftovers(sandbox: LocalSandbox) -> Callable[[], None]:
    """Call it after a run: fails when the run left any process behind."""

    def check() -> None:
        assert leftovers(sandbox) == []

    return check


async def start_service(
    executor: ExecutorSettings, settings: ServerSettings | None = None
) -> TestServer:
    """The HTTP app over a ``LocalDispatcher``, listening on a loopback port."""
    settings = settings or ServerSettings()
    dispatcher = LocalDispatcher(executor, max_queue=settings.max_queue)
    server = TestServer(create_app(dispatcher, settings), host="127.0.0.1", port=free_port())
    await server.start_server()
    return server


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def service_url() -> AsyncIterator[str]:
    """Base URL of a running service (no preloads: it starts fast)."""
    server = await start_service(
        ExecutorSettings(servers=2, slots=SLOTS, preload=[]),
        ServerSettings(max_batch=64, max_body_bytes=4 << 20),
    )
    yield str(server.make_url("")).rstrip("/")
    await server.close()
