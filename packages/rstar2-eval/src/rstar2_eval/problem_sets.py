"""Named sets of problems to evaluate: registry benchmarks, or problems from files or memory.

``--benchmarks`` takes a comma-separated list whose entries are a registry name (``aime24``) or
``NAME=PATH``, where PATH is an rstar2-data build directory (``rstar2-data build ... --out DIR``)
or a JSON Lines file of ``MathProblem`` rows (``demo=data/demo-heldout``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rstar2_data.jsonl import DataFileError, read_models
from rstar2_data.schemas import MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.loading import load_benchmark
from rstar2_eval.registry import BENCHMARKS, get_benchmark
from rstar2_eval.verification import AnswerFormat

SourceKind = Literal["registry", "build", "jsonl", "memory"]
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def absolute_path(path: str) -> str:
    """``path`` from the working directory, as an absolute path (symbolic links kept): what a
    run records, so that its files are found again from any folder (``score``, ``--resume``)."""
    return os.path.abspath(os.path.expanduser(path))


class ProblemSource(BaseModel):
    """Where a problem set comes from: one entry of ``benchmarks``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME.pattern, description="Name in reports and generation files.")
    kind: SourceKind
    path: str | None = Field(
        default=None,
        description="The build directory or JSONL file (a relative path is taken from the "
        "working directory and kept absolute).",
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        return None if path is None else absolute_path(path)

    @property
    def spec(self) -> str:
        """This source as a ``benchmarks`` entry."""
        return self.name if self.path is None else f"{self.name}={self.path}"


class ProblemSet(BaseModel):
    """Problems evaluated and reported together under one name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME.pattern)
    title: str
    answer_format: AnswerFormat = "math"
    source: ProblemSource
    problems: list[MathProblem] = Field(min_length=1)

    @classmethod
    def of(
        cls, name: str, problems: Sequence[MathProblem], *, answer_format: AnswerFormat = "math"
    ) -> ProblemSet:
        """A set of problems held in memory (e.g. a held-out split during training)."""
        return cls(
            name=name,
            title=name,
            answer_format=answer_format,
            source=ProblemSource(name=name, kind="memory"),
            problems=list(problems),
        )

    @classmethod
    def registry(cls, name: str, data_dir: Path | None = None) -> ProblemSet:
        """A registry benchmark, from ``data_dir`` when given, else from the hub."""
        spec = get_benchmark(name)
        return cls(
            name=name,
            title=spec.title,
            answer_format=spec.answer_format,
            source=ProblemSource(name=name, kind="registry"),
            problems=load_benchmark(spec, data_dir),
        )

    def head(self, limit: int | None) -> ProblemSet:
        """The first ``limit`` problems (all of them when ``limit`` is None)."""
        if limit is None or limit >= len(self.problems):
            return self
        return self.model_copy(update={"problems": self.problems[:limit]})

    def sha256(self) -> str:
        """A hash of the problems' content: a resumed run checks its problems did not change."""
        digest = hashlib.sha256()
        for problem in self.problems:
            digest.update(problem.model_dump_json().encode())
            digest.update(b"\n")
        return digest.hexdigest()


def parse_sources(spec: str | Sequence[str]) -> list[ProblemSource]:
    """The entries of a ``benchmarks`` value (a comma-separated string or a list of entries)."""
    entries = spec.split(",") if isinstance(spec, str) else list(spec)
    sources: list[ProblemSource] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            raise InputError("benchmarks", f"empty entry in {spec!r}")
        name, sep, path = entry.partition("=")
        name = name.strip()
        if not _NAME.match(name):
            raise InputError(
                "benchmarks",
                f"{name!r} is not a valid name (lower-case letters, digits, '.', '_', '-')",
            )
        if any(source.name == name for source in sources):
            raise InputError("benchmarks", f"{name!r} is given twice")
        if not sep:
            if name not in BENCHMARKS:
                raise InputError(
                    "benchmarks",
                    f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}, or "
                    "NAME=PATH for a problem file or rstar2-data build directory",
                )
            sources.append(ProblemSource(name=name, kind="registry"))
            continue
        if name in BENCHMARKS:
            raise InputError(
                "benchmarks",
                f"{name!r} is a registry benchmark; give the problems at {path} another name",
            )
        location = Path(path.strip()).expanduser()
        if location.is_dir():
            kind: SourceKind = "build"
        elif location.is_file():
            kind = "jsonl"
        else:
            raise InputError(
                "benchmarks",
                f"{name}={path}: no such file or directory; expected an rstar2-data build "
                "directory or a JSON Lines file of MathProblem rows",
            )
        sources.append(ProblemSource(name=name, kind=kind, path=str(location)))
    if not sources:
        raise InputError("benchmarks", "expected at least one benchmark")
    return sources


def load_source(source: ProblemSource, data_dir: Path | None = None) -> ProblemSet:
    """Load the problems of one source (registry benchmarks from ``data_dir`` or the hub)."""
    if source.kind == "registry":
        return ProblemSet.registry(source.name, data_dir)
    if source.path is None or source.kind == "memory":
        raise InputError(source.name, "problems held in memory cannot be loaded again")
    path = Path(source.path)
    problems = _read_build(path) if source.kind == "build" else _read_jsonl(path)
    if not problems:
        raise InputError(str(path), "holds no problems")
    _check_unique(problems, str(path))
    return ProblemSet(name=source.name, title=source.name, source=source, problems=problems)


def load_problem_sets(spec: str | Sequence[str], data_dir: Path | None = None) -> list[ProblemSet]:
    """Every set of a ``benchmarks`` value, in order."""
    return [load_source(source, data_dir) for source in parse_sources(spec)]


def recorded_problem_sets(run_file: Path, data_dir: Path | None = None) -> list[ProblemSet]:
    """The problem sets an evaluation's ``run.json`` records, loaded again and limited as the run
    was (registry benchmarks from ``data_dir``, else the run's ``--data-dir``, else the hub);
    InputError when a set cannot be reloaded or its problems changed since the run."""
    try:
        record = json.loads(run_file.read_bytes())
        spec = record["spec"]
        recorded_dir = (record.get("options") or {}).get("data_dir")
        if data_dir is None and recorded_dir is not None:
            data_dir = Path(recorded_dir)
        limit = spec["settings"].get("limit")
        records = [
            (ProblemSource.model_validate(r["source"]), r["sha256"]) for r in spec["problem_sets"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(str(run_file), f"not an rstar2-eval run.json: {error!r}") from None
    sets: list[ProblemSet] = []
    for source, sha256 in records:
        if source.kind == "memory":
            raise InputError(
                str(run_file),
                f"the run's problem set {source.name!r} was passed in memory; name its file with "
                f"`benchmarks` as {source.name}=PATH",
            )
        problem_set = load_source(source, data_dir).head(limit)
        if problem_set.sha256() != sha256:
            raise InputError(
                str(run_file),
                f"the problems of {source.name} ({source.path or 'registry'}) differ from those "
                "the run evaluated",
            )
        sets.append(problem_set)
    return sets


def _read_build(path: Path) -> list[MathProblem]:
    from rstar2_data.build import BuildError, load_built, read_manifest

    try:
        manifest = read_manifest(path)
        if manifest.kind != "math":
            raise InputError(
                str(path), f"holds {manifest.kind} rows; evaluation needs math problems"
            )
        rows = load_built(path)
    except (BuildError, DataFileError, OSError) as error:
        raise InputError(str(path), str(error)) from None
    return [row for row in rows if isinstance(row, MathProblem)]


def _read_jsonl(path: Path) -> list[MathProblem]:
    try:
        return read_models(path, MathProblem)
    except DataFileError as error:
        raise InputError(str(path), error.reason, line=error.line) from None


def _check_unique(problems: Sequence[MathProblem], origin: str) -> None:
    seen: set[str] = set()
    for problem in problems:
        if problem.id in seen:
            raise InputError(origin, f"duplicate problem id {problem.id!r}", field="id")
        seen.add(problem.id)
