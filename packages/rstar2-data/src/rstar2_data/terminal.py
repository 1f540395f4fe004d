"""Tables that stay legible in a narrow terminal: cells wrap between words, never inside one.

rich fits an over-wide table by shrinking its widest columns, which cuts words and numbers
mid-way in an 80-column terminal. ``FittedTable`` keeps every cell on one line and wraps only
headers, between words; when the columns do not fit that way side by side, it prints them as
several tables, one under the other, each with the table's title and its key (first) column, as
pandas prints a wide frame. Only a column too wide for the terminal on its own wraps its cells,
between words too where it can.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import NamedTuple

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table

# Box-drawing characters (U+2500-U+257F): borders, not words.
_BORDERS = re.compile("[\u2500-\u257f]")


class FittedTable:
    """A rich renderable: ``table`` fitted to the width it is printed at (see the module)."""

    def __init__(self, table: Table, *, key_columns: int = 1) -> None:
        self.table = table
        self.key_columns = key_columns

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table
        ranges = [_content_range(console, options, table, column) for column in table.columns]
        width = options.max_width
        if sum(r.longest_line for r in ranges) + _overhead(console, options, table) <= width:
            yield table  # rich prints it at its natural widths
            return
        keys = list(range(min(self.key_columns, len(ranges))))

        def fits(indices: list[int]) -> bool:
            overhead = _overhead(console, options, _part(table, indices, last=False))
            return sum(ranges[i].one_line_cells for i in indices) + overhead <= width

        # Key columns, then as many more as fit whole words side by side; a lone column too
        # wide for the terminal still gets a table of its own.
        groups: list[list[int]] = []
        current: list[int] = []
        for index in range(len(keys), len(ranges)):
            if current and not fits([*keys, *current, index]):
                groups.append(current)
                current = []
            current.append(index)
        groups.append(current)
        for number, group in enumerate(groups):
            indices = [*keys, *group]
            part = _part(table, indices, last=number == len(groups) - 1)
            room = width - _overhead(console, options, part)
            shares = _share([ranges[i] for i in indices], room)
            for column, share in zip(part.columns, shares, strict=True):
                column.width = share
            yield part


def cut_words(narrow: str, wide: str) -> set[str]:
    """Words of the narrow rendering of some output that its wide rendering does not have:
    the pieces of words cut mid-way (or shortened with an ellipsis) to fit the narrow width."""

    def words(text: str) -> set[str]:
        return set(_BORDERS.sub(" ", text).split())

    return words(narrow) - words(wide)


class _Range(NamedTuple):
    """Content widths of a column (padding excluded)."""

    longest_word: int  # below this, words are cut
    one_line_cells: int  # every cell on one line, the header wrapped between words
    longest_line: int  # nothing wrapped


def _content_range(
    console: Console, options: ConsoleOptions, table: Table, column: Column
) -> _Range:
    cells = [Measurement.get(console, options, cell) for cell in column.cells]
    headers = [
        Measurement.get(console, options, text)
        for text, shown in ((column.header, table.show_header), (column.footer, table.show_footer))
        if shown
    ]
    every = cells + headers
    word = max((m.minimum for m in every), default=1)
    line = max((m.maximum for m in every), default=1)
    one_line = max([m.maximum for m in cells] + [m.minimum for m in headers], default=1)
    if column.no_wrap:
        word = one_line = line
    return _Range(max(word, 1), max(one_line, 1), max(line, 1))


def _overhead(console: Console, options: ConsoleOptions, table: Table) -> int:
    """Columns of the table that are not cell content: borders, separators and padding."""
    bare = copy.copy(table)
    bare.columns = [dataclasses.replace(column, width=0) for column in table.columns]
    bare.expand = False
    bare.min_width = None
    return Measurement.get(console, options.update(max_width=10**6), bare).maximum


def _share(ranges: list[_Range], room: int) -> list[int]:
    """Widths from each column's one-line cells up (or, where those do not fit, from its
    longest word up), the room left shared in proportion to what each column lacks of its
    longest line."""
    widths = [r.one_line_cells for r in ranges]
    if sum(widths) > room:
        widths = [r.longest_word for r in ranges]
    lacking = [r.longest_line - w for r, w in zip(ranges, widths, strict=True)]
    spare = room - sum(widths)
    if spare <= 0 or not any(lacking):
        return widths
    total = sum(lacking)
    given = [min(need, spare * need // total) for need in lacking]
    widths = [w + g for w, g in zip(widths, given, strict=True)]
    spare -= sum(given)
    # What integer division left over goes to the columns that lack the most.
    for index in sorted(range(len(ranges)), key=lambda i: lacking[i] - given[i], reverse=True):
        if spare <= 0:
            break
        if given[index] < lacking[index]:
            widths[index] += 1
            spare -= 1
    return widths


def _part(table: Table, indices: list[int], *, last: bool) -> Table:
    """A copy of ``table`` with the columns at ``indices`` (the caption only on the last)."""
    part = copy.copy(table)
    part.columns = [
        dataclasses.replace(table.columns[index], _index=position)
        for position, index in enumerate(indices)
    ]
    part.expand = False
    if not last:
        part.caption = None
    return part
