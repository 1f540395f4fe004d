"""A pool of grading worker processes with a hard wall-clock limit per item.

Each worker takes one item at a time. An item gets ``timeout_s`` inside its worker (an alarm
that math-verify cannot swallow); if the worker has not answered ``kill_grace_s`` after that
(stuck in C code that signals cannot interrupt, such as a huge integer power), the parent kills
it, reports the item as a timeout and starts a replacement. The other workers keep draining the
queue meanwhile, so one hostile answer costs one worker at most ``timeout_s + kill_grace_s``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import NamedTuple

from rstar2_eval.verification import math_verify_equal
from rstar2_eval.worker import READY, Verifier, VerifyStatus, serve

logger = logging.getLogger(__name__)


class GradingError(RuntimeError):
    """The pool itself failed (a worker could not start), as opposed to one item failing."""


class VerifyResult(NamedTuple):
    """A worker's verdict on one item."""

    status: VerifyStatus
    detail: str | None


@dataclass
class _Worker:
    process: BaseProcess
    connection: Connection
    start_deadline: float
    ready: bool = False
    key: int | None = None
    deadline: float = field(default=0.0)


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(timeout=5)
    worker.connection.close()


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        if worker.ready and worker.key is None and worker.process.is_alive():
            with contextlib.suppress(OSError):
                worker.connection.send(None)
    for worker in workers:
        worker.process.join(timeout=2)
        _stop(worker)
    workers.clear()


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
        self.replacements = 0
        self.started = False
        # spawn, not fork: the parent may hold threads, CUDA contexts or an event loop.
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def _start_worker(self) -> _Worker:
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve,
            args=(child_end, self.verifier, self.timeout_s, self.memory_limit_mb),
            name="rstar2-eval-grader",
            daemon=True,
        )
        process.start()
        child_end.close()
        return _Worker(process, parent_end, time.monotonic() + self.start_timeout_s)

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
                logger.warning(
                    "grading worker %s died while idle; replacing it", worker.process.pid
                )
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
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        if not worker.ready:
            _stop(worker)
            self._workers.remove(worker)
            raise GradingError(
                f"a grading worker exited with code {code} before it was ready; "
                "check that `python -c 'import math_verify'` works in this environment"
            )
        if worker.key is not None:
            logger.warning("grading worker died (exit code %s) on item %d", code, worker.key)
            finish(
                worker.key, VerifyResult("ungradable", f"grading worker died (exit code {code})")
            )
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
                _stop(worker)
                self._workers.remove(worker)
                raise GradingError(
                    f"a grading worker did not start within {self.start_timeout_s:g} s"
                )

    def close(self) -> None:
        """Stop every worker."""
        self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
