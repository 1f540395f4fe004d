"""JSONL and Parquet I/O: line-numbered read errors, atomic writes, deterministic bytes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class DataFileError(ValueError):
    """A data file that cannot be read; the message names the file and line."""


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFileError(f"{path}:{number}: invalid JSON: {error.msg}") from error
            if not isinstance(value, dict):
                raise DataFileError(f"{path}:{number}: expected a JSON object per line")
            yield value


def read_models(path: Path, model: type[ModelT]) -> list[ModelT]:
    """Every line of a JSONL file validated as ``model``; errors name the line and field."""
    rows = []
    for number, value in enumerate(iter_jsonl(path), start=1):
        try:
            rows.append(model.model_validate(value))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<row>'}: {e['msg']}"
                for e in error.errors()
            )
            raise DataFileError(f"{path}: record {number}: {problems}") from error
    return rows


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    """Records as JSONL: key order kept, UTF-8, one line each."""
    return b"".join(
        json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n" for record in records
    )
