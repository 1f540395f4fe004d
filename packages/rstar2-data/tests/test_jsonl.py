"""JSONL reads (integers of any length) and atomic writes: whole files only, and the permissions
any file the user writes would get."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rstar2_data.jsonl import (
    DataFileError,
    atomic_output,
    atomic_write_text,
    iter_jsonl_lines,
    jsonl_bytes,
)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_new_files_get_the_mode_the_umask_allows(tmp_path: Path, mask: int, expected: int) -> None:
    with umask(mask):
        atomic_write_text(tmp_path / "report.json", "{}\n")
        plain = tmp_path / "plain.txt"
        plain.write_text("x")  # what open() gives under the same umask
    assert mode(tmp_path / "report.json") == expected == mode(plain)


def test_a_rewrite_keeps_the_files_own_mode(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    with umask(0o022):
        atomic_write_text(path, "old\n")
        path.chmod(0o640)
        atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert mode(path) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    atomic_write_text(path, "old\n")

    def killed_mid_write() -> None:
        with atomic_output(path) as temporary:
            temporary.write_text("half")
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        killed_mid_write()
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_integer_literals_too_long_for_int_are_read_as_their_digits(tmp_path: Path) -> None:
    # json.loads raises a bare ValueError past Python's 4,300-digit int-string limit.
    huge, negative = "9" * 5000, "-" + "1" * 4301
    path = tmp_path / "rows.jsonl"
    path.write_text(
        f'{{"id": 1, "answer": 7}}\n{{"id": 2, "answer": {huge}, "parts": [{negative}, 3, 2.5]}}\n'
    )
    rows = list(iter_jsonl_lines(path))
    assert rows == [
        (1, {"id": 1, "answer": 7}),
        (2, {"id": 2, "answer": huge, "parts": [negative, 3, 2.5]}),
    ]
    # Kept as text, the row writes back (json.dumps of such an int would raise too).
    assert huge.encode() in jsonl_bytes(row for _, row in rows)


def test_a_malformed_line_still_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"answer": 1}\n{"answer": ' + "9" * 5000 + ",}\n")
    with pytest.raises(DataFileError, match=r"rows\.jsonl:2: invalid JSON"):
        list(iter_jsonl_lines(path))
