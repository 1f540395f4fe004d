"""PeriodicReporter: a progress line every N steps (and at the last), with elapsed time and ETA."""

from __future__ import annotations

import logging

import pytest

from rstar2_train.progress_log import PeriodicReporter


def progress_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if " steps (" in r.getMessage()]
    caplog.clear()
    return lines


def test_lines_every_n_steps_with_eta(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    reporter = PeriodicReporter(3, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="rstar2_train"):
        reporter.start("sft x", total_steps=7, done=0)
        for step in range(1, 8):
            now[0] = 10.0 * step
            reporter.step(step, {"loss": 1.0})
    lines = progress_lines(caplog)
    assert [line.split(": ")[1].split(" steps")[0] for line in lines] == ["3/7", "6/7", "7/7"]
    assert "elapsed 0:00:30, eta 0:00:40" in lines[0]
    assert "eta 0:00:00" in lines[-1]


def test_the_default_interval_is_sized_to_each_run(caplog: pytest.LogCaptureFixture) -> None:
    """One reporter over two stages: each gets about 20 lines, not the first stage's interval."""
    reporter = PeriodicReporter()
    with caplog.at_level(logging.INFO, logger="rstar2_train"):
        for total in (40, 400):
            reporter.start("stage", total_steps=total, done=0)
            for step in range(1, total + 1):
                reporter.step(step, {})
            assert len(progress_lines(caplog)) == 20
