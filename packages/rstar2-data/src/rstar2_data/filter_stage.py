"""The filter stage: the pool's rows through the filter chain, checkpointed as it goes.

Kept rows are appended, as their JSON lines, to ``filter-<key>.jsonl``; every
``checkpoint_rows`` rows the stage flushes that file and the chain's key log
(``filter-<key>.keys``) and records their lengths and SHA-256 with the chain's counters in
``filter-<key>.json``. An interrupted stage resumes at its last checkpoint: the files are cut
back to the recorded lengths and the rows after it are judged again, so the result is the
bytes an uninterrupted run writes. A checkpoint whose files do not hold what it records (a
record that does not parse, files cut short or rewritten) is discarded with a warning and the
stage runs from the start.

With ``num_proc`` above 1 the per-row work (parsing, normalization, every filter's check) runs
in that many processes through ``datasets.Dataset.map``, window by window; the verdicts are
then applied in order here, so the output does not depend on ``num_proc``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, ValidationError

from rstar2_data.cache import PARALLEL_PREFIX
from rstar2_data.converters.base import RowKind
from rstar2_data.filters import Filter, FilterChain, FilterReport, Item, Verdict
from rstar2_data.jsonl import atomic_write_text
from rstar2_data.pool import Pool
from rstar2_data.progress import Stages
from rstar2_data.rows import parse_row

logger = logging.getLogger(__name__)
CHECKPOINT_ROWS = 100_000
_ADVANCE = 4096  # rows between progress updates


class _Checkpoint(BaseModel):
    """``filter-<key>.json``: how far the stage got, and what its files held then."""

    model_config = ConfigDict(extra="forbid")

    done: bool
    rows_done: int
    kept: int
    data_bytes: int
    keys_bytes: int
    data_sha256: str
    keys_sha256: str
    chain: dict[str, Any]
    reports: list[FilterReport]


class _Log:
    """A file the stage appends to, with the SHA-256 of everything it holds so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sha = hashlib.sha256()
        self.size = 0

    def holds(self, size: int, sha256: str) -> bool:
        """Whether the file's first ``size`` bytes have this SHA-256; if so the log continues
        from there (the file is cut back to them)."""
        if not self.path.is_file() or self.path.stat().st_size < size:
            return False
        sha, left = hashlib.sha256(), size
        with self.path.open("rb") as handle:
            while left and (block := handle.read(min(left, 1 << 20))):
                sha.update(block)
                left -= len(block)
        if left or sha.hexdigest() != sha256:
            return False
        os.truncate(self.path, size)
        self.sha, self.size = sha, size
        return True

    def restart(self) -> None:
        self.path.write_bytes(b"")
        self.sha, self.size = hashlib.sha256(), 0

    def append(self, handle: BinaryIO, data: bytes) -> None:
        handle.write(data)
        self.sha.update(data)
        self.size += len(data)


@dataclass(frozen=True)
class Filtered:
    """The rows the filters kept (JSON lines, in pool order) and the filters' reports."""

    path: Path
    rows: int
    reports: list[FilterReport]


def verdict_batch(
    batch: dict[str, list[str]], *, filters: Sequence[Filter], kind: RowKind
) -> dict[str, list[Any]]:
    """Every filter's check and the id of each row of a batch of JSON lines (worker side)."""
    out: dict[str, list[Any]] = {f"v{k}": [] for k in range(len(filters))}
    out["id"] = []
    for line in batch["text"]:
        item = Item(parse_row(line, kind))
        for k, filt in enumerate(filters):
            out[f"v{k}"].append(filt.check(item))
        out["id"].append(item.row.id)
    return out


class _ParallelChecks:
    """Filter checks of pool windows computed by ``datasets`` in ``num_proc`` processes."""

    def __init__(
        self, pool: Pool, filters: Sequence[Filter], kind: RowKind, work_dir: Path, num_proc: int
    ) -> None:
        import datasets  # imported here: slow to import, and only this path needs it

        self.filters, self.kind, self.num_proc = filters, kind, num_proc
        datasets.disable_progress_bars()  # the stage's own line shows the progress
        text = datasets.Dataset.from_text(
            [str(part.source.path) for part in pool.parts], cache_dir=str(work_dir)
        )
        if any(part.take is not None for part in pool.parts):
            indices: list[int] = []
            offset = 0
            for part in pool.parts:
                take = part.take if part.take is not None else range(part.source.converted)
                indices.extend(offset + i for i in take)
                offset += part.source.converted
            text = text.select(indices)
        self.text = text
        self.features = datasets.Features(
            {
                **{
                    f"v{k}": datasets.Value("binary" if filt.keyed else "string")
                    for k, filt in enumerate(filters)
                },
                "id": datasets.Value("string"),
            }
        )

    def window(self, start: int, stop: int) -> Iterator[tuple[list[Verdict], str]]:
        """Each row's verdicts and id, for pool rows ``start`` to ``stop``."""
        mapped = self.text.select(range(start, stop)).map(
            verdict_batch,
            batched=True,
            batch_size=1000,
            num_proc=min(self.num_proc, -(-(stop - start) // 1000)),
            fn_kwargs={"filters": self.filters, "kind": self.kind},
            remove_columns=["text"],
            features=self.features,
            keep_in_memory=True,
            new_fingerprint=f"verdicts-{start}-{stop}",
        )
        columns = [mapped[f"v{k}"] for k in range(len(self.filters))]
        for index, row_id in enumerate(mapped["id"]):
            yield [column[index] for column in columns], row_id


def run_filters(
    pool: Pool,
    filters: Sequence[Filter],
    *,
    kind: RowKind,
    key: str,
    cache_dir: Path,
    stages: Stages,
    checkpoint_rows: int = CHECKPOINT_ROWS,
    num_proc: int = 1,
) -> Filtered:
    """Filter the pool into ``cache_dir/filter-<key>.jsonl``, resuming a checkpoint there."""
    data = _Log(cache_dir / f"filter-{key}.jsonl")
    keys = _Log(cache_dir / f"filter-{key}.keys")
    state_path = cache_dir / f"filter-{key}.json"
    name = "filter " + (" > ".join(f.name for f in filters) or "(ids only)")
    chain = FilterChain(filters)
    state = _usable_state(state_path, data, keys, chain)
    if state is not None and state.done:
        stages.reused(name, state.kept)
        return Filtered(data.path, state.kept, state.reports)
    start = kept = 0
    if state is not None:
        start, kept = state.rows_done, state.kept
        logger.info("%s: resuming at row %d of %d", name, start, pool.size)
    else:
        chain = FilterChain(filters)  # a failed restore may have filled the first one
        cache_dir.mkdir(parents=True, exist_ok=True)
        data.restart()
        keys.restart()
    parallel = (
        _ParallelChecks(pool, filters, kind, cache_dir / f"{PARALLEL_PREFIX}{key}", num_proc)
        if num_proc > 1
        else None
    )
    lines = pool.lines(start)
    pending: list[bytes] = []  # kept lines, written a few thousand at a time
    with (
        stages.stage(name, pool.size, start=start) as stage,
        data.path.open("ab") as data_file,
        keys.path.open("ab") as keys_file,
    ):

        def checkpoint(done: int, *, final: bool) -> None:
            data.append(data_file, b"".join(pending))
            pending.clear()
            keys.append(keys_file, chain.take_keys())
            data_file.flush()
            keys_file.flush()
            record = _Checkpoint(
                done=final,
                rows_done=done,
                kept=kept,
                data_bytes=data.size,
                keys_bytes=keys.size,
                data_sha256=data.sha.hexdigest(),
                keys_sha256=keys.sha.hexdigest(),
                chain=chain.state(),
                reports=chain.reports() if final else [],
            )
            atomic_write_text(state_path, record.model_dump_json())
            stage.advance(done - stage.done)
            if not final:
                logger.info("%s: checkpoint at row %d", name, done)

        for window_start in range(start, pool.size, checkpoint_rows):
            window_stop = min(window_start + checkpoint_rows, pool.size)
            checks = parallel.window(window_start, window_stop) if parallel else None
            for done in range(window_start + 1, window_stop + 1):
                line = next(lines)
                if checks is not None:
                    verdicts, row_id = next(checks)
                    ok = chain.judge(verdicts.__getitem__, row_id)
                else:
                    ok = chain.judge_item(Item(parse_row(line, kind)))
                if ok:
                    pending.append(line)
                    kept += 1
                if done % _ADVANCE == 0:
                    data.append(data_file, b"".join(pending))
                    pending.clear()
                    stage.advance(done - stage.done)
            checkpoint(window_stop, final=False)
        chain.check_duplicate_ids()
        checkpoint(pool.size, final=True)
    if parallel is not None:
        import shutil

        shutil.rmtree(cache_dir / f"{PARALLEL_PREFIX}{key}", ignore_errors=True)
    return Filtered(data.path, kept, chain.reports())


def _usable_state(
    state_path: Path, data: _Log, keys: _Log, chain: FilterChain
) -> _Checkpoint | None:
    """The recorded checkpoint, with the files cut back to it and ``chain`` restored, when
    its record parses and the files hold the bytes it records; else None (with a warning when
    there was a record)."""
    if not state_path.is_file():
        return None
    try:
        state = _Checkpoint.model_validate_json(state_path.read_bytes())
    except ValidationError:
        logger.warning("%s is not a valid checkpoint; filtering anew", state_path)
        return None
    for log, size, sha256 in (
        (data, state.data_bytes, state.data_sha256),
        (keys, state.keys_bytes, state.keys_sha256),
    ):
        if not log.holds(size, sha256):
            logger.warning(
                "%s does not hold the %d bytes its checkpoint %s records; filtering anew",
                log.path,
                size,
                state_path.name,
            )
            return None
    if not state.done:
        try:
            chain.restore(state.chain, keys.path.read_bytes())
        except (KeyError, TypeError, ValueError) as error:
            logger.warning("%s: cannot restore the filters (%s); filtering anew", state_path, error)
            return None
    return state
