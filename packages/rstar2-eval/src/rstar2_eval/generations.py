"""The ``score`` input: one JSON line per generated response."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rstar2_eval.errors import InputError
from rstar2_eval.loading import read_jsonl_objects


class Generation(BaseModel):
    """One sampled response to one benchmark problem, with optional rollout statistics."""

    # Ids may come as JSON numbers (aime24 uses 60..89); they are compared as strings.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    benchmark: str = Field(min_length=1, description="Registry name, e.g. aime24.")
    problem_id: str = Field(min_length=1, description="Id of the problem within its benchmark.")
    sample_index: int = Field(ge=0, description="Which of the k samples of this problem.")
    response: str = Field(description="The full response text (all assistant turns).")
    response_tokens: int | None = Field(default=None, ge=0, description="Response length.")
    tool_calls: int | None = Field(default=None, ge=0, description="Tool calls made.")
    tool_errors: int | None = Field(default=None, ge=0, description="Tool calls that failed.")
    truncated: bool | None = Field(default=None, description="Ran out of response budget.")

    @model_validator(mode="after")
    def _errors_within_calls(self) -> Generation:
        if (
            self.tool_errors is not None
            and self.tool_calls is not None
            and self.tool_errors > self.tool_calls
        ):
            raise ValueError(
                f"tool_errors ({self.tool_errors}) exceeds tool_calls ({self.tool_calls})"
            )
        return self


class NumberedGeneration(BaseModel):
    """A generation with the input line it came from, for error messages downstream."""

    model_config = ConfigDict(frozen=True)

    line: int
    generation: Generation


def read_generations(path: Path) -> list[NumberedGeneration]:
    """Parse a generations JSONL file; InputError names the line and field of any bad entry.

    Blank lines are skipped; a repeated (benchmark, problem_id, sample_index) is an error.
    """
    generations: list[NumberedGeneration] = []
    seen: dict[tuple[str, str, int], int] = {}
    for line, row in read_jsonl_objects(path):
        try:
            generation = Generation.model_validate(row)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or None
            raise InputError(str(path), first["msg"], line=line, field=field) from None
        key = (generation.benchmark, generation.problem_id, generation.sample_index)
        if key in seen:
            raise InputError(
                str(path),
                f"sample {generation.sample_index} of {generation.benchmark}/"
                f"{generation.problem_id} already appeared on line {seen[key]}",
                line=line,
                field="sample_index",
            )
        seen[key] = line
        generations.append(NumberedGeneration(line=line, generation=generation))
    if not generations:
        raise InputError(str(path), "no generations in this file")
    return generations
