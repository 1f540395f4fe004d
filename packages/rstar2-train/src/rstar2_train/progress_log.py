"""A stage's progress as log lines for a log file: where stderr is not a terminal (or with
``--no-progress``), one line every N steps with steps done / total, elapsed time and ETA, instead
of a live display that such output cannot show or a line for every one of 1,000 steps."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import timedelta

from rich.console import Console

from rstar2_train.progress import Reporter, RichReporter, headline

logger = logging.getLogger("rstar2_train")

LINES_PER_RUN = 20
"""Default: a line about every 5% of the steps a run has left (and at its last step)."""


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class PeriodicReporter:
    """One log line every ``every`` steps (default: ``LINES_PER_RUN`` lines per run) and at the
    last step: steps done / total, elapsed time, ETA, and the step's headline metrics."""

    def __init__(
        self, every: int | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self._clock = clock
        self._description = ""
        self._total = self._first = self._interval = 0
        self._started = 0.0

    def start(self, description: str, total_steps: int, done: int) -> None:
        self._description, self._total, self._first = description, total_steps, done
        self._started = self._clock()
        # Per run: a reporter that starts another stage sizes the default to that one.
        self._interval = self.every or max(1, math.ceil((total_steps - done) / LINES_PER_RUN))
        logger.info(
            "%s: steps %d..%d, a progress line every %d steps",
            description,
            done + 1,
            total_steps,
            self._interval,
        )

    def phase(self, text: str) -> None:
        logger.debug("%s", text)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        assert self._interval, "start() first"
        if step % self._interval and step != self._total:
            return
        elapsed = self._clock() - self._started
        done_here = step - self._first
        eta = elapsed / done_here * (self._total - step) if done_here > 0 else math.nan
        logger.info(
            "%s: %d/%d steps (%.0f%%), elapsed %s, eta %s | %s",
            self._description,
            step,
            self._total,
            100 * step / max(self._total, 1),
            _duration(elapsed),
            _duration(eta) if math.isfinite(eta) else "-",
            headline(step, metrics),
        )

    def stop(self) -> None:
        pass


def stage_reporter(console: Console, *, live: bool, every: int | None = None) -> Reporter:
    """The live display where ``console`` is a terminal and ``live`` is asked for; otherwise a
    ``PeriodicReporter``."""
    if live and console.is_terminal:
        return RichReporter(console)
    return PeriodicReporter(every)
