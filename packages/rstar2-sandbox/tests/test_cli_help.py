"""Every command's help and the bench table at 80 columns: wrapped between words, never cut
inside one."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from rstar2_sandbox.cli import app

from .conftest import start_serve  # type: ignore[import-not-found]


def words(text: str) -> set[str]:
    return set(text.split())


@pytest.mark.parametrize("command", [[], ["serve"], ["worker"], ["bench"]])
def test_help_fits_80_columns_without_cutting_a_word(command: list[str]) -> None:
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "--help"]).output
    wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, [*command, "--help"]).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    # A word cut to fit (or shortened with an ellipsis) is a word the wide help does not have.
    assert words(narrow) <= words(wide)


@pytest.fixture
def served() -> Iterator[str]:
    """``rstar2-sandbox serve`` in its own process (one fork-server, no preloads) until the test
    ends; its base URL."""
    url, server = start_serve("--servers", "1", "--preload", "", "--log-level", "ERROR")
    try:
        yield url
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)


def test_bench_table_fits_80_columns_without_cutting_a_word(served: str) -> None:
    options = ["--sequential-calls", "5", "--batch-calls", "20", "--batch-size", "4"]
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        app, ["bench", "--url", served, "--snippets", "trivial,stdlib", *options]
    )
    assert result.exit_code == 0, result.output
    assert "snippet" in result.stdout  # the table is the result; progress goes to stderr
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.output
    header = next(line for line in lines if "snippet" in line).split()
    assert header == [
        "snippet", "mode", "conc.", "calls", "failed", "calls/s", "p50", "ms", "p90", "ms",
        "p99", "ms",
    ]  # fmt: skip
    rows = [line.split() for line in lines if line.split()[:1] in (["trivial"], ["stdlib"])]
    assert [row[:2] for row in rows] == [
        ["trivial", "sequential"], ["trivial", "batch"], ["stdlib", "sequential"],
        ["stdlib", "batch"],
    ]  # fmt: skip
    assert all(len(row) == len(header) - 3 for row in rows)
