"""Reading source rows: hub datasets through ``datasets``, local JSONL and Parquet files."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rstar2_data.hub import load_hub_dataset
from rstar2_data.jsonl import DataFileError, iter_jsonl_lines

logger = logging.getLogger(__name__)


def iter_local_numbered(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(number, row)`` of a local ``.jsonl``/``.json`` (one object per line; the number is
    the 1-based line) or ``.parquet`` file (the 1-based row)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        yield from iter_jsonl_lines(path)
    elif suffix == ".parquet":
        # pyarrow is imported where used: it would add ~0.4 s to every `import rstar2_data`.
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

        number = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                number += 1
                yield number, row
    else:
        raise DataFileError(path, "expected a .jsonl, .json or .parquet file")


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
