"""JSONL and Parquet I/O: line-numbered read errors, atomic writes, deterministic bytes."""

from __future__ import annotations

import json
import os
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


def iter_jsonl_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = loads_json_line(line)
            except json.JSONDecodeError as error:
                raise DataFileError(path, f"invalid JSON: {error.msg}", line=number) from None
            if not isinstance(value, dict):
                raise DataFileError(
                    path, f"expected a JSON object, got {type(value).__name__}", line=number
                )
            yield number, value


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
