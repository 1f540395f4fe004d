"""How a running stage reports its steps: log lines from the library, a live display in the CLI."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

logger = logging.getLogger("rstar2_train")


class Reporter(Protocol):
    """Receives a stage's progress."""

    def start(self, description: str, total_steps: int, done: int) -> None: ...

    def phase(self, text: str) -> None:
        """What the stage is doing now (e.g. "rollouts 37/128")."""
        ...

    def step(self, step: int, metrics: dict[str, float]) -> None: ...

    def stop(self) -> None: ...


# Metrics shown on a step's line, in order, when present: (key, label, format).
HEADLINE: Sequence[tuple[str, str, str]] = (
    ("train/loss", "loss", ".4f"),
    ("val/loss", "val", ".4f"),
    ("reward/mean", "reward", ".3f"),
    ("groups/kept_fraction", "kept", ".2f"),
    ("tools/calls_per_rollout", "calls", ".2f"),
    ("tools/error_ratio_kept_positives", "err+", ".3f"),
    ("response/length_mean", "len", ".0f"),
    ("actor/grad_norm", "|g|", ".3f"),
    ("staleness/lag_mean", "lag", ".2f"),
    ("async/queue_groups", "queue", ".0f"),
    ("time/step_s", "s", ".1f"),
)


def headline(step: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}"]
    for key, label, fmt in HEADLINE:
        if key in metrics:
            parts.append(f"{label} {metrics[key]:{fmt}}")
    return "  ".join(parts)


class LogReporter:
    """One log line per step."""

    def start(self, description: str, total_steps: int, done: int) -> None:
        logger.info("%s: steps %d..%d", description, done + 1, total_steps)

    def phase(self, text: str) -> None:
        logger.debug("%s", text)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        logger.info("%s", headline(step, metrics))

    def stop(self) -> None:
        pass


class RichReporter:
    """A progress bar with ETA over the stage's steps, the current phase, and a line per step."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[phase]}"),
            console=self.console,
            transient=False,
        )
        self._task: int | None = None

    def start(self, description: str, total_steps: int, done: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(
            description, total=total_steps, completed=done, phase=""
        )

    def phase(self, text: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, phase=text)  # type: ignore[arg-type]

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=step, phase="")  # type: ignore[arg-type]
        self._progress.console.print(headline(step, metrics))

    def stop(self) -> None:
        self._progress.stop()
