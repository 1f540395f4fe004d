"""Writing and reading built datasets (JSONL or Parquet) of ``MathProblem``/``ChatExample`` rows.

Parquet stores the nested fields (metadata, messages, tools) as JSON text, so rows with
different shapes share one column type.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rstar2_data.converters.base import RowKind
from rstar2_data.filters.base import Row
from rstar2_data.jsonl import DataFileError, iter_jsonl_lines, jsonl_bytes, loads_json_line
from rstar2_data.schemas import ChatExample, MathProblem

_NESTED: dict[RowKind, tuple[str, ...]] = {"math": ("metadata",), "chat": ("messages", "tools")}
ROW_MODELS: dict[RowKind, type[MathProblem] | type[ChatExample]] = {
    "math": MathProblem,
    "chat": ChatExample,
}
PARQUET_ROW_GROUP = 65_536
"""Rows per Parquet row group (and per batch a build holds while writing Parquet)."""


def _record(row: Row) -> dict[str, Any]:
    return row.model_dump(mode="json", exclude_none=True)


def parse_row(line: str | bytes, kind: RowKind) -> Row:
    """One JSON line of a built dataset (or a build's cache) as a row."""
    model = ROW_MODELS[kind]
    try:
        return model.model_validate_json(line)
    except ValidationError:
        # json.loads keeps integers too long for int() as digits; pydantic's parser does not.
        return model.model_validate(loads_json_line(line))


def parquet_table(records: Iterable[dict[str, Any]], kind: RowKind) -> Any:
    """Records (``model_dump(mode="json")`` of rows) as a ``pyarrow.Table`` of text columns."""
    # pyarrow is imported where used: it would add ~0.4 s to every `import rstar2_data`.
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints

    fields = list(ROW_MODELS[kind].model_fields)
    columns: dict[str, list[Any]] = {name: [] for name in fields}
    for record in records:
        for name in fields:
            value = record.get(name)
            columns[name].append(
                json.dumps(value, ensure_ascii=False) if name in _NESTED[kind] else value
            )
    return pa.table({name: pa.array(values, type=pa.string()) for name, values in columns.items()})


def rows_bytes(rows: Sequence[Row], *, kind: RowKind, fmt: str) -> bytes:
    """The file contents of ``rows`` in ``fmt`` ("jsonl" or "parquet")."""
    if fmt == "jsonl":
        return jsonl_bytes(_record(row) for row in rows)
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

    buffer = io.BytesIO()
    with pq.ParquetWriter(buffer, parquet_table([], kind).schema) as writer:
        for start in range(0, len(rows), PARQUET_ROW_GROUP):
            chunk = rows[start : start + PARQUET_ROW_GROUP]
            writer.write_table(parquet_table((_record(row) for row in chunk), kind))
    return buffer.getvalue()


def read_rows(path: Path, *, kind: RowKind) -> list[Row]:
    """Rows of a built ``data.jsonl`` or ``data.parquet``, validated against their schema;
    errors name the JSONL line or the Parquet row (1-based)."""
    model = ROW_MODELS[kind]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
        for record in records:
            for name in _NESTED[kind]:
                record[name] = json.loads(record[name])
        out: list[Row] = []
        for number, record in enumerate(records, start=1):
            try:
                out.append(model.model_validate(record))
            except ValueError as error:
                raise DataFileError(path, f"row {number}: {error}") from error
        return out
    out = []
    for number, record in iter_jsonl_lines(path):
        try:
            out.append(model.model_validate(record))
        except ValueError as error:
            raise DataFileError(path, str(error), line=number) from error
    return out
