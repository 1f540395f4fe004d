"""Atomic file output: readers never see a half-written report."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path``; it replaces ``path`` when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    os.close(descriptor)
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) atomically."""
    with atomic_output(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
