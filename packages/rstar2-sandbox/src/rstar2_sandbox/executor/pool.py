"""``ExecutorPool``: fork-servers behind one async ``run``, with slot accounting and restarts."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.executor.child import THREAD_VARS
from rstar2_sandbox.executor.routing import needs_preloads
from rstar2_sandbox.executor.settings import ExecutorSettings, ForkServerConfig
from rstar2_sandbox.executor.wire import MESSAGE, request_frame, result_streams
from rstar2_sandbox.isolation import IsolationReport
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus

log = logging.getLogger(__name__)

# A fork-server enforces every run's wall-clock limit itself; this only catches a stuck server.
WATCHDOG_GRACE_S = 30.0
START_TIMEOUT_S = 120.0


class ForkServerInfo(BaseModel):
    """What a fork-server reported when it became ready."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    # The process its runs fork from, as the fork-server's own PID namespace numbers it.
    template_pid: int
    preloaded: list[str]
    failed_preloads: dict[str, str] = Field(default_factory=dict)
    isolation: IsolationReport


class SandboxStartError(RuntimeError):
    """A fork-server could not start; the message names the cause and what to do about it."""


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``; none when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _innermost_pid(pid: int) -> int | None:
    """``pid`` as the innermost PID namespace it is in numbers it (the last of ``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return None


def _internal_error(message: str) -> RunResult:
    return RunResult(status=RunStatus.INTERNAL_ERROR, stderr=message)


def _server_environment() -> dict[str, str]:
    """The fork-server's whole environment: nothing secret, since runs could read it back."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(dict.fromkeys(THREAD_VARS, "1"))
    return env


class ForkServerProcess:
    """One fork-server subprocess and the calls in flight on it."""

    def __init__(self, index: int, slot_uids: list[int], settings: ExecutorSettings) -> None:
        self.index = index
        self.config = ForkServerConfig(
            index=index,
            slot_uids=slot_uids,
            settings=settings,
            sys_path=[p for p in sys.path if p],
            parent_pid=os.getpid(),
        )
        self.process: asyncio.subprocess.Process | None = None
        self.info: ForkServerInfo | None = None
        self.pending: dict[int, asyncio.Future[RunResult]] = {}
        self._ids = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.restarts = 0

    async def start(self) -> ForkServerInfo:
        """Spawn the process, send its configuration and wait until it has preloaded."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rstar2_sandbox.executor.forkserver",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_server_environment(),
            cwd="/",
            # Own session: a Ctrl-C meant for the server does not hit the fork-servers directly.
            start_new_session=True,
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(request_frame(self.config.model_dump(mode="json")))
        frame = await asyncio.wait_for(self._read_frame(), START_TIMEOUT_S)
        if frame is None:
            code = await self.process.wait()
            raise SandboxStartError(
                f"fork-server {self.index} exited with {code} during start, before it could say "
                "why (its log, on this process's stderr, has the traceback)"
            )
        hello = json.loads(frame[0])
        if "error" in hello:
            await self.process.wait()
            raise SandboxStartError(f"fork-server {self.index} could not start: {hello['error']}")
        self.info = ForkServerInfo.model_validate(hello)
        for name, error in self.info.failed_preloads.items():
            log.warning("fork-server %d could not preload %s: %s", self.index, name, error)
        self._reader = asyncio.create_task(self._read_results())
        self.ready.set()
        return self.info

    async def _read_frame(self) -> tuple[bytes, bytearray] | None:
        """The next message from the fork-server: its JSON and its raw bytes (see ``wire``)."""
        assert self.process is not None
        stdout = self.process.stdout
        assert stdout is not None
        try:
            json_bytes, raw_bytes = MESSAGE.unpack(await stdout.readexactly(MESSAGE.size))
            data = await stdout.readexactly(json_bytes)
            # Filled in place: ``readexactly`` would copy the buffered bytes once or twice more.
            raw = bytearray(raw_bytes)
            filled = 0
            while filled < raw_bytes:
                chunk = await stdout.read(raw_bytes - filled)
                if not chunk:
                    return None
                raw[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return data, raw

    async def _read_results(self) -> None:
        while (frame := await self._read_frame()) is not None:
            message = json.loads(frame[0])
            result = result_streams(message["result"], frame[1])
            # Not kept while waiting for the next frame: a result can hold megabytes of output.
            del frame
            future = self.pending.pop(int(message["id"]), None)
            if future is not None and not future.done():
                future.set_result(RunResult.model_validate(result))
            del message, result
        self.ready.clear()
        for future in self.pending.values():
            if not future.done():
                future.set_result(_internal_error("the fork-server running this call died"))
        self.pending.clear()

    async def call(
        self, slot: int, request: RunRequest, ended: Callable[[], None] = lambda: None
    ) -> RunResult:
        """Run ``request`` in local slot ``slot`` (which the caller holds).

        ``ended`` is called once the run is over, also when the caller stopped waiting for it
        (cancelled): only then may the slot, and its uid, serve another run.
        """
        process = self.process
        if process is None or process.stdin is None or not self.ready.is_set():
            ended()
            return _internal_error("fork-server is not running")
        call_id = next(self._ids)
        future: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda _: ended())
        self.pending[call_id] = future
        message = {"id": call_id, "slot": slot, "request": request.model_dump()}
        try:
            process.stdin.write(request_frame(message))
        except Exception as exc:
            del self.pending[call_id]
            future.set_result(_internal_error(f"could not send the call: {exc}"))
        try:
            return await asyncio.wait_for(
                asyncio.shield(future), request.timeout_s + WATCHDOG_GRACE_S
            )
        except TimeoutError:
            log.error("fork-server %d stuck on call %d; restarting it", self.index, call_id)
            self.kill()
            return await future

    def kill(self) -> None:
        """Kill the process (its runs die with it: they hold a parent-death signal)."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()

    async def stop(self) -> None:
        """Close the control pipe (the fork-server kills its runs and exits), then wait."""
        process = self.process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await self._reader


@dataclass
class _Tier:
    """Fork-servers sharing one preload list, with their free slots."""

    name: str
    servers: list[ForkServerProcess]
    slots: int
    free: asyncio.Queue[tuple[int, int]] = field(default_factory=asyncio.Queue)


class ExecutorPool:
    """Runs requests on fork-servers (one per core by default), each run in its own slot.

    A slot is a run in flight; with root, each slot has its own unprivileged uid, which makes
    killing everything a run started exact. ``run`` waits for a free slot. With preloads and
    ``lean_tier`` on, a second set of fork-servers without preloads serves code that imports only
    the standard library, which forks about three times cheaper.
    """

    def __init__(self, settings: ExecutorSettings | None = None) -> None:
        self.settings = settings or ExecutorSettings()
        per_tier = self.settings.total_slots
        self._tiers = [self._tier("preloaded", self.settings, 0, 0)]
        if self.settings.lean_tier and self.settings.preload:
            lean = self.settings.model_copy(update={"preload": []})
            self._tiers.append(self._tier("lean", lean, 1, per_tier))
        self._servers = [server for tier in self._tiers for server in tier.servers]
        self._supervisor: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self.busy = 0

    @staticmethod
    def _tier(name: str, settings: ExecutorSettings, number: int, first_slot: int) -> _Tier:
        total = settings.total_slots
        count = min(settings.servers, total)
        base = settings.uid_base + first_slot
        # Slot i lives on fork-server i % count; a free-slot FIFO then spreads load evenly.
        servers = [
            ForkServerProcess(
                number * settings.servers + index,
                [base + slot for slot in range(index, total, count)],
                settings,
            )
            for index in range(count)
        ]
        return _Tier(name, servers, total)

    @property
    def slots(self) -> int:
        """Runs that can be in flight at once (over all tiers)."""
        return sum(tier.slots for tier in self._tiers)

    @property
    def servers(self) -> int:
        """Fork-servers in the pool."""
        return len(self._servers)

    @property
    def isolation(self) -> IsolationReport:
        """Which isolation features are active (in every fork-server)."""
        return IsolationReport.merge([s.info.isolation for s in self._servers if s.info])

    @property
    def preloaded(self) -> list[str]:
        """Modules every fork-server of the preloaded tier has imported."""
        infos = [s.info for s in self._tiers[0].servers if s.info]
        if not infos:
            return []
        return [m for m in infos[0].preloaded if all(m in i.preloaded for i in infos)]

    @property
    def server_pids(self) -> list[int]:
        """Process ids of the running fork-servers (each the first process of its own PID
        namespace, where it has one; the process started for it only waits for it)."""
        return [
            s.info.pid
            for s in self._servers
            if s.info and s.process and s.process.returncode is None
        ]

    @property
    def template_pids(self) -> list[int]:
        """Process ids of the running fork-servers' templates (the processes their runs fork
        from, each a child of its fork-server), as this process numbers them."""
        found = []
        for server in self._servers:
            info = server.info
            if info and server.process and server.process.returncode is None:
                found += [
                    child
                    for child in _children(info.pid)
                    if _innermost_pid(child) == info.template_pid
                ]
        return found

    @property
    def live_servers(self) -> int:
        """Fork-servers ready to take calls."""
        return sum(1 for s in self._servers if s.ready.is_set())

    @property
    def restarts(self) -> int:
        """Fork-servers restarted after dying."""
        return sum(s.restarts for s in self._servers)

    async def start(self) -> None:
        """Start every fork-server and wait until all are ready."""
        for tier in self._tiers:
            count = len(tier.servers)
            for slot in range(tier.slots):
                tier.free.put_nowait((slot % count, slot // count))
        try:
            await asyncio.gather(*(s.start() for s in self._servers))
        except BaseException:
            await self.close()
            raise
        self._started = True
        self._supervisor = asyncio.create_task(self._supervise())
        log.info(
            "executor pool: %s; preloaded %s",
            ", ".join(f"{t.name}: {len(t.servers)} servers, {t.slots} slots" for t in self._tiers),
            self.preloaded,
        )

    async def _supervise(self) -> None:
        """Restart any fork-server that dies."""
        while not self._closing:
            for server in self._servers:
                process = server.process
                if process is not None and process.returncode is not None and not self._closing:
                    code = process.returncode
                    log.error("fork-server %d exited with %s; restarting", server.index, code)
                    if server._reader is not None:
                        await server._reader
                    server.restarts += 1
                    try:
                        await server.start()
                    except Exception:
                        log.exception("restarting fork-server %d failed", server.index)
            await asyncio.sleep(0.2)

    def tier_for(self, request: RunRequest) -> str:
        """The name of the tier that would run ``request``."""
        if len(self._tiers) > 1 and not needs_preloads(request.code):
            return self._tiers[1].name
        return self._tiers[0].name

    async def run(self, request: RunRequest) -> RunResult:
        """Run one request in the next free slot of its tier."""
        if not self._started or self._closing:
            raise RuntimeError("ExecutorPool is not started (use start() or `async with`)")
        tier = next(t for t in self._tiers if t.name == self.tier_for(request))
        server_index, slot = await tier.free.get()
        self.busy += 1

        def release() -> None:
            self.busy -= 1
            tier.free.put_nowait((server_index, slot))

        try:
            server = tier.servers[server_index]
            if not server.ready.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(server.ready.wait(), START_TIMEOUT_S)
        except BaseException:
            release()
            raise
        # The slot is released when the run has ended, even if this caller stops waiting
        # (cancelled, say its client went away): no two runs ever share a slot.
        return await server.call(slot, request, release)

    async def close(self) -> None:
        """Stop every fork-server; their runs are killed."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await asyncio.gather(*(s.stop() for s in self._servers), return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
