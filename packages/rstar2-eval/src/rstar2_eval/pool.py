"""A pool of grading worker processes with a hard wall-clock limit per item.

Each worker takes one item at a time. An item gets ``timeout_s`` inside its worker (an alarm
that math-verify cannot swallow); if the worker has not answered ``kill_grace_s`` after that
(stuck in C code that signals cannot interrupt, such as a huge integer power), the parent kills
it, reports the item as a timeout and starts a replacement. The other workers keep draining the
queue meanwhile, so one hostile answer costs one worker at most ``timeout_s + kill_grace_s``.

Workers are fresh interpreters (``sys.executable -c worker.BOOT``), not ``multiprocessing``
children: the ``spawn`` start method re-runs the caller's main module in every worker, which
breaks unguarded scripts, ``python -`` and notebooks, and ``fork`` is unsafe in a process holding
threads or an event loop. A worker that dies is reported with its exit status and the end of its
own output (its traceback).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import IO, NamedTuple

from rstar2_eval.verification import math_verify_equal
from rstar2_eval.worker import (
    BOOT,
    READY,
    Verifier,
    VerifyStatus,
    WorkerSetup,
    verifier_reference,
)

logger = logging.getLogger(__name__)


class GradingError(RuntimeError):
    """The pool itself failed (a worker could not start), as opposed to one item failing."""


class VerifyResult(NamedTuple):
    """A worker's verdict on one item."""

    status: VerifyStatus
    detail: str | None


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    connection: Connection
    log: IO[bytes]
    start_deadline: float
    ready: bool = False
    key: int | None = None
    deadline: float = field(default=0.0)

    def wait(self, timeout: float) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        return self.process.returncode

    def exit_status(self) -> str:
        code = self.wait(5)
        if code is None:
            return "is still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def output_tail(self, limit: int = 2000) -> str:
        """The end of what the worker wrote to stdout and stderr (its traceback, if any)."""
        with contextlib.suppress(OSError, ValueError):
            self.log.flush()
            self.log.seek(0, 2)
            size = self.log.tell()
            self.log.seek(max(0, size - limit))
            return self.log.read().decode("utf-8", "replace").strip()
        return ""


def _stop(worker: _Worker) -> None:
    if worker.process.poll() is None:
        worker.process.kill()
    worker.wait(5)
    worker.connection.close()
    worker.log.close()


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        if worker.ready and worker.key is None and worker.process.poll() is None:
            with contextlib.suppress(OSError):
                worker.connection.send(None)
    for worker in workers:
        worker.wait(2)
        _stop(worker)
    workers.clear()


def _failure(worker: _Worker, what: str) -> str:
    """``what`` happened to ``worker``: its exit status, its last line and its output's end."""
    tail = worker.output_tail()
    last = tail.splitlines()[-1] if tail else "no output"
    status = worker.exit_status()
    message = f"a grading worker (pid {worker.process.pid}) {status} {what}: {last}"
    return f"{message}\n--- worker output (end) ---\n{tail}" if tail else message


def _no_item_in_flight(key: int, result: VerifyResult) -> None:
    raise RuntimeError(f"result for item {key} arrived outside verify(): {result}")


class VerifierPool:
    """Worker processes that run a verifier (math-verify by default) on ``(answer, gold)`` items.

    Workers start lazily on the first call and are reused until ``close()``. Not thread-safe:
    one call at a time (``Grader`` serializes its callers).
    """

    def __init__(
        self,
        workers: int,
        timeout_s: float,
        *,
        kill_grace_s: float = 1.0,
        memory_limit_mb: int | None = 2048,
        start_timeout_s: float = 120.0,
        verifier: Verifier = math_verify_equal,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.size = workers
        self.timeout_s = timeout_s
        self.kill_grace_s = kill_grace_s
        self.memory_limit_mb = memory_limit_mb
        self.start_timeout_s = start_timeout_s
        self.verifier = verifier
        self._setup = WorkerSetup(*verifier_reference(verifier), timeout_s, memory_limit_mb)
        self.replacements = 0
        self.started = False
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def _start_worker(self) -> _Worker:
        if not sys.executable:
            raise GradingError("cannot start grading workers: sys.executable is not set")
        ours, theirs = socket.socketpair()
        # Closed by _stop, with the worker.
        log = tempfile.TemporaryFile(prefix="rstar2-eval-grader-")  # noqa: SIM115
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", BOOT, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as error:
            ours.close()
            log.close()
            raise GradingError(f"cannot start a grading worker: {error}") from error
        finally:
            theirs.close()
        connection = Connection(ours.detach())
        worker = _Worker(process, connection, log, time.monotonic() + self.start_timeout_s)
        try:
            connection.send(list(sys.path))
            connection.send(tuple(self._setup))
        except OSError:
            pass  # it died at once: the first wait on its connection reports why
        return worker

    def _replace(self, worker: _Worker) -> None:
        _stop(worker)
        self._workers[self._workers.index(worker)] = self._start_worker()
        self.replacements += 1

    def start(self, *, wait: bool = False) -> None:
        """Start missing workers; with ``wait``, block until every worker is warm."""
        if not self._finalizer.alive:
            self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        while len(self._workers) < self.size:
            self._workers.append(self._start_worker())
        self.started = True
        while wait and not all(worker.ready for worker in self._workers):
            self._collect(_no_item_in_flight)
            self._enforce_deadlines(_no_item_in_flight)

    def verify(
        self,
        items: Sequence[tuple[str, str]],
        on_result: Callable[[int, VerifyResult], None] | None = None,
    ) -> list[VerifyResult]:
        """Verdicts for ``(answer, gold)`` items, in order; ``on_result`` hears each as it lands."""
        results: list[VerifyResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        remaining = len(items)

        def finish(key: int, result: VerifyResult) -> None:
            nonlocal remaining
            results[key] = result
            remaining -= 1
            if on_result is not None:
                on_result(key, result)

        self.start()
        try:
            while remaining:
                self._dispatch(items, pending)
                self._collect(finish)
                self._enforce_deadlines(finish)
        finally:
            if remaining:
                # Interrupted: in-flight answers must not leak into the next call.
                for worker in list(self._workers):
                    if worker.key is not None:
                        self._replace(worker)
        return [result for result in results if result is not None]

    def _dispatch(self, items: Sequence[tuple[str, str]], pending: deque[int]) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if not pending:
                return
            if not worker.ready or worker.key is not None:
                continue
            key = pending.popleft()
            try:
                worker.connection.send((key, *items[key]))
            except OSError:
                pending.appendleft(key)
                logger.warning("%s", _failure(worker, "while idle"))
                self._replace(worker)
                continue
            worker.key = key
            worker.deadline = now + self.timeout_s + self.kill_grace_s

    def _collect(self, finish: Callable[[int, VerifyResult], None]) -> None:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.key is not None]
        deadlines += [w.start_deadline for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        by_connection = {w.connection: w for w in self._workers}
        for connection in wait(list(by_connection), timeout=timeout):
            worker = by_connection[connection]  # type: ignore[index]
            try:
                message = worker.connection.recv()
            except (EOFError, OSError):
                self._on_death(worker, finish)
                continue
            if message == READY:
                worker.ready = True
                continue
            key, status, detail = message
            worker.key = None
            finish(key, VerifyResult(status, detail))

    def _on_death(self, worker: _Worker, finish: Callable[[int, VerifyResult], None]) -> None:
        if not worker.ready:
            message = _failure(worker, "before it was ready")
            _stop(worker)
            self._workers.remove(worker)
            raise GradingError(message)
        if worker.key is not None:
            message = _failure(worker, f"on item {worker.key}")
            logger.warning("%s", message)
            finish(worker.key, VerifyResult("ungradable", message.splitlines()[0]))
        else:
            logger.warning("%s", _failure(worker, "while idle"))
        self._replace(worker)

    def _enforce_deadlines(self, finish: Callable[[int, VerifyResult], None]) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.key is not None and now >= worker.deadline:
                key = worker.key
                logger.warning("killing grading worker %s: item %d hung", worker.process.pid, key)
                self._replace(worker)
                finish(
                    key,
                    VerifyResult(
                        "timeout", f"killed after {self.timeout_s + self.kill_grace_s:g} s"
                    ),
                )
            elif not worker.ready and now >= worker.start_deadline:
                tail = worker.output_tail()
                _stop(worker)
                self._workers.remove(worker)
                raise GradingError(
                    f"a grading worker did not start within {self.start_timeout_s:g} s"
                    + (f"; its output ends with:\n{tail}" if tail else "")
                )

    def close(self) -> None:
        """Stop every worker."""
        self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
