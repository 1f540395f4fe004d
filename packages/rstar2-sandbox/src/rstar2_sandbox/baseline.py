"""``FreshInterpreterSandbox``: one new Python interpreter per call, as most code-execution services
do. It exists as the benchmark baseline: same limits as the fork-servers (rlimits, own session,
per-call working directory, minimal environment, unprivileged uid when root, wall-clock kill of the
group, output caps), but every call pays for interpreter start-up and its imports."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from rstar2_sandbox.executor.child import minimal_environment
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.executor.syscalls import can_read_python_as
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus

# A fresh interpreter maps about this much before user code runs (the fork-servers add their
# own mapped size the same way).
INTERPRETER_MAPPED_BYTES = 64 << 20


async def _read_capped(stream: asyncio.StreamReader, cap: int, over: asyncio.Event) -> bytes:
    data = bytearray()
    while chunk := await stream.read(1 << 16):
        room = cap - len(data)
        if len(chunk) > room:
            data += chunk[:room]
            over.set()
            break
        data += chunk
    return bytes(data)


class FreshInterpreterSandbox:
    """Runs each request in ``python -c`` (a new interpreter), ``slots`` at a time."""

    def __init__(self, settings: ExecutorSettings | None = None) -> None:
        self.settings = settings or ExecutorSettings()
        self._slots = asyncio.Semaphore(self.settings.total_slots)
        self._uids = list(range(self.settings.uid_base, self.settings.uid_base + 4096))
        # Like the fork-servers, runs get their own uid when root -- where that uid can reach the
        # interpreter at all (the fork-servers bind it into their mount namespace; this does not).
        self.drop_uid = (
            os.geteuid() == 0 and self.settings.isolate and can_read_python_as(self._uids[0])[0]
        )
        self._root = tempfile.mkdtemp(prefix="rstar2-baseline-")
        os.chmod(self._root, 0o711)

    async def run(self, request: RunRequest) -> RunResult:
        """Run one request in a fresh interpreter."""
        async with self._slots:
            uid = self._uids.pop() if self.drop_uid else None
            try:
                return await self._run(request, uid)
            finally:
                if uid is not None:
                    self._uids.append(uid)

    async def _run(self, request: RunRequest, uid: int | None) -> RunResult:
        workdir = tempfile.mkdtemp(dir=self._root)
        if uid is not None:
            os.chown(workdir, uid, uid)
        settings = self.settings
        cpu = math.ceil(request.timeout_s) + 1
        address_space = INTERPRETER_MAPPED_BYTES + (request.memory_mb << 20)

        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_FSIZE, (settings.max_file_bytes,) * 2)
            resource.setrlimit(resource.RLIMIT_NOFILE, (settings.max_open_files,) * 2)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if uid is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (settings.max_processes,) * 2)

        env = {**minimal_environment(), "HOME": workdir, "TMPDIR": workdir}
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            request.code,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=limits,
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stderr is not None
        over = asyncio.Event()
        cap = request.output_limit_bytes
        readers = asyncio.gather(
            _read_capped(process.stdout, cap, over), _read_capped(process.stderr, cap, over)
        )
        try:
            process.stdin.write(request.stdin.encode())
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        process.stdin.close()
        timed_out = False
        waiter = asyncio.ensure_future(process.wait())
        overflow = asyncio.ensure_future(over.wait())
        done, _ = await asyncio.wait(
            {waiter, overflow}, timeout=request.timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            timed_out = not over.is_set()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        overflow.cancel()
        code = await waiter
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = await readers
        wall = time.monotonic() - started
        shutil.rmtree(workdir, ignore_errors=True)
        if over.is_set():
            status = RunStatus.OUTPUT_LIMIT_EXCEEDED
        elif timed_out:
            status = RunStatus.TIMEOUT
        else:
            status = RunStatus.SUCCESS if code == 0 else RunStatus.RUNTIME_ERROR
        return RunResult(
            status=status,
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            stdout_truncated=over.is_set() and len(stdout) >= cap,
            stderr_truncated=over.is_set() and len(stderr) >= cap,
            wall_time_s=wall,
        )

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Run requests concurrently (``slots`` at a time); results in request order."""
        return list(await asyncio.gather(*(self.run(r) for r in requests)))

    async def aclose(self) -> None:
        """Remove the working directories' root."""
        shutil.rmtree(self._root, ignore_errors=True)
