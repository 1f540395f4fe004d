"""Converters of math problem/answer rows (RL sources) into ``MathProblem``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import ValidationError

from rstar2_data.answers import canonical_integer, unwrap_boxed
from rstar2_data.benchmarks import FieldMap, FieldRole, lookup
from rstar2_data.converters.base import Converter, RowError, RowKind, field
from rstar2_data.schemas import MathProblem


def make_problem(
    *, problem_id: str, source: str, problem: str, answer: Any, metadata: dict[str, Any]
) -> MathProblem:
    """A ``MathProblem`` with its answer normalized: integers canonical, else unwrapped text."""
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise RowError("answer is not a string or number", type(answer).__name__)
    integer = canonical_integer(answer)
    if integer is not None:
        return MathProblem(
            id=problem_id,
            source=source,
            problem=problem.strip(),
            answer=integer,
            answer_kind="integer",
            metadata=metadata,
        )
    text = unwrap_boxed(str(answer))
    if not text:
        raise RowError("empty answer")
    return MathProblem(
        id=problem_id,
        source=source,
        problem=problem.strip(),
        answer=text,
        answer_kind="expression",
        metadata=metadata,
    )


class MappedMath(Converter[MathProblem]):
    """Problem/answer rows whose fields a ``FieldMap`` names (dotted paths for nesting).

    A row without any of the id fields is ``<source>-<row index>``; ``keep`` copies fields into
    the metadata.
    """

    kind: ClassVar[RowKind] = "math"

    def __init__(self, fields: FieldMap | None = None) -> None:
        self.fields = fields if fields is not None else FieldMap()

    def _required(self, row: Mapping[str, Any], role: FieldRole) -> tuple[str, Any]:
        found = self.fields.find(row, role)
        if found is None:
            raise RowError(f"missing field {' or '.join(getattr(self.fields, role))}")
        return found

    def problem_text(self, row: Mapping[str, Any]) -> str:
        name, value = self._required(row, "problem")
        if not isinstance(value, str):
            raise RowError(f"field {name} is not a string", type(value).__name__)
        if not value.strip():
            raise RowError(f"empty field {name}")
        return value

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> MathProblem:
        found_id = self.fields.find(row, "id")
        metadata = {
            name: value for name in self.fields.keep if (value := lookup(row, name)) is not None
        }
        return make_problem(
            problem_id=str(found_id[1]) if found_id is not None else f"{source}-{index}",
            source=source,
            problem=self.problem_text(row),
            answer=self._required(row, "answer")[1],
            metadata=metadata,
        )


class Rows(Converter[MathProblem]):
    """Rows already in the ``MathProblem`` schema, e.g. the output of an earlier build."""

    kind: ClassVar[RowKind] = "math"

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> MathProblem:
        try:
            return MathProblem.model_validate(row)
        except ValidationError as error:
            where = ".".join(str(p) for p in error.errors()[0]["loc"])
            raise RowError("not a MathProblem row", where) from error


class DapoRaw(MappedMath):
    """``BytedTsinghua-SIA/DAPO-Math-17k``: the problem sits inside a chat prompt with an
    instruction around it ("Solve the following math problem step by step...", "Remember to put
    your answer on its own line after \\"Answer:\\"."), which is stripped. Each prompt repeats
    about 100 times; the dedup filter removes the copies.
    """

    _PREFIX = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
    _SUFFIX = re.compile(r"\n\nRemember to put your answer on its own line after .*$", re.DOTALL)

    def __init__(self) -> None:
        super().__init__(
            FieldMap(problem="prompt", answer="reward_model.ground_truth", id="extra_info.index")
        )

    def problem_text(self, row: Mapping[str, Any]) -> str:
        prompt = field(row, "prompt")
        if not isinstance(prompt, list) or not prompt or not isinstance(prompt[0], Mapping):
            raise RowError("prompt is not a list of messages")
        content = prompt[0].get("content")
        if not isinstance(content, str):
            raise RowError("prompt message has no string content")
        text = self._SUFFIX.sub("", self._PREFIX.sub("", content.strip()))
        if not text.strip():
            raise RowError("empty field prompt")
        return text


class OpenMathReasoning(MappedMath):
    """``nvidia/OpenMathReasoning``: keeps rows whose answer was extracted from the source
    (``problem_type`` "has_answer_extracted"); proofs and model-voted answers are rejected.
    """

    def __init__(self) -> None:
        super().__init__(
            FieldMap(
                problem="problem", answer="expected_answer", keep=("problem_source", "problem_type")
            )
        )

    def convert(self, row: Mapping[str, Any], *, source: str, index: int) -> MathProblem:
        kind = row.get("problem_type")
        if kind != "has_answer_extracted":
            raise RowError("answer not extracted from the source", str(kind))
        return super().convert(row, source=source, index=index)
