"""Recipe files: YAML validated by pydantic, with errors that name the field and the problem.

Relative paths resolve against the recipe file's folder; ``${NAME}`` placeholders are filled
from ``variables`` (``rstar2-data build --var NAME=VALUE``) before parsing.
"""

from __future__ import annotations

import string
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rstar2_data.benchmarks import BenchmarkSpec, FieldMap, resolve_data_path, resolve_path
from rstar2_data.converters import CONVERTERS, get_converter
from rstar2_data.converters.base import RowKind
from rstar2_data.demo.generator import DEFAULT_HELDOUT_SHARE, Split
from rstar2_data.demo.tasks import FAMILIES, Level
from rstar2_data.errors import describe_yaml_error
from rstar2_data.filters import (
    DEFAULT_BOILERPLATE,
    DEFAULT_COVERAGE,
    DEFAULT_MAX_ABS,
    DEFAULT_NGRAM,
    DEFAULT_SHORT_WORDS,
    DedupMode,
)


class RecipeError(ValueError):
    """A recipe that cannot be loaded; the message says where and what was expected."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DemoOptions(_Strict):
    """Parameters of the synthetic demo source."""

    n: int = Field(gt=0, description="How many problems or transcripts.")
    levels: tuple[Level, ...] = (1, 2, 3)
    families: tuple[str, ...] = tuple(FAMILIES)
    failure_share: float = Field(
        default=0.25, ge=0, le=1, description="Transcripts: share that fix a failed tool call."
    )
    direct_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Transcripts: share of the level-1 ones (without a failure) that answer "
        "without calling the tool.",
    )
    split: Split = Field(
        default="all",
        description="train or heldout: one side of a fixed hash partition of the problems, so "
        "a training recipe and a held-out recipe never share a problem; all: every draw.",
    )
    heldout_share: float = Field(
        default=DEFAULT_HELDOUT_SHARE, gt=0, lt=1, description="Share of problems held out."
    )

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}; expected some of {sorted(FAMILIES)}")
        return value


class SourceSpec(_Strict):
    """One input: a hub dataset, a local file, or the synthetic demo."""

    name: str = Field(min_length=1, description="Label in the manifest; also seeds sampling.")
    hub: str | None = Field(default=None, description="Hugging Face dataset id.")
    path: Path | None = Field(default=None, description="Local .jsonl, .json or .parquet file.")
    synthetic: Literal["demo"] | None = None
    config: str | None = Field(default=None, description="Hub dataset config (subset).")
    split: str = "train"
    converter: str | None = Field(default=None, description="A registered converter name.")
    fields: FieldMap | None = Field(default=None, description="Column mapping for math rows.")
    demo: DemoOptions | None = None
    count: int | None = Field(default=None, gt=0, description="Take this many rows (seeded).")
    weight: float | None = Field(default=None, gt=0, description="Share of the recipe's total.")

    _resolve_path = field_validator("path")(resolve_data_path)

    @field_validator("converter")
    @classmethod
    def _known_converter(cls, value: str | None) -> str | None:
        if value is not None and value not in CONVERTERS:
            raise ValueError(f"unknown converter {value!r}; expected one of {sorted(CONVERTERS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        origins = [k for k in ("hub", "path", "synthetic") if getattr(self, k) is not None]
        if len(origins) != 1:
            raise ValueError(f"give exactly one of hub, path, synthetic (got {origins or 'none'})")
        if self.synthetic is not None:
            if self.demo is None:
                raise ValueError("a synthetic source needs its demo options")
            if self.converter is not None or self.fields is not None:
                raise ValueError("a synthetic source takes no converter or fields")
        elif (self.converter is None) == (self.fields is None):
            raise ValueError("give exactly one of converter, fields")
        if self.count is not None and self.weight is not None:
            raise ValueError("give count or weight, not both")
        return self

    def kind(self) -> RowKind | None:
        """The row kind this source yields (None for the demo: it yields the recipe's kind)."""
        if self.fields is not None:
            return "math"
        return get_converter(self.converter).kind if self.converter else None


class IntegerAnswerSpec(_Strict):
    type: Literal["integer_answer"]
    max_abs: int = Field(default=DEFAULT_MAX_ABS, gt=0)


class DedupSpec(_Strict):
    type: Literal["dedup"]
    mode: DedupMode = "normalized"


class DecontaminateSpec(_Strict):
    type: Literal["decontaminate"]
    benchmarks: list[BenchmarkSpec] = Field(min_length=1)
    n: int = Field(default=DEFAULT_NGRAM, ge=1, description="Word n-gram size.")
    min_matches: int = Field(
        default=1, ge=1, description="Shared informative n-grams that mark a row a copy."
    )
    boilerplate: int = Field(
        default=DEFAULT_BOILERPLATE,
        ge=2,
        description="An n-gram in this many benchmark problems or more is stock phrasing and "
        "does not count.",
    )
    coverage: float = Field(
        default=DEFAULT_COVERAGE,
        ge=0,
        le=1,
        description="Share of a benchmark problem's informative n-grams a row must hold.",
    )
    short_words: int = Field(
        default=DEFAULT_SHORT_WORDS,
        ge=0,
        description="Benchmark problems shorter than this many words also get the near-copy "
        "test (0: none).",
    )


def _resolve_all(values: list[Path], info: ValidationInfo) -> list[Path]:
    return [p for p in (resolve_path(v, info) for v in values) if p is not None]


class LabelVerificationSpec(_Strict):
    type: Literal["label_verification"]
    samples: list[Path] = Field(min_length=1, description="GradedSample JSONL files.")
    min_correct: int = Field(default=2, ge=1)
    keep_ungraded: bool = False

    _resolve_samples = field_validator("samples")(_resolve_all)


class DifficultySpec(_Strict):
    type: Literal["difficulty"]
    samples: list[Path] = Field(min_length=1, description="GradedSample JSONL files.")
    max_correct: int | None = Field(default=None, ge=0, description="Default: drop n/n solved.")
    keep_ungraded: bool = False

    _resolve_samples = field_validator("samples")(_resolve_all)


FilterSpec = Annotated[
    IntegerAnswerSpec | DedupSpec | DecontaminateSpec | LabelVerificationSpec | DifficultySpec,
    Field(discriminator="type"),
]
_MATH_ONLY = (IntegerAnswerSpec, LabelVerificationSpec, DifficultySpec)


class OutputSpec(_Strict):
    format: Literal["jsonl", "parquet"] = "jsonl"
    shuffle: bool = Field(default=True, description="Seeded shuffle of the final rows.")


class Recipe(_Strict):
    """A dataset build: sources, filters in order, seed and output format."""

    name: str = Field(min_length=1)
    description: str = ""
    kind: RowKind = Field(description="math (MathProblem rows) or chat (ChatExample rows).")
    seed: int = 0
    total: int | None = Field(default=None, gt=0, description="Rows shared by weighted sources.")
    sources: list[SourceSpec] = Field(min_length=1)
    filters: list[FilterSpec] = Field(default_factory=list)
    output: OutputSpec = OutputSpec()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique: {names}")
        for source in self.sources:
            kind = source.kind()
            if kind is not None and kind != self.kind:
                raise ValueError(
                    f"source {source.name!r} yields {kind} rows, recipe is {self.kind}"
                )
        if any(s.weight is not None for s in self.sources) and self.total is None:
            raise ValueError("weighted sources need the recipe's total")
        for spec in self.filters:
            if self.kind == "chat" and isinstance(spec, _MATH_ONLY):
                raise ValueError(f"filter {spec.type} applies to math recipes only")
        return self


def _format_errors(error: ValidationError) -> str:
    """Every problem with its field path, on one line."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<recipe>'}: {e['msg']}" for e in error.errors()
    )


def parse_recipe(
    text: str, *, base_dir: Path, origin: str, variables: dict[str, str] | None = None
) -> Recipe:
    """A recipe from YAML text; ``RecipeError`` lists every problem with its field path."""
    try:
        text = string.Template(text).substitute(variables or {})
    except KeyError as error:
        raise RecipeError(
            f"{origin}: variable ${{{error.args[0]}}} is not set (pass --var NAME=VALUE)"
        ) from error
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RecipeError(f"{origin}: invalid YAML: {describe_yaml_error(error)}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: expected a mapping at the top level")
    try:
        return Recipe.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as error:
        raise RecipeError(f"{origin}: invalid recipe: {_format_errors(error)}") from None


def shipped_recipes() -> dict[str, str]:
    """Names of the recipes shipped with rstar2-data -> their YAML text."""
    folder = files("rstar2_data").joinpath("recipes")
    return {
        entry.name.removesuffix(".yaml"): entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }


def load_recipe(name_or_path: str | Path, *, variables: dict[str, str] | None = None) -> Recipe:
    """A shipped recipe by name, or a recipe file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        return parse_recipe(
            path.read_text(encoding="utf-8"),
            base_dir=path.resolve().parent,
            origin=str(path),
            variables=variables,
        )
    shipped = shipped_recipes()
    if str(name_or_path) not in shipped:
        raise RecipeError(
            f"no recipe file or shipped recipe named {name_or_path!r}; shipped: {sorted(shipped)}"
        )
    return parse_recipe(
        shipped[str(name_or_path)],
        base_dir=Path.cwd(),
        origin=f"shipped recipe {name_or_path}",
        variables=variables,
    )
