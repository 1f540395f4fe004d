"""Reading source rows: hub datasets through ``datasets``, local JSONL and Parquet files."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rstar2_data.hub import iter_hub_dataset
from rstar2_data.jsonl import DataFileError, iter_jsonl

logger = logging.getLogger(__name__)


def iter_local(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a local ``.jsonl``/``.json`` (one object per line) or ``.parquet`` file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        yield from iter_jsonl(path)
    elif suffix == ".parquet":
        # pyarrow is imported where used: it would add ~0.4 s to every `import rstar2_data`.
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
    else:
        raise DataFileError(path, "expected a .jsonl, .json or .parquet file")


LOCAL_COPY_HINT = (
    "download it where the hub is reachable and give the recipe entry a local `path:` "
    "(a .jsonl or .parquet file) instead of `hub:`"
)


def iter_hub(hub_id: str, *, config: str | None, split: str) -> Iterator[dict[str, Any]]:
    """Rows of a Hugging Face hub dataset split; ``HubUnreachableError`` in one line when the hub
    cannot be reached and the dataset is not cached."""
    logger.info("loading %s (config %s, split %s) from the hub", hub_id, config, split)
    return iter_hub_dataset(hub_id, config=config, split=split, hint=LOCAL_COPY_HINT)


def iter_source(
    *, hub: str | None, path: Path | None, config: str | None, split: str
) -> Iterator[dict[str, Any]]:
    """Rows of a hub dataset or a local file (exactly one of ``hub``, ``path``)."""
    if path is not None:
        return iter_local(path)
    if hub is not None:
        return iter_hub(hub, config=config, split=split)
    raise ValueError("a source needs a hub id or a path")
