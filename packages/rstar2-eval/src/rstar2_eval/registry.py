"""The benchmark registry: where each benchmark lives and how its rows map to ``MathProblem``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval.verification import AnswerFormat


class HubSource(BaseModel):
    """A dataset on the Hugging Face hub; several configs are concatenated in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="Hub dataset id.")
    configs: tuple[str | None, ...] = Field(default=(None,), min_length=1)
    split: str = Field(min_length=1)


class FieldMap(BaseModel):
    """Which row fields hold the id, the problem and the answer; the first present name wins.

    With no id field present, the row's position (0-based, across configs) is its id.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: tuple[str, ...] = ("id",)
    problem: tuple[str, ...] = ("problem",)
    answer: tuple[str, ...] = ("answer",)


class ChoiceFields(BaseModel):
    """A multiple-choice benchmark stored as one correct and several incorrect option texts.

    The options are shuffled per problem with a fixed seed, lettered A, B, ..., and appended to
    the problem text; the gold answer is the correct option's letter. Rows that lack these
    fields are taken as already lettered (the answer field holds the letter).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    correct: str = Field(min_length=1)
    incorrect: tuple[str, ...] = Field(min_length=1)
    seed: int = 0


class BenchmarkSpec(BaseModel):
    """One benchmark: its sources, field mapping and grading format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    hub: HubSource
    local_file: str = Field(description="File name under --data-dir (JSON Lines).")
    fields: FieldMap = FieldMap()
    answer_format: AnswerFormat = "math"
    choices: ChoiceFields | None = None
    expected_rows: int | None = Field(default=None, ge=1, description="Size of the full set.")


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="aime24",
            title="AIME 2024",
            hub=HubSource(path="HuggingFaceH4/aime_2024", split="train"),
            local_file="aime24.jsonl",
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="aime25",
            title="AIME 2025",
            hub=HubSource(
                path="opencompass/AIME2025", configs=("AIME2025-I", "AIME2025-II"), split="test"
            ),
            local_file="aime25.jsonl",
            fields=FieldMap(problem=("problem", "question")),
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="hmmt25",
            title="HMMT February 2025",
            hub=HubSource(path="MathArena/hmmt_feb_2025", split="train"),
            local_file="hmmt25.jsonl",
            fields=FieldMap(id=("id", "problem_idx")),
            expected_rows=30,
        ),
        BenchmarkSpec(
            name="math500",
            title="MATH-500",
            hub=HubSource(path="HuggingFaceH4/MATH-500", split="test"),
            local_file="math500.jsonl",
            fields=FieldMap(id=("unique_id", "id")),
            expected_rows=500,
        ),
        BenchmarkSpec(
            name="amc23",
            title="AMC 2023",
            hub=HubSource(path="math-ai/amc23", split="test"),
            local_file="amc23.jsonl",
            fields=FieldMap(problem=("problem", "question")),
            expected_rows=40,
        ),
        BenchmarkSpec(
            name="gpqa-diamond",
            title="GPQA-Diamond",
            hub=HubSource(path="Idavidrein/gpqa", configs=("gpqa_diamond",), split="train"),
            local_file="gpqa-diamond.jsonl",
            fields=FieldMap(id=("Record ID", "id"), problem=("Question", "problem")),
            answer_format="choice",
            choices=ChoiceFields(
                correct="Correct Answer",
                incorrect=("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
            ),
            expected_rows=198,
        ),
    )
}
"""Every known benchmark by name."""


def get_benchmark(name: str) -> BenchmarkSpec:
    """The registry entry called ``name``; a KeyError lists the known names."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        known = ", ".join(sorted(BENCHMARKS))
        raise KeyError(f"unknown benchmark {name!r}; known benchmarks: {known}") from None
