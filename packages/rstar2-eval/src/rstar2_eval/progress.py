"""Live progress of an evaluation: rollouts done and accuracy so far, per problem set.

A rich progress bar with ETA in a terminal, or log lines (``--no-progress``, and inside a
trainer) every ``log_interval_s`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

logger = logging.getLogger(__name__)


@dataclass
class _Tally:
    total: int
    done: int = 0
    failed: int = 0
    graded: int = 0
    correct: int = 0

    def accuracy(self) -> str:
        return f"{100 * self.correct / self.graded:5.1f}%" if self.graded else "    -"


class LiveProgress:
    """Counts finished, failed and graded rollouts per set and shows them as they change."""

    def __init__(
        self,
        totals: Sequence[tuple[str, int]],
        *,
        bar: bool,
        console: Console | None = None,
        log_interval_s: float = 30.0,
    ) -> None:
        self._tallies = {name: _Tally(total) for name, total in totals}
        self._log_interval_s = log_interval_s
        self._last_log = time.monotonic()
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        if bar:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("acc {task.fields[accuracy]}"),
                TextColumn("failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console if console is not None else Console(stderr=True),
            )
            width = max(len(name) for name, _ in totals) if totals else 0
            for name, total in totals:
                self._tasks[name] = self._progress.add_task(
                    name.ljust(width), total=total, accuracy="    -", failed=0
                )

    def __enter__(self) -> LiveProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
        else:
            self.log()

    def resumed(self, name: str, count: int) -> None:
        """``count`` samples of ``name`` were already done before this call."""
        tally = self._tallies[name]
        tally.done += count
        if self._progress is not None:
            # Resumed work is not progress of this call: restarting the task keeps it out of
            # the ETA.
            self._progress.reset(self._tasks[name], total=tally.total, completed=tally.done)

    def finished(self, name: str, *, failed: bool = False) -> None:
        """One rollout of ``name`` ended (``failed``: without a usable sample)."""
        tally = self._tallies[name]
        if failed:
            tally.failed += 1
        else:
            tally.done += 1
        if self._progress is not None:
            self._progress.update(
                self._tasks[name], completed=tally.done + tally.failed, failed=tally.failed
            )
        self._maybe_log()

    def graded(self, name: str, correct: bool) -> None:
        """One sample of ``name`` got its grade."""
        tally = self._tallies[name]
        tally.graded += 1
        tally.correct += correct
        if self._progress is not None:
            self._progress.update(self._tasks[name], accuracy=tally.accuracy())

    def _maybe_log(self) -> None:
        if self._progress is None and time.monotonic() - self._last_log >= self._log_interval_s:
            self.log()

    def log(self) -> None:
        """One log line per set: rollouts done of total, failures, accuracy so far."""
        self._last_log = time.monotonic()
        for name, tally in self._tallies.items():
            logger.info(
                "%s: %d/%d rollouts done, %d failed, accuracy %s over %d graded",
                name,
                tally.done,
                tally.total,
                tally.failed,
                tally.accuracy().strip(),
                tally.graded,
            )
