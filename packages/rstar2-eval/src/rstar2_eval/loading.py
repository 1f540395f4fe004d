"""Loading benchmarks as ``MathProblem`` rows, from a local directory or the hub."""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rstar2_data.answers import canonical_integer
from rstar2_data.hub import HubUnreachableError, check_hub_dataset, iter_hub_dataset
from rstar2_data.jsonl import DataFileError, iter_jsonl_lines
from rstar2_data.schemas import AnswerKind, MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.registry import BenchmarkSpec, get_benchmark

logger = logging.getLogger(__name__)


def normalize_answer(value: object) -> tuple[str, AnswerKind]:
    """A gold answer as ``(text, kind)``: integers in canonical form ("025", 27.0 -> "25", "27").

    Raises ValueError for answers that are empty or not a string or number.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a string or number, got {type(value).__name__}")
    integer = canonical_integer(value)
    if integer is not None:
        return integer, "integer"
    text = str(value).strip()
    if not text:
        raise ValueError("expected a non-empty answer")
    return text, "expression"


def _lettered(spec: BenchmarkSpec, row: Mapping[str, Any], problem_id: str) -> tuple[str, str]:
    """Options shuffled deterministically per problem; returns (options text, gold letter)."""
    assert spec.choices is not None
    correct = str(row[spec.choices.correct]).strip()
    options = [correct] + [str(row[name]).strip() for name in spec.choices.incorrect]
    # Seeding with a string is stable across runs and Python versions (it is hashed with SHA-512).
    random.Random(f"{spec.choices.seed}:{problem_id}").shuffle(options)
    letters = string.ascii_uppercase[: len(options)]
    text = "\n".join(f"{letter}) {option}" for letter, option in zip(letters, options, strict=True))
    return text, letters[options.index(correct)]


def problem_from_row(
    spec: BenchmarkSpec, row: Mapping[str, Any], position: int, origin: str, line: int | None
) -> MathProblem:
    """Map one raw row to a ``MathProblem``; InputError names the line and field on failure."""
    found_id = spec.fields.find(row, "id")
    problem_id = str(found_id[1]) if found_id is not None else str(position)
    found_problem = spec.fields.find(row, "problem")
    if found_problem is None or not str(found_problem[1]).strip():
        raise InputError(
            origin,
            "expected a non-empty problem statement",
            line=line,
            field=spec.fields.problem[0],
        )
    problem = str(found_problem[1]).strip()
    used = {found_problem[0]} | ({found_id[0]} if found_id is not None else set())
    if spec.choices is not None and spec.choices.correct in row:
        missing = [name for name in spec.choices.incorrect if row.get(name) is None]
        if missing:
            raise InputError(origin, "expected an option text", line=line, field=missing[0])
        options, answer = _lettered(spec, row, problem_id)
        problem = f"{problem}\n\n{options}"
        kind: AnswerKind = "expression"
        used |= {spec.choices.correct, *spec.choices.incorrect}
    else:
        found_answer = spec.fields.find(row, "answer")
        if found_answer is None:
            raise InputError(origin, "expected an answer", line=line, field=spec.fields.answer[0])
        try:
            answer, kind = normalize_answer(found_answer[1])
        except ValueError as error:
            raise InputError(origin, str(error), line=line, field=found_answer[0]) from None
        used.add(found_answer[0])
    metadata = {key: value for key, value in row.items() if key not in used}
    try:
        return MathProblem(
            id=problem_id,
            source=origin,
            problem=problem,
            answer=answer,
            answer_kind=kind,
            metadata=metadata,
        )
    except ValidationError as error:
        raise InputError(origin, str(error), line=line) from None


class RowError(ValueError):
    """A benchmark row that cannot become a problem (``field``: the offending field)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


RowParser = Callable[[int, int | None, Mapping[str, Any]], MathProblem]
"""``(position, line, row) -> problem``; raises RowError (or InputError) for a bad row."""


def collect_problems(
    name: str,
    rows: Iterable[tuple[int | None, Mapping[str, Any]]],
    origin: str,
    parse: RowParser,
    *,
    id_field: str,
    id_label: str | None = None,
) -> list[MathProblem]:
    """Benchmark ``name``'s problems from ``rows`` (``(line, row)``, line None off a file):
    InputError names the line and field of a bad row (a RowError from ``parse``), of a second
    row with the same id (``id_field``, called ``id_label`` in the message), or that there were
    no rows."""
    problems: list[MathProblem] = []
    seen: dict[str, int | None] = {}
    for position, (line, row) in enumerate(rows):
        try:
            problem = parse(position, line, row)
        except RowError as error:
            raise InputError(origin, str(error), line=line, field=error.field) from None
        if problem.id in seen:
            first = seen[problem.id]
            raise InputError(
                origin,
                f"duplicate {id_label or id_field} {problem.id!r} (first at line {first})",
                line=line,
                field=id_field,
            )
        seen[problem.id] = line
        problems.append(problem)
    if not problems:
        raise InputError(origin, f"benchmark {name} has no rows")
    return problems


def _collect(
    spec: BenchmarkSpec, rows: Iterable[tuple[int | None, Mapping[str, Any]]], origin: str
) -> list[MathProblem]:
    problems = collect_problems(
        spec.name,
        rows,
        origin,
        lambda position, line, row: problem_from_row(spec, row, position, origin, line),
        id_field=spec.fields.id[0],
        id_label="problem id",
    )
    if spec.expected_rows is not None and len(problems) != spec.expected_rows:
        logger.warning(
            "%s: %d rows, the full %s has %d", origin, len(problems), spec.title, spec.expected_rows
        )
    return problems


def read_jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line; InputError on anything but an object."""
    try:
        yield from iter_jsonl_lines(path)
    except DataFileError as error:
        raise InputError(str(path), error.reason, line=error.line) from None


def load_local(spec: BenchmarkSpec, data_dir: Path) -> list[MathProblem]:
    """Read ``data_dir / spec.path`` (an absolute ``path`` as it is)."""
    if spec.path is None:
        raise InputError(str(data_dir), f"benchmark {spec.name} names no local file")
    path = data_dir / spec.path
    if not path.is_file():
        raise InputError(
            str(path), f"no local copy of {spec.name}; expected a JSON Lines file at this path"
        )
    return _collect(spec, read_jsonl_objects(path), str(path))


def _local_copy_hint(spec: BenchmarkSpec) -> str:
    return (
        f"pass a folder holding a local copy ({spec.path or spec.name + '.jsonl'}) with "
        "`data_dir` (`rstar2-eval benchmarks` lists the file names), or load it once where the "
        "hub is reachable and set HF_HUB_OFFLINE=1 to use that cached copy without trying the hub"
    )


def check_hub(spec: BenchmarkSpec) -> None:
    """An ``InputError`` at once, before ``datasets`` is imported, when the hub cannot be reached
    and the benchmark's dataset is not in the local cache (``load_hub`` would fail)."""
    if spec.hub is None:
        return  # load_hub names the missing dataset
    try:
        check_hub_dataset(spec.hub.path, hint=_local_copy_hint(spec))
    except HubUnreachableError as error:
        raise InputError(spec.name, str(error)) from None


def load_hub(spec: BenchmarkSpec) -> list[MathProblem]:
    """Download from the Hugging Face hub with ``datasets`` (needs network access, or the dataset
    in the local cache); an unreachable hub is an ``InputError`` saying how to pass a local copy.
    """
    hub = spec.hub
    if hub is None:
        raise InputError(spec.name, "the benchmark names no hub dataset; give its local copy")
    hint = _local_copy_hint(spec)

    def rows() -> Iterable[tuple[int | None, Mapping[str, Any]]]:
        for config in hub.configs:
            for row in iter_hub_dataset(hub.path, config=config, split=hub.split, hint=hint):
                yield None, row

    try:
        return _collect(spec, rows(), hub.path)
    except HubUnreachableError as error:
        raise InputError(spec.name, str(error)) from None


def load_benchmark(
    benchmark: str | BenchmarkSpec, data_dir: Path | None = None
) -> list[MathProblem]:
    """A benchmark's problems: from ``data_dir`` when given, else from the hub (a spec without a
    hub dataset: from its ``path`` as given)."""
    spec = get_benchmark(benchmark) if isinstance(benchmark, str) else benchmark
    if spec.answer_format == "code":
        from rstar2_eval.code_tasks import load_code_benchmark

        return load_code_benchmark(spec, data_dir)
    if spec.answer_format == "instructions":
        from rstar2_eval.instruction_tasks import load_instruction_benchmark

        return load_instruction_benchmark(spec, data_dir)
    if data_dir is not None or spec.hub is None:
        return load_local(spec, data_dir if data_dir is not None else Path())
    return load_hub(spec)
