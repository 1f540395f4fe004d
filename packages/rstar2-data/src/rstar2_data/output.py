"""The output stage: the kept rows in seeded random order, written as JSONL or Parquet.

The order is the one ``random.Random(f"{seed}:shuffle").shuffle`` gives a list of the rows,
computed on row numbers alone; the rows themselves go through bucket files (an external
shuffle), so memory holds one bucket of rows (``bucket_bytes``), not the dataset.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path

from rstar2_data.cache import file_digest
from rstar2_data.converters.base import RowKind
from rstar2_data.jsonl import atomic_output, loads_json_line
from rstar2_data.progress import Stage, Stages
from rstar2_data.rows import PARQUET_ROW_GROUP, parquet_table

BUCKET_BYTES = 64 << 20
MAX_BUCKETS = 1000
_ADVANCE = 4096


def permutation(n: int, seed: str) -> array[int]:
    """``order[k]`` = the row at position ``k`` after ``random.Random(seed).shuffle`` of ``n``
    rows (the same draws, on an array of row numbers)."""
    order = array("q", range(n))
    # Random.shuffle's own draws (CPython 3.11-3.13; tests compare with Random.shuffle).
    randbelow = random.Random(seed)._randbelow  # type: ignore[attr-defined]
    for i in reversed(range(1, n)):
        j = randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def _shuffled(
    source: Path, rows: int, seed: str, work_dir: Path, bucket_bytes: int
) -> Iterator[bytes]:
    """The lines of ``source`` in shuffled order, through bucket files in ``work_dir``."""
    order = permutation(rows, seed)
    position = array("q", bytes(8 * rows))
    for k, row in enumerate(order):
        position[row] = k
    del order
    size = max(1, source.stat().st_size)
    per_bucket = max(1, rows * bucket_bytes // size, -(-rows // MAX_BUCKETS))
    if per_bucket >= rows:  # one bucket: the rows fit in memory
        slots: list[bytes] = [b""] * rows
        with source.open("rb") as handle:
            for index, line in enumerate(handle):
                slots[position[index]] = line
        yield from slots
        return
    work_dir.mkdir(parents=True, exist_ok=True)
    buckets = -(-rows // per_bucket)
    paths = [work_dir / f"bucket-{b}" for b in range(buckets)]
    handles = [path.open("wb") for path in paths]
    try:
        with source.open("rb") as handle:
            for index, line in enumerate(handle):
                bucket, place = divmod(position[index], per_bucket)
                handles[bucket].write(b"%d " % place + line)
    finally:
        for out in handles:
            out.close()
    del position
    for bucket, path in enumerate(paths):
        slots = [b""] * min(per_bucket, rows - bucket * per_bucket)
        with path.open("rb") as handle:
            for record in handle:
                slot, _, line = record.partition(b" ")
                slots[int(slot)] = line
        path.unlink()
        yield from slots
    shutil.rmtree(work_dir, ignore_errors=True)


def write_rows(
    source: Path,
    rows: int,
    target: Path,
    *,
    kind: RowKind,
    fmt: str,
    shuffle_seed: str | None,
    work_dir: Path,
    stages: Stages,
    bucket_bytes: int = BUCKET_BYTES,
) -> str:
    """Write the ``rows`` JSON lines of ``source`` to ``target`` (atomically), shuffled with
    ``shuffle_seed`` unless it is None; the SHA-256 of the written file."""
    name = "shuffle and write" if shuffle_seed is not None else "write"
    with stages.stage(f"{name} {target.name}", rows) as stage, atomic_output(target) as tmp:
        if shuffle_seed is not None:
            lines = _shuffled(source, rows, shuffle_seed, work_dir, bucket_bytes)
        else:
            lines = _plain(source)
        lines = _counted(lines, stage)
        if fmt == "jsonl":
            sha = hashlib.sha256()
            with tmp.open("wb") as out:
                for line in lines:
                    out.write(line)
                    sha.update(line)
            digest = sha.hexdigest()
        else:
            _write_parquet(lines, tmp, kind)
            digest = file_digest(tmp).sha256
    return digest


def _counted(lines: Iterator[bytes], stage: Stage) -> Iterator[bytes]:
    count = 0
    for line in lines:
        yield line
        count += 1
        if count % _ADVANCE == 0:
            stage.advance(_ADVANCE)
    stage.advance(count % _ADVANCE)


def _plain(source: Path) -> Iterator[bytes]:
    with source.open("rb") as handle:
        yield from handle


def _write_parquet(lines: Iterator[bytes], path: Path, kind: RowKind) -> None:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type hints

    with pq.ParquetWriter(path, parquet_table([], kind).schema) as writer:
        batch: list[bytes] = []
        for line in lines:
            batch.append(line)
            if len(batch) == PARQUET_ROW_GROUP:
                writer.write_table(parquet_table(map(loads_json_line, batch), kind))
                batch = []
        if batch:
            writer.write_table(parquet_table(map(loads_json_line, batch), kind))
