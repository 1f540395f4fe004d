"""One progress line per build stage: its name, rows done of the total where known, rows/s.

Lines stay on screen after their stage ends, so a finished build shows where its time went.
Each stage is also logged (``INFO``) with its rows, time and rate when it ends, for runs
without a terminal (``--no-progress``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

logger = logging.getLogger(__name__)


def rate(rows: float, seconds: float) -> str:
    """``12.3K rows/s``."""
    per_second = rows / seconds if seconds > 0 else 0.0
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if per_second >= scale:
            return f"{per_second / scale:.1f}{unit} rows/s"
    return f"{per_second:.0f} rows/s"


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        if not elapsed or not task.completed:
            return Text("")
        return Text(rate(task.completed, elapsed), style="progress.data.speed")


class Stage:
    """A running stage: ``advance`` by rows done (call it per batch, not per row)."""

    def __init__(self, progress: Progress, task: TaskID, name: str) -> None:
        self._progress, self._task, self.name = progress, task, name
        self.done = self._start = 0
        self._started = time.perf_counter()

    def advance(self, rows: int) -> None:
        self.done += rows
        self._progress.update(self._task, completed=self.done)

    def set_total(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def finish(self, note: str = "") -> None:
        seconds = time.perf_counter() - self._started
        task = self._progress.tasks[self._task]
        self._progress.update(
            self._task,
            total=task.total if task.total is not None else self.done,
            completed=self.done,
            description=f"{self.name}{note}",
        )
        self._progress.stop_task(self._task)
        rows = self.done - self._start
        logger.info(
            "%s%s: %d rows in %.1f s (%s)", self.name, note, rows, seconds, rate(rows, seconds)
        )


class Stages:
    """The progress display of one build; ``stage`` opens a line."""

    def __init__(self, *, enabled: bool, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            disable=not enabled,
            console=console or Console(stderr=True),
        )

    def __enter__(self) -> Stages:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)

    @contextmanager
    def stage(self, name: str, total: int | None = None, *, start: int = 0) -> Iterator[Stage]:
        """A line for stage ``name``; ``start`` rows already done (a resumed stage)."""
        task = self._progress.add_task(name, total=total, completed=start)
        stage = Stage(self._progress, task, name)
        stage.done = stage._start = start
        yield stage
        stage.finish()

    def reused(self, name: str, rows: int) -> None:
        """A line for a stage whose checkpoint was reused."""
        task = self._progress.add_task(f"{name} (reused)", total=rows, completed=rows)
        self._progress.stop_task(task)
        logger.info("%s: reused %d rows from the cache", name, rows)
