"""Where a dataset's rows are and which of their fields hold a math problem.

``FieldMap`` maps the columns of a math source (a recipe's source, an evaluation benchmark) to
a ``MathProblem``; ``BenchmarkSpec`` describes one evaluation benchmark: rstar2-eval's registry
is a list of them, and a recipe's ``decontaminate`` filter names the ones to check against.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

AnswerFormat = Literal["math", "choice", "code", "instructions"]
"""How a benchmark's answers are graded: mathematical equivalence, a choice letter, a program
run against the problem's tests (rstar2-eval's code benchmarks), or a response checked against
the prompt's verifiable instructions (IFEval)."""

FieldRole = Literal["id", "problem", "answer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def resolve_path(value: Path | None, info: ValidationInfo) -> Path | None:
    """A relative path resolved against the validation context's ``base_dir`` (a recipe's
    folder), where it must exist; without that context, the path as given."""
    if value is None:
        return None
    base = (info.context or {}).get("base_dir")
    if base is None:
        return value
    path = value if value.is_absolute() else Path(base) / value
    if not path.exists():
        raise ValueError(f"path does not exist: {path}")
    return path


DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
"""The local files rows are read from: JSON Lines (``.json`` too: one object per line) or
Parquet."""
DATA_SUFFIXES_TEXT = ".jsonl, .json or .parquet"


def resolve_data_path(value: Path | None, info: ValidationInfo) -> Path | None:
    """``resolve_path`` for a file of rows, whose suffix must be one of ``DATA_SUFFIXES``: it
    says how the file is read, so any other (``.csv``) is refused before a build starts."""
    if value is not None and value.suffix.lower() not in DATA_SUFFIXES:
        hint = " (convert it to JSON Lines or Parquet)" if value.suffix.lower() == ".csv" else ""
        raise ValueError(f"expected a {DATA_SUFFIXES_TEXT} file, got {value.name}{hint}")
    return resolve_path(value, info)


def lookup(row: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` ("reward_model.ground_truth"), or None when absent."""
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or value.get(part) is None:
            return None
        value = value[part]
    return value


class FieldMap(_Strict):
    """Which fields of a row hold its id, problem and answer.

    Each is a field name or a list of alternatives (the first one present in a row wins, as
    benchmarks rename columns between versions); dotted names reach into nested objects
    ("reward_model.ground_truth"). A row with none of its ``id`` fields is numbered by its
    position (a recipe source: ``<source>-<index>``).
    """

    id: tuple[str, ...] = Field(default=(), description="Id field(s); none: the row's position.")
    problem: tuple[str, ...] = Field(default=("problem",), min_length=1)
    answer: tuple[str, ...] = Field(default=("answer",), min_length=1)
    keep: tuple[str, ...] = Field(
        default=(),
        description="Recipe sources: fields copied into the row's metadata (a benchmark keeps "
        "every field it does not map).",
    )

    @field_validator("id", "problem", "answer", "keep", mode="before")
    @classmethod
    def _one_or_several(cls, value: object) -> object:
        if value is None:
            return ()
        return (value,) if isinstance(value, str) else value

    def find(self, row: Mapping[str, Any], role: FieldRole) -> tuple[str, Any] | None:
        """``(field name, value)`` of the first of ``role``'s fields present in ``row``."""
        names: tuple[str, ...] = getattr(self, role)
        for name in names:
            value = lookup(row, name)
            if value is not None:
                return name, value
        return None


class HubSource(_Strict):
    """A dataset on the Hugging Face hub; several configs are concatenated in order."""

    path: str = Field(min_length=1, description="Hub dataset id.")
    configs: tuple[str | None, ...] = Field(default=(None,), min_length=1)
    split: str = Field(default="test", min_length=1)


class ChoiceFields(_Strict):
    """A multiple-choice benchmark stored as one correct and several incorrect option texts.

    The options are shuffled per problem with a fixed seed, lettered A, B, ..., and appended to
    the problem text; the gold answer is the correct option's letter. Rows that lack these
    fields are taken as already lettered (the answer field holds the letter).
    """

    correct: str = Field(min_length=1)
    incorrect: tuple[str, ...] = Field(min_length=1)
    seed: int = 0


class BenchmarkSpec(_Strict):
    """One evaluation benchmark: where its rows are, how they map to problems, how it is graded.

    ``hub`` (a dataset id alone means its ``test`` split) and ``path`` (a JSON Lines, JSON or
    Parquet file) say where the rows are, at least one of them. A relative ``path`` is resolved
    by the reader: against a recipe's folder, or against rstar2-eval's ``--data-dir`` (the
    registry's entries name their local copy this way).
    """

    name: str = Field(min_length=1)
    title: str = Field(default="", description="Shown in reports; default: the name.")
    hub: HubSource | None = None
    path: Path | None = None
    fields: FieldMap = FieldMap()
    answer_format: AnswerFormat = "math"
    choices: ChoiceFields | None = None
    expected_rows: int | None = Field(default=None, ge=1, description="Size of the full set.")

    _resolve_path = field_validator("path")(resolve_data_path)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)
            if isinstance(data.get("hub"), str):
                data["hub"] = {"path": data["hub"]}
            if not data.get("title"):
                data["title"] = data.get("name", "")
        return data

    @model_validator(mode="after")
    def _has_origin(self) -> Self:
        if self.hub is None and self.path is None:
            raise ValueError("give hub, path or both")
        return self
