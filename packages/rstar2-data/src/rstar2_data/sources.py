"""The source stage: read a source, convert its rows, and cache them in the output format.

A source's cache file holds its converted rows as JSON lines, exactly as ``data.jsonl`` writes
them, so later stages copy kept lines without encoding them again. It is keyed by the source's
content (``cache.py``), so a changed file is converted anew, and its record (``.json``) holds
the file's SHA-256 and line count, checked before the file is reused.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rstar2_data.cache import file_digest, stage_key
from rstar2_data.converters import RowError, get_converter
from rstar2_data.converters.base import Converter, RowKind
from rstar2_data.converters.math_sources import MappedMath
from rstar2_data.demo import demo_problems, demo_transcripts
from rstar2_data.filters import Row
from rstar2_data.jsonl import MAX_LINE_BYTES, atomic_output, atomic_write_text
from rstar2_data.loading import is_jsonl, iter_local_numbered, load_hub, open_parquet
from rstar2_data.progress import Stages
from rstar2_data.recipe import Recipe, SourceSpec
from rstar2_data.schemas import MathProblem

logger = logging.getLogger(__name__)
_ADVANCE = 4096  # rows between progress updates


class _Record(BaseModel):
    """What converting a source found, and the SHA-256 and lines of the rows file written."""

    model_config = ConfigDict(extra="forbid")

    rows_read: int
    converted: int
    malformed: dict[str, int]
    sha256: str


@dataclass(frozen=True)
class CachedSource:
    """A converted source: its rows file and what reading it found."""

    name: str
    key: str
    path: Path
    rows_read: int
    converted: int
    malformed: dict[str, int]


def record_line(row: Row) -> bytes:
    """A row as one line of ``data.jsonl``."""
    if type(row) is MathProblem and not row.metadata:
        # What model_dump gives such a row (every field a str but the empty metadata), made
        # directly: dumping through pydantic costs as much as the rest of the conversion.
        record: dict[str, Any] = {
            "id": row.id,
            "source": row.source,
            "problem": row.problem,
            "answer": row.answer,
            "answer_kind": row.answer_kind,
            "metadata": {},
        }
    else:
        record = row.model_dump(mode="json", exclude_none=True)
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


def origin(spec: SourceSpec) -> str:
    """Where a source's rows come from, for the manifest."""
    if spec.hub is not None:
        return f"hub:{spec.hub}" + (f"/{spec.config}" if spec.config else "") + f"[{spec.split}]"
    return f"file:{spec.path}" if spec.path is not None else f"synthetic:{spec.synthetic}"


def _demo_rows(spec: SourceSpec, recipe: Recipe) -> list[Row]:
    assert spec.demo is not None  # SourceSpec validation: synthetic sources have options
    options = spec.demo
    common: dict[str, Any] = {
        "seed": recipe.seed,
        "levels": options.levels,
        "families": options.families,
        "split": options.split,
        "heldout_share": options.heldout_share,
    }
    if recipe.kind == "math":
        return list(demo_problems(options.n, **common))
    return list(
        demo_transcripts(
            options.n,
            failure_share=options.failure_share,
            direct_share=options.direct_share,
            **common,
        )
    )


class _Reader:
    """A source's raw rows with their numbers, total and content key."""

    def __init__(self, spec: SourceSpec, kind: RowKind, seed: int, max_line_bytes: int) -> None:
        self.spec = spec
        self.max_line_bytes = max_line_bytes
        self.dataset: Any = None
        self.unit = "row"
        content: Any
        if spec.path is not None:
            digest = file_digest(spec.path)
            content = digest.sha256
            if is_jsonl(spec.path):
                self.unit, self.total = "line", digest.lines
            else:
                self.total = open_parquet(spec.path).metadata.num_rows
        elif spec.hub is not None:
            self.dataset = load_hub(spec.hub, config=spec.config, split=spec.split)
            # datasets derives the fingerprint from the files it downloaded (their revision).
            content = getattr(self.dataset, "_fingerprint", None)
            self.total = len(self.dataset)
        else:
            assert spec.demo is not None
            content, self.total = None, spec.demo.n
        spec_fields = spec.model_dump(mode="json", exclude={"count", "weight"})
        self.key = stage_key("source", kind, seed if spec.synthetic else None, spec_fields, content)

    def rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        if self.spec.path is not None:
            yield from iter_local_numbered(self.spec.path, max_line_bytes=self.max_line_bytes)
        else:
            yield from enumerate(self.dataset, start=1)

    def where(self, number: int) -> str:
        if self.unit == "line":
            return f"{self.spec.path}:{number}"
        return f"row {number}"


def load_source(
    spec: SourceSpec,
    recipe: Recipe,
    cache_dir: Path,
    stages: Stages,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> CachedSource:
    """Convert ``spec`` into ``cache_dir`` unless an intact file of the same content key is
    there; JSONL lines longer than ``max_line_bytes`` are refused."""
    reader = _Reader(spec, recipe.kind, recipe.seed, max_line_bytes)
    name = f"source {spec.name}"
    data_path = cache_dir / f"source-{spec.name}-{reader.key}.jsonl"
    info_path = cache_dir / f"source-{spec.name}-{reader.key}.json"
    record = _intact(data_path, info_path)
    if record is not None:
        stages.reused(name, record.converted)
    else:
        record = _convert(spec, recipe, reader, data_path, stages)
        atomic_write_text(info_path, record.model_dump_json())
    source = CachedSource(
        spec.name, reader.key, data_path, record.rows_read, record.converted, record.malformed
    )
    if not source.converted:
        if source.rows_read:
            what = f"none of its {source.rows_read} rows converted ({_reasons(source.malformed)})"
        else:
            what = f"{spec.path or origin(spec)} holds no rows"
        logger.warning("source %s: %s; it contributes nothing", spec.name, what)
    return source


def _reasons(malformed: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {count}" for reason, count in malformed.items())


def _intact(data_path: Path, info_path: Path) -> _Record | None:
    """The record of a converted source whose rows file is the one it describes, else None
    (with a warning when a record is there but does not hold)."""
    if not info_path.is_file():
        return None
    try:
        record = _Record.model_validate_json(info_path.read_bytes())
    except ValidationError:
        logger.warning("%s is not a valid record; converting the source anew", info_path)
        return None
    digest = file_digest(data_path) if data_path.is_file() else None
    if digest is None or (digest.sha256, digest.lines) != (record.sha256, record.converted):
        logger.warning(
            "%s does not hold the %d rows its record describes; converting the source anew",
            data_path,
            record.converted,
        )
        return None
    return record


def _convert(
    spec: SourceSpec, recipe: Recipe, reader: _Reader, data_path: Path, stages: Stages
) -> _Record:
    """Read and convert every row of the source into ``data_path``."""
    malformed: Counter[str] = Counter()
    read = converted = 0
    with (
        stages.stage(f"source {spec.name}", reader.total) as stage,
        atomic_output(data_path) as tmp,
        tmp.open("wb") as out,
    ):
        if spec.synthetic is not None:
            rows = _demo_rows(spec, recipe)
            for row in rows:
                out.write(record_line(row))
            read = converted = len(rows)
            stage.advance(read)
        else:
            converter: Converter[Any] = (
                get_converter(spec.converter)
                if spec.converter is not None
                else MappedMath(spec.fields)
            )
            number = 0
            for number, raw in reader.rows():
                try:
                    row = converter.convert(raw, source=spec.name, index=read)
                except RowError as error:
                    if not malformed[error.reason]:
                        logger.warning(
                            "source %s: %s: %s (first of its kind)",
                            spec.name,
                            reader.where(number),
                            error,
                        )
                    malformed[error.reason] += 1
                else:
                    out.write(record_line(row))
                    converted += 1
                read += 1
                if read % _ADVANCE == 0:
                    stage.advance(number - stage.done)
            stage.advance(number - stage.done)
        out.flush()
        sha256 = file_digest(tmp).sha256
    return _Record(
        rows_read=read,
        converted=converted,
        malformed=dict(sorted(malformed.items())),
        sha256=sha256,
    )
