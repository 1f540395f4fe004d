"""Building a dataset from a recipe: load, convert, sample, filter, shuffle, write, manifest.

Output is a function of the recipe and its inputs alone, so a rebuild writes the same bytes.
Converted sources are cached under ``DIR/.cache`` (keyed by the source spec), so an
interrupted build restarts without reloading the sources it had finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from rstar2_data.benchmarks import BenchmarkSpec
from rstar2_data.converters import RowError, get_converter
from rstar2_data.converters.base import Converter, RowKind
from rstar2_data.converters.math_sources import MappedMath
from rstar2_data.demo import demo_problems, demo_transcripts
from rstar2_data.errors import describe_validation_error
from rstar2_data.filters import (
    Decontaminate,
    Dedup,
    Difficulty,
    Filter,
    FilterReport,
    IntegerAnswer,
    LabelVerification,
    Row,
    load_tallies,
)
from rstar2_data.jsonl import atomic_write_bytes, jsonl_bytes
from rstar2_data.loading import iter_hub, iter_local, iter_source
from rstar2_data.recipe import (
    DecontaminateSpec,
    DedupSpec,
    FilterSpec,
    IntegerAnswerSpec,
    LabelVerificationSpec,
    Recipe,
    SourceSpec,
)
from rstar2_data.rows import read_rows, rows_bytes

logger = logging.getLogger(__name__)
MANIFEST = "manifest.json"
T = TypeVar("T")


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
    data_file: str
    format: str
    rows: int
    content_sha256: str
    sources: list[SourceReport]
    filters: list[FilterReport]


def _progress(enabled: bool) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
    )


def _origin(spec: SourceSpec) -> str:
    if spec.hub is not None:
        return f"hub:{spec.hub}" + (f"/{spec.config}" if spec.config else "") + f"[{spec.split}]"
    return f"file:{spec.path}" if spec.path is not None else f"synthetic:{spec.synthetic}"


def _convert(
    spec: SourceSpec, rows: Iterable[dict[str, Any]]
) -> tuple[list[Row], int, Counter[str]]:
    """Converted rows, rows read, and malformed rows per reason."""
    converter: Converter[Any] = (
        get_converter(spec.converter) if spec.converter is not None else MappedMath(spec.fields)
    )
    out: list[Row] = []
    malformed: Counter[str] = Counter()
    read = 0
    for index, row in enumerate(rows):
        read += 1
        try:
            out.append(converter.convert(row, source=spec.name, index=index))
        except RowError as error:
            if not malformed[error.reason]:
                logger.warning("%s row %d: %s (first of its kind)", spec.name, index, error)
            malformed[error.reason] += 1
    return out, read, malformed


def _demo_rows(spec: SourceSpec, recipe: Recipe) -> list[Row]:
    assert spec.demo is not None  # SourceSpec validation: synthetic sources have options
    options = spec.demo
    if recipe.kind == "math":
        return list(
            demo_problems(
                options.n,
                seed=recipe.seed,
                levels=options.levels,
                families=options.families,
                split=options.split,
                heldout_share=options.heldout_share,
            )
        )
    return list(
        demo_transcripts(
            options.n,
            seed=recipe.seed,
            levels=options.levels,
            families=options.families,
            failure_share=options.failure_share,
            direct_share=options.direct_share,
            split=options.split,
            heldout_share=options.heldout_share,
        )
    )


def _tracked(items: Iterable[T], progress: Progress, description: str) -> Iterator[T]:
    task = progress.add_task(description, total=None)
    for item in items:
        yield item
        progress.advance(task)
    progress.update(task, completed=progress.tasks[task].completed)


def _load_source(
    spec: SourceSpec, recipe: Recipe, cache_dir: Path, progress: Progress
) -> tuple[list[Row], int, dict[str, int]]:
    key = hashlib.sha256(
        json.dumps(
            [recipe.kind, recipe.seed, spec.model_dump(mode="json")], sort_keys=True
        ).encode()
    ).hexdigest()[:16]
    data_path, info_path = (
        cache_dir / f"{spec.name}-{key}.jsonl",
        cache_dir / f"{spec.name}-{key}.json",
    )
    if data_path.exists() and info_path.exists():
        info = json.loads(info_path.read_text())
        logger.info("source %s: reusing %s", spec.name, data_path)
        return read_rows(data_path, kind=recipe.kind), info["rows_read"], info["malformed"]
    if spec.synthetic is not None:
        rows = _demo_rows(spec, recipe)
        read, malformed = len(rows), Counter[str]()
    else:
        raw = iter_source(hub=spec.hub, path=spec.path, config=spec.config, split=spec.split)
        rows, read, malformed = _convert(spec, _tracked(raw, progress, f"source {spec.name}"))
    atomic_write_bytes(
        data_path, jsonl_bytes(r.model_dump(mode="json", exclude_none=True) for r in rows)
    )
    atomic_write_bytes(
        info_path, json.dumps({"rows_read": read, "malformed": dict(malformed)}).encode()
    )
    return rows, read, dict(sorted(malformed.items()))


def _targets(recipe: Recipe) -> dict[str, int | None]:
    weights = {s.name: s.weight for s in recipe.sources if s.weight is not None}
    total_weight = sum(weights.values())
    targets: dict[str, int | None] = {}
    for spec in recipe.sources:
        if spec.weight is not None and recipe.total is not None:
            targets[spec.name] = max(1, round(recipe.total * spec.weight / total_weight))
        else:
            targets[spec.name] = spec.count
    return targets


def _sample(rows: list[Row], target: int | None, rng: random.Random) -> list[Row]:
    if target is None or target >= len(rows):
        return rows
    return [rows[i] for i in sorted(rng.sample(range(len(rows)), target))]


def _benchmark_rows(bench: BenchmarkSpec) -> Iterator[dict[str, Any]]:
    """A benchmark's rows: its local file when it names one, else every config on the hub."""
    if bench.path is not None:
        yield from iter_local(bench.path)
        return
    assert bench.hub is not None  # BenchmarkSpec validation: hub or path
    for config in bench.hub.configs:
        yield from iter_hub(bench.hub.path, config=config, split=bench.hub.split)


def _benchmark_texts(spec: DecontaminateSpec) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for bench in spec.benchmarks:
        found = []
        for number, row in enumerate(_benchmark_rows(bench), start=1):
            problem = bench.fields.find(row, "problem")
            if problem is None or not isinstance(problem[1], str):
                names = " or ".join(repr(name) for name in bench.fields.problem)
                raise BuildError(f"benchmark {bench.name}: row {number} has no string {names}")
            found.append(problem[1])
        texts[bench.name] = found
    return texts


def make_filter(spec: FilterSpec) -> Filter:
    """The filter a recipe entry describes (loading its benchmarks or graded samples)."""
    if isinstance(spec, IntegerAnswerSpec):
        return IntegerAnswer(max_abs=spec.max_abs)
    if isinstance(spec, DedupSpec):
        return Dedup(mode=spec.mode)
    if isinstance(spec, DecontaminateSpec):
        return Decontaminate(_benchmark_texts(spec), n=spec.n, min_matches=spec.min_matches)
    if isinstance(spec, LabelVerificationSpec):
        return LabelVerification(
            load_tallies(spec.samples),
            min_correct=spec.min_correct,
            keep_ungraded=spec.keep_ungraded,
        )
    return Difficulty(
        load_tallies(spec.samples), max_correct=spec.max_correct, keep_ungraded=spec.keep_ungraded
    )


def _check_unique_ids(rows: Sequence[Row]) -> None:
    counts = Counter(row.id for row in rows)
    repeated = sorted(i for i, n in counts.items() if n > 1)
    if repeated:
        raise BuildError(
            f"{len(repeated)} ids occur more than once (e.g. {repeated[:3]}); "
            "add a dedup filter or give the sources distinct ids"
        )


def build(recipe: Recipe, out_dir: Path, *, progress: bool = True) -> Manifest:
    """Build ``recipe`` into ``out_dir`` (``data.<format>`` and ``manifest.json``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / ".cache"
    targets = _targets(recipe)
    rows: list[Row] = []
    reports: list[SourceReport] = []
    with _progress(progress) as bars:
        for spec in recipe.sources:
            converted, read, malformed = _load_source(spec, recipe, cache_dir, bars)
            taken = _sample(
                converted, targets[spec.name], random.Random(f"{recipe.seed}:{spec.name}")
            )
            rows.extend(taken)
            reports.append(
                SourceReport(
                    name=spec.name,
                    origin=_origin(spec),
                    rows_read=read,
                    converted=len(converted),
                    malformed=malformed,
                    requested=targets[spec.name],
                    taken=len(taken),
                )
            )
            logger.info(
                "source %s: %d read, %d converted, %d taken",
                spec.name,
                read,
                len(converted),
                len(taken),
            )
        filter_reports = []
        for filter_spec in recipe.filters:
            rows, report = make_filter(filter_spec).apply(rows)
            filter_reports.append(report)
            logger.info("filter %s: removed %s", report.name, report.removed)
    _check_unique_ids(rows)
    if recipe.output.shuffle:
        random.Random(f"{recipe.seed}:shuffle").shuffle(rows)
    data_file = f"data.{recipe.output.format}"
    payload = rows_bytes(rows, kind=recipe.kind, fmt=recipe.output.format)
    atomic_write_bytes(out_dir / data_file, payload)
    manifest = Manifest(
        recipe=recipe.name,
        kind=recipe.kind,
        seed=recipe.seed,
        recipe_sha256=hashlib.sha256(recipe.model_dump_json().encode()).hexdigest(),
        data_file=data_file,
        format=recipe.output.format,
        rows=len(rows),
        content_sha256=hashlib.sha256(payload).hexdigest(),
        sources=reports,
        filters=filter_reports,
    )
    atomic_write_bytes(out_dir / MANIFEST, (manifest.model_dump_json(indent=2) + "\n").encode())
    return manifest


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
    if hashlib.sha256(path.read_bytes()).hexdigest() != manifest.content_sha256:
        raise BuildError(f"{path} does not match the content hash in its manifest")
    return read_rows(path, kind=manifest.kind)
