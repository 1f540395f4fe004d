"""Where a command line's output goes: results (tables, final figures) on stdout, logs and
progress on stderr, and every line whole when the output is piped or redirected.

rich wraps lines at the terminal's width, and at 80 columns when the output is not a terminal,
so a log file or ``grep`` would see log lines and table rows cut in two. Piped or redirected (and
without ``COLUMNS`` set), these consoles never wrap text and give tables room for their natural
width, and log records go through a plain handler: one line per record.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console

PIPED_WIDTH = 1000
"""Columns a table may take when the output is not a terminal (rich's default there is 80)."""


def command_console(*, stderr: bool = False) -> Console:
    """stdout (results) or stderr (logs, progress, errors) as a command should write to it."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH)
    return console


def log_handler(console: Console) -> logging.Handler:
    """rich's handler in a terminal; elsewhere one plain line per record: time, level, message."""
    if console.is_terminal:
        from rich.logging import RichHandler

        return RichHandler(console=console, show_path=False)
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    return handler


def configure_logging(level: int | str, console: Console) -> None:
    """Log records at ``level`` and above to ``console`` (see ``log_handler``)."""
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level,
        format="%(message)s",
        handlers=[log_handler(console)],
        force=True,
    )
