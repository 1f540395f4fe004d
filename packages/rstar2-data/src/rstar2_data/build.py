"""Building a dataset from a recipe: sources, filters, shuffle, write, manifest; streamed.

Stages and their checkpoints in ``DIR/.cache`` (``cache.py`` names them by content keys):

1. each source is read, converted and written as JSON lines (``sources.py``);
2. the sampled rows of all sources go through the filter chain in one pass that normalizes each
   row's text once, appending kept rows to a file and checkpointing every
   ``checkpoint_rows`` rows (``filter_stage.py``);
3. the kept rows are shuffled through bucket files and written (``output.py``).

Memory holds the filters' key sets and one shuffle bucket, not the rows. Output is a function
of the recipe and its inputs alone, so a rebuild writes the same bytes; a build that is
interrupted resumes from its last finished stage (within the filter stage, its last
checkpoint) and writes the same bytes as one that was not.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_data.benchmarks import BenchmarkSpec
from rstar2_data.cache import (
    CACHE_DIR,
    SHUFFLE_PREFIX,
    file_digest,
    prune,
    remove_leftovers,
    stage_key,
)
from rstar2_data.converters.base import RowKind
from rstar2_data.errors import describe_validation_error
from rstar2_data.filter_stage import CHECKPOINT_ROWS, run_filters
from rstar2_data.filters import (
    Decontaminate,
    Dedup,
    Difficulty,
    DuplicateIdsError,
    Filter,
    FilterReport,
    IntegerAnswer,
    LabelVerification,
    Row,
    load_tallies,
)
from rstar2_data.jsonl import MAX_LINE_BYTES, atomic_write_text
from rstar2_data.loading import is_jsonl, iter_hub, iter_local_numbered
from rstar2_data.lock import folder_lock
from rstar2_data.output import BUCKET_BYTES, write_rows
from rstar2_data.pool import Pool, sample, targets
from rstar2_data.progress import Stages
from rstar2_data.recipe import (
    DecontaminateSpec,
    DedupSpec,
    FilterSpec,
    IntegerAnswerSpec,
    LabelVerificationSpec,
    Recipe,
)
from rstar2_data.rows import read_rows
from rstar2_data.sources import load_source, origin

logger = logging.getLogger(__name__)
MANIFEST = "manifest.json"


class BuildError(RuntimeError):
    """A build that cannot finish; the message says which source or filter and why."""


class SourceReport(BaseModel):
    """What one source contributed."""

    model_config = ConfigDict(extra="forbid")

    name: str
    origin: str
    rows_read: int
    converted: int
    malformed: dict[str, int]
    requested: int | None
    taken: int


class Manifest(BaseModel):
    """Everything needed to audit or reproduce a build; written next to the data."""

    model_config = ConfigDict(extra="forbid")

    recipe: str
    kind: RowKind
    seed: int
    recipe_sha256: str
    build_key: str = Field(
        default="",
        description="Hash of all the data file depends on: the recipe, the content of its "
        "sources, benchmarks and graded samples, and the rstar2-data version.",
    )
    data_file: str
    format: str
    rows: int
    content_sha256: str
    sources: list[SourceReport]
    filters: list[FilterReport]


def _benchmark_rows(bench: BenchmarkSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of a benchmark: its local file when it names one (``line N`` of a
    JSONL file, else ``row N``), else every config on the hub."""
    if bench.path is not None:
        unit = "line" if is_jsonl(bench.path) else "row"
        for number, row in iter_local_numbered(bench.path):
            yield f"{unit} {number}", row
        return
    assert bench.hub is not None  # BenchmarkSpec validation: hub or path
    for config in bench.hub.configs:
        rows = iter_hub(bench.hub.path, config=config, split=bench.hub.split)
        for number, row in enumerate(rows, start=1):
            yield f"{config or 'default'} row {number}", row


def _benchmark_texts(spec: DecontaminateSpec) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for bench in spec.benchmarks:
        found = []
        for where, row in _benchmark_rows(bench):
            problem = bench.fields.find(row, "problem")
            if problem is None or not isinstance(problem[1], str):
                names = " or ".join(repr(name) for name in bench.fields.problem)
                raise BuildError(f"benchmark {bench.name}: {where} has no string {names}")
            found.append(problem[1])
        texts[bench.name] = found
    return texts


def prepare_filter(spec: FilterSpec) -> tuple[Filter, str]:
    """The filter a recipe entry describes (loading its benchmarks or graded samples), and a
    digest of what it loaded."""
    if isinstance(spec, IntegerAnswerSpec):
        return IntegerAnswer(max_abs=spec.max_abs), ""
    if isinstance(spec, DedupSpec):
        return Dedup(mode=spec.mode), ""
    if isinstance(spec, DecontaminateSpec):
        texts = _benchmark_texts(spec)
        digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()
        decontam = Decontaminate(
            texts,
            n=spec.n,
            min_matches=spec.min_matches,
            boilerplate=spec.boilerplate,
            coverage=spec.coverage,
            short_words=spec.short_words,
        )
        return decontam, digest
    digest = ",".join(file_digest(path).sha256 for path in spec.samples)
    if isinstance(spec, LabelVerificationSpec):
        graded: Filter = LabelVerification(
            load_tallies(spec.samples),
            min_correct=spec.min_correct,
            keep_ungraded=spec.keep_ungraded,
        )
    else:
        graded = Difficulty(
            load_tallies(spec.samples),
            max_correct=spec.max_correct,
            keep_ungraded=spec.keep_ungraded,
        )
    return graded, digest


def build(
    recipe: Recipe,
    out_dir: Path,
    *,
    progress: bool = True,
    num_proc: int = 1,
    checkpoint_rows: int = CHECKPOINT_ROWS,
    bucket_bytes: int = BUCKET_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    wait: bool = False,
) -> Manifest:
    """Build ``recipe`` into ``out_dir`` (``data.<format>`` and ``manifest.json``).

    ``num_proc`` processes run the filters' per-row work (``datasets``' multiprocess map);
    the filter stage checkpoints every ``checkpoint_rows`` rows; the shuffle holds about
    ``bucket_bytes`` of rows in memory at a time. None of them changes the output. A JSONL
    source line longer than ``max_line_bytes`` stops the build before it is parsed.

    One build at a time writes into ``out_dir``: while another holds it, this one raises
    ``FolderLockedError`` naming that process, or with ``wait`` starts when it ends. A build
    that fails leaves no folder it created empty behind.
    """
    if num_proc < 1 or checkpoint_rows < 1 or bucket_bytes < 1 or max_line_bytes < 1:
        raise ValueError("num_proc, checkpoint_rows, bucket_bytes and max_line_bytes must be >= 1")
    created = not out_dir.exists()
    try:
        with folder_lock(out_dir, wait=wait):
            remove_leftovers(out_dir)
            return _build(
                recipe,
                out_dir,
                progress=progress,
                num_proc=num_proc,
                checkpoint_rows=checkpoint_rows,
                bucket_bytes=bucket_bytes,
                max_line_bytes=max_line_bytes,
            )
    except BaseException:
        for folder in (out_dir / CACHE_DIR, *([out_dir] if created else [])):
            with suppress(OSError):  # not there, or not empty: finished work stays
                folder.rmdir()
        raise


def _build(
    recipe: Recipe,
    out_dir: Path,
    *,
    progress: bool,
    num_proc: int,
    checkpoint_rows: int,
    bucket_bytes: int,
    max_line_bytes: int,
) -> Manifest:
    cache_dir = out_dir / CACHE_DIR
    wanted = targets(recipe)
    with Stages(enabled=progress) as stages:
        sources = [
            load_source(spec, recipe, cache_dir, stages, max_line_bytes=max_line_bytes)
            for spec in recipe.sources
        ]
        parts = [sample(source, wanted[source.name], recipe.seed) for source in sources]
        prepared = [prepare_filter(spec) for spec in recipe.filters]
        filter_key = stage_key(
            "filter",
            recipe.kind,
            recipe.seed,
            [[part.source.key, part.requested] for part in parts],
            [spec.model_dump(mode="json") for spec in recipe.filters],
            [digest for _, digest in prepared],
        )
        try:
            filtered = run_filters(
                Pool(parts),
                [filt for filt, _ in prepared],
                kind=recipe.kind,
                key=filter_key,
                cache_dir=cache_dir,
                stages=stages,
                checkpoint_rows=checkpoint_rows,
                num_proc=num_proc,
            )
        except DuplicateIdsError as error:
            raise BuildError(str(error)) from None
        build_key = stage_key("output", filter_key, recipe.output.model_dump(mode="json"))
        data_file = f"data.{recipe.output.format}"
        digest = _unchanged_output(out_dir, build_key)
        if digest is None:
            digest = write_rows(
                filtered.path,
                filtered.rows,
                out_dir / data_file,
                kind=recipe.kind,
                fmt=recipe.output.format,
                shuffle_seed=f"{recipe.seed}:shuffle" if recipe.output.shuffle else None,
                work_dir=cache_dir / f"{SHUFFLE_PREFIX}{filter_key}",
                stages=stages,
                bucket_bytes=bucket_bytes,
            )
        else:
            stages.reused(f"write {data_file}", filtered.rows)
    manifest = Manifest(
        recipe=recipe.name,
        kind=recipe.kind,
        seed=recipe.seed,
        recipe_sha256=hashlib.sha256(recipe.model_dump_json().encode()).hexdigest(),
        build_key=build_key,
        data_file=data_file,
        format=recipe.output.format,
        rows=filtered.rows,
        content_sha256=digest,
        sources=[
            SourceReport(
                name=part.source.name,
                origin=origin(spec),
                rows_read=part.source.rows_read,
                converted=part.source.converted,
                malformed=part.source.malformed,
                requested=part.requested,
                taken=part.size,
            )
            for part, spec in zip(parts, recipe.sources, strict=True)
        ],
        filters=filtered.reports,
    )
    atomic_write_text(out_dir / MANIFEST, manifest.model_dump_json(indent=2) + "\n")
    prune(cache_dir, {source.key for source in sources} | {filter_key})
    return manifest


def _unchanged_output(out_dir: Path, build_key: str) -> str | None:
    """The data file's SHA-256 when the folder already holds this build's output intact."""
    try:
        manifest = read_manifest(out_dir)
    except BuildError:
        return None
    path = out_dir / manifest.data_file
    if manifest.build_key != build_key or not path.is_file():
        return None
    digest = file_digest(path).sha256
    return digest if digest == manifest.content_sha256 else None


def read_manifest(out_dir: Path) -> Manifest:
    """The manifest of a built dataset folder."""
    path = out_dir / MANIFEST
    if not path.is_file():
        raise BuildError(f"{out_dir} holds no {MANIFEST}; is it an rstar2-data build folder?")
    try:
        return Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as error:
        raise BuildError(
            f"{path}: not a valid manifest: {describe_validation_error(error)}"
        ) from None


def load_built(out_dir: Path) -> list[Row]:
    """The rows of a built dataset folder, checked against the manifest's content hash."""
    manifest = read_manifest(out_dir)
    path = out_dir / manifest.data_file
    if file_digest(path).sha256 != manifest.content_sha256:
        raise BuildError(f"{path} does not match the content hash in its manifest")
    return read_rows(path, kind=manifest.kind)
