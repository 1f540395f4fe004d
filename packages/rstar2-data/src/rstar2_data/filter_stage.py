"""The filter stage: the pool's rows through the filter chain, checkpointed as it goes.

Kept rows are appended, as their JSON lines, to ``filter-<key>.jsonl``; every
``checkpoint_rows`` rows the stage flushes that file and the chain's key log
(``filter-<key>.keys``) and records their lengths with the chain's counters in
``filter-<key>.json``. An interrupted stage resumes at its last checkpoint: the files are cut
back to the recorded lengths and the rows after it are judged again, so the result is the
bytes an uninterrupted run writes.

With ``num_proc`` above 1 the per-row work (parsing, normalization, every filter's check) runs
in that many processes through ``datasets.Dataset.map``, window by window; the verdicts are
then applied in order here, so the output does not depend on ``num_proc``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2_data.converters.base import RowKind
from rstar2_data.filters import Filter, FilterChain, FilterReport, Item, Verdict
from rstar2_data.jsonl import atomic_write_text
from rstar2_data.pool import Pool
from rstar2_data.progress import Stages
from rstar2_data.rows import parse_row

logger = logging.getLogger(__name__)
CHECKPOINT_ROWS = 100_000
_ADVANCE = 4096  # rows between progress updates


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
    data_path = cache_dir / f"filter-{key}.jsonl"
    keys_path = cache_dir / f"filter-{key}.keys"
    state_path = cache_dir / f"filter-{key}.json"
    name = "filter " + (" > ".join(f.name for f in filters) or "(ids only)")
    chain = FilterChain(filters)
    state = _usable_state(state_path, data_path, keys_path)
    if state is not None and state["done"]:
        os.truncate(data_path, state["data_bytes"])
        stages.reused(name, state["kept"])
        reports = [FilterReport.model_validate(r) for r in state["reports"]]
        return Filtered(data_path, state["kept"], reports)
    start = kept = 0
    if state is not None:
        start, kept = state["rows_done"], state["kept"]
        for path, size in ((data_path, state["data_bytes"]), (keys_path, state["keys_bytes"])):
            os.truncate(path, size)
        chain.restore(state["chain"], keys_path.read_bytes())
        logger.info("%s: resuming at row %d of %d", name, start, pool.size)
    else:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for path in (data_path, keys_path):
            path.write_bytes(b"")
    parallel = (
        _ParallelChecks(pool, filters, kind, cache_dir / f"hf-{key}", num_proc)
        if num_proc > 1
        else None
    )
    lines = pool.lines(start)
    with (
        stages.stage(name, pool.size, start=start) as stage,
        data_path.open("ab") as data,
        keys_path.open("ab") as keys,
    ):

        def checkpoint(done: int, *, final: bool) -> None:
            data.flush()
            chain.flush_keys(keys)
            keys.flush()
            record = {
                "done": final,
                "rows_done": done,
                "kept": kept,
                "data_bytes": data.tell(),
                "keys_bytes": keys.tell(),
                "chain": chain.state(),
                "reports": [r.model_dump() for r in chain.reports()] if final else [],
            }
            atomic_write_text(state_path, json.dumps(record))
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
                    data.write(line)
                    kept += 1
                if done % _ADVANCE == 0:
                    stage.advance(done - stage.done)
            checkpoint(window_stop, final=False)
        chain.check_duplicate_ids()
        checkpoint(pool.size, final=True)
    if parallel is not None:
        import shutil

        shutil.rmtree(cache_dir / f"hf-{key}", ignore_errors=True)
    return Filtered(data_path, kept, chain.reports())


def _usable_state(state_path: Path, data_path: Path, keys_path: Path) -> dict[str, Any] | None:
    """The recorded state when its files hold at least the recorded bytes, else None."""
    if not state_path.is_file():
        return None
    state: dict[str, Any] = json.loads(state_path.read_text(encoding="utf-8"))
    for path, size in ((data_path, state["data_bytes"]), (keys_path, state["keys_bytes"])):
        if not path.is_file() or path.stat().st_size < size:
            logger.warning("%s is shorter than its checkpoint says; filtering anew", path)
            return None
    return state
