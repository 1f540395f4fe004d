"""FittedTable: wide tables stay legible in narrow terminals, no word cut mid-way."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, RenderableType
from rich.table import Table

from rstar2_data.terminal import FittedTable, cut_words

HEADERS = [
    "benchmark", "problems", "samples", "avg@k %", "pass@k %", "maj@k %", "no answer",
    "timeout / ungradable", "fallback used (correct)", "resp tokens", "tool calls",
    "tool err %", "truncated %",
]  # fmt: skip
ROWS = [
    ["aime24", "30/30", "480 (k=16)", "80.6", "93.3 @16", "86.7 @16", "3", "0 / 1", "2 (1)",
     "12345", "4.21", "12.3", "0.4"],
    ["math500", "500/500", "8000 (k=16)", "97.1", "99.0 @16", "98.0 @16", "10", "1 / 0",
     "0 (0)", "5678", "2.10", "8.0", "0.1"],
]  # fmt: skip


def wide_table() -> Table:
    table = Table(title="rstar2-eval score", caption="k: samples per problem")
    for index, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if index == 0 else "right")
    for row in ROWS:
        table.add_row(*row)
    return table


def render(renderable: RenderableType, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 60, 40])
def test_a_wide_table_is_split_with_its_key_column_and_no_word_cut(width: int) -> None:
    narrow = render(FittedTable(wide_table()), width)
    wide = render(wide_table(), 1000)
    assert not cut_words(narrow, wide)
    assert max(len(line) for line in narrow.splitlines()) <= width
    # Every cell is there, each on one line, and every part names its rows by the key column.
    lines = narrow.splitlines()
    for row in ROWS:
        for cell in row[1:]:
            assert any(cell in line and row[0] in line for line in lines), cell
    assert narrow.count("rstar2-eval score") == narrow.count("benchmark") >= 2
    assert narrow.count("k: samples per problem") == 1


def test_plain_rich_cuts_the_words_that_fitting_keeps() -> None:
    assert cut_words(render(wide_table(), 80), render(wide_table(), 1000))


def test_a_table_that_fits_is_printed_as_it_is() -> None:
    assert render(FittedTable(wide_table()), 200) == render(wide_table(), 200)


def test_long_text_wraps_between_words() -> None:
    table = Table("name", "description")
    text = "A plumbing check of every stage on a CPU, with a long explanation " * 3
    table.add_row("tiny-rl", text)
    narrow = render(FittedTable(table), 80)
    assert not cut_words(narrow, render(table, 1000))
    assert " ".join(text.split()) in " ".join(narrow.replace("│", " ").split())
