"""Reading source rows: hub datasets through ``datasets``, local JSONL and Parquet files."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rstar2_data.benchmarks import DATA_SUFFIXES_TEXT
from rstar2_data.hub import load_hub_dataset
from rstar2_data.jsonl import MAX_LINE_BYTES, DataFileError, iter_jsonl_lines

logger = logging.getLogger(__name__)


def iter_local_numbered(
    path: Path, *, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(number, row)`` of a local ``.jsonl``/``.json`` (one object per line of at most
    ``max_line_bytes``; the number is the 1-based line) or ``.parquet`` file (the 1-based row).
    A file that cannot be read is a ``DataFileError`` naming the line or row group."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        yield from iter_jsonl_lines(path, max_line_bytes=max_line_bytes)
    elif suffix == ".parquet":
        yield from _iter_parquet(path)
    else:
        raise DataFileError(path, f"expected a {DATA_SUFFIXES_TEXT} file")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def open_parquet(path: Path) -> Any:
    """``pyarrow.parquet.ParquetFile`` of ``path``; ``DataFileError`` when it is not one."""
    # pyarrow is imported where used: it would add ~0.4 s to every `import rstar2_data`.
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise DataFileError(
            path, f"expected a Parquet file, but pyarrow cannot read it: {_one_line(error)}"
        ) from None


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows in batches, row group by row group, so a corrupt one is named."""
    import pyarrow as pa

    parquet = open_parquet(path)
    groups = parquet.metadata.num_row_groups
    number = 0
    for group in range(groups):
        first = number + 1
        try:
            for batch in parquet.iter_batches(batch_size=4096, row_groups=[group]):
                for row in batch.to_pylist():
                    number += 1
                    yield number, row
        except (pa.ArrowException, OSError) as error:  # arrow's I/O errors are OSError
            size = parquet.metadata.row_group(group).num_rows
            raise DataFileError(
                path,
                f"row group {group + 1} of {groups} (rows {first}-{first + size - 1}) cannot be "
                f"read: {_one_line(error)}; expected valid Parquet data",
            ) from None


def iter_local(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a local ``.jsonl``/``.json`` (one object per line) or ``.parquet`` file."""
    for _, row in iter_local_numbered(path):
        yield row


def is_jsonl(path: Path) -> bool:
    """Whether ``path`` is read as JSON Lines (its rows are numbered by line)."""
    return path.suffix.lower() in (".jsonl", ".json")


LOCAL_COPY_HINT = (
    "download it where the hub is reachable and give the recipe entry a local `path:` "
    "(a .jsonl or .parquet file) instead of `hub:`"
)


def load_hub(hub_id: str, *, config: str | None, split: str) -> Any:
    """A Hugging Face hub dataset split (``datasets.Dataset``); ``HubUnreachableError`` in one
    line when the hub cannot be reached and the dataset is not cached."""
    logger.info("loading %s (config %s, split %s) from the hub", hub_id, config, split)
    return load_hub_dataset(hub_id, config=config, split=split, hint=LOCAL_COPY_HINT)


def iter_hub(hub_id: str, *, config: str | None, split: str) -> Iterator[dict[str, Any]]:
    """Rows of a Hugging Face hub dataset split (``load_hub``)."""
    yield from load_hub(hub_id, config=config, split=split)
