"""Writing and reading built datasets (JSONL or Parquet) of ``MathProblem``/``ChatExample`` rows.

Parquet stores the nested fields (metadata, messages, tools) as JSON text, so rows with
different shapes share one column type.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_data.converters.base import RowKind
from rstar2_data.filters.base import Row
from rstar2_data.jsonl import DataFileError, iter_jsonl, jsonl_bytes
from rstar2_data.schemas import ChatExample, MathProblem

_NESTED: dict[RowKind, tuple[str, ...]] = {"math": ("metadata",), "chat": ("messages", "tools")}
_MODELS: dict[RowKind, type[MathProblem] | type[ChatExample]] = {
    "math": MathProblem,
    "chat": ChatExample,
}


def _record(row: Row) -> dict[str, Any]:
    return row.model_dump(mode="json", exclude_none=True)


def rows_bytes(rows: Sequence[Row], *, kind: RowKind, fmt: str) -> bytes:
    """The file contents of ``rows`` in ``fmt`` ("jsonl" or "parquet")."""
    if fmt == "jsonl":
        return jsonl_bytes(_record(row) for row in rows)
    # pyarrow is imported where used: it would add ~0.4 s to every `import rstar2_data`.
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

    fields = list(_MODELS[kind].model_fields)
    columns: dict[str, list[Any]] = {name: [] for name in fields}
    for row in rows:
        record = _record(row)
        for name in fields:
            value = record.get(name)
            columns[name].append(
                json.dumps(value, ensure_ascii=False) if name in _NESTED[kind] else value
            )
    table = pa.table({name: pa.array(values, type=pa.string()) for name, values in columns.items()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def read_rows(path: Path, *, kind: RowKind) -> list[Row]:
    """Rows of a built ``data.jsonl`` or ``data.parquet``, validated against their schema."""
    model = _MODELS[kind]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
        for record in records:
            for name in _NESTED[kind]:
                record[name] = json.loads(record[name])
    else:
        records = list(iter_jsonl(path))
    out: list[Row] = []
    for number, record in enumerate(records, start=1):
        try:
            out.append(model.model_validate(record))
        except ValueError as error:
            raise DataFileError(path, f"row {number}: {error}") from error
    return out
