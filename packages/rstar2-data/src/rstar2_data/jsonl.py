"""JSONL and Parquet I/O: line-numbered read errors, atomic writes, deterministic bytes."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class DataFileError(ValueError):
    """A data file that cannot be read; the message names the file and, where known, the line."""

    def __init__(self, path: Path | str, reason: str, *, line: int | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.line = line
        super().__init__(f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}")


MAX_LINE_BYTES = 16 << 20
"""The longest JSONL line read (16 MiB, newline excluded): far above any real row, and a line
is refused before it is parsed, since parsing a JSON line takes many times its size in memory."""
_BOM = b"\xef\xbb\xbf"


def iter_jsonl_lines(
    path: Path, *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSONL file.

    Every problem is a ``DataFileError`` naming the line and what was expected: a line that is
    not UTF-8, longer than ``max_line_bytes`` (read no further than that), not JSON (with the
    column), or not an object. A UTF-8 byte order mark opening the file is skipped.
    """
    with path.open("rb") as handle:
        number = 0
        # readline with a limit: an over-long line is never held whole.
        while raw := handle.readline(max_line_bytes + 1):
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise DataFileError(
                    path,
                    f"line longer than {max_line_bytes:,} bytes, the most a line may hold; "
                    "expected one JSON object per line (raise the limit if such rows are real)",
                    line=number,
                )
            if number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFileError(
                    path,
                    f"invalid UTF-8 at byte {error.start + 1} of the line "
                    f"({raw[error.start : error.start + 4]!r}); expected UTF-8 text",
                    line=number,
                ) from None
            if not line.strip():
                continue
            yield number, _json_object(path, line, number)


def _json_object(path: Path, line: str, number: int) -> dict[str, Any]:
    try:
        value = loads_json_line(line)
    except json.JSONDecodeError as error:
        # error.msg alone drops the position; some messages end in "at" awaiting it.
        where = f"column {error.colno}" if error.msg.endswith(" at") else f"at column {error.colno}"
        raise DataFileError(
            path,
            f"invalid JSON: {error.msg} {where}; expected one JSON object per line",
            line=number,
        ) from None
    if not isinstance(value, dict):
        raise DataFileError(
            path, f"expected a JSON object, got {type(value).__name__}", line=number
        )
    return value


def loads_json_line(line: str | bytes) -> Any:
    """``json.loads``, keeping an integer literal too long for ``int`` as its digit string.

    Python refuses to convert more than ``sys.get_int_max_str_digits()`` digits (4,300 by
    default), so ``json.loads`` raises a bare ``ValueError`` on such a literal. Integer answers
    are digit strings throughout rstar2-data (``canonical_integer``), so the row is kept. The
    plain parse runs first: the hook costs a Python call per integer.
    """
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise
    except ValueError:
        return json.loads(line, parse_int=_int_or_digits)


def _int_or_digits(literal: str) -> int | str:
    limit = sys.get_int_max_str_digits()
    return literal if limit and len(literal.lstrip("-")) > limit else int(literal)


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line."""
    for _, value in iter_jsonl_lines(path):
        yield value


def read_models(path: Path, model: type[ModelT]) -> list[ModelT]:
    """Every line of a JSONL file validated as ``model``; errors name the line and field."""
    rows = []
    for number, value in iter_jsonl_lines(path):
        try:
            rows.append(model.model_validate(value))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<row>'}: {e['msg']}"
                for e in error.errors()
            )
            raise DataFileError(path, problems, line=number) from error
    return rows


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path next to ``path`` that replaces ``path`` when the block succeeds.

    Readers never see a half-written file, and a failed write leaves the old one in place. A new
    file gets the mode ``open`` would give it (0666 less the umask); a replaced one keeps its own.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(path)
    try:
        yield tmp
        if path.exists():  # a rewrite keeps the permissions the user gave the file
            tmp.chmod(stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _create_temporary(path: Path) -> Path:
    """A new empty file beside ``path`` with the mode any new file gets (0666 less the umask).

    ``tempfile.mkstemp`` would make it 0600, and ``os.replace`` keeps that mode: datasets and
    reports would be unreadable by the group and others whatever the umask allows.
    """
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # the names _create_temporary gives


def remove_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files ``atomic_output`` left in ``folder`` (a process killed
    mid-write cannot remove its own); the paths removed.

    Only for a folder no other process writes into at the same time (a build holds its
    folder's lock): another writer's temporary would go too.
    """
    if not folder.is_dir():
        return []
    found = [
        path for path in folder.iterdir() if _TEMPORARY.fullmatch(path.name) and path.is_file()
    ]
    for path in found:
        path.unlink(missing_ok=True)
    return found


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    """Records as JSONL: key order kept, UTF-8, one line each."""
    return b"".join(
        json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n" for record in records
    )
