"""Every command's help at 80 columns: wrapped between words, never cut inside one."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rstar2_sandbox.cli import app


def words(text: str) -> set[str]:
    return set(text.split())


@pytest.mark.parametrize("command", [[], ["serve"], ["worker"], ["bench"]])
def test_help_fits_80_columns_without_cutting_a_word(command: list[str]) -> None:
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "--help"]).output
    wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, [*command, "--help"]).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    # A word cut to fit (or shortened with an ellipsis) is a word the wide help does not have.
    assert words(narrow) <= words(wide)
