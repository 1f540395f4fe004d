"""Instruction following (IFEval): prompts with verifiable instructions, checked by IFEval's own
checkers as lm-eval ships them (``lm_eval.tasks.ifeval``, the ``ifeval`` extra).

An IFEval row (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) becomes a
``MathProblem`` whose ``answer`` is an ``InstructionChecks`` document (JSON). The checked text
is the response's last answer block (the whole response when it has none). Each instruction is
checked strictly and loosely (IFEval's loose check also accepts the response without its first
and/or last line and without ``*``); a sample is correct when every instruction is followed
strictly: the mean over samples is IFEval's strict prompt-level accuracy.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rstar2_data.hub import HubUnreachableError, iter_hub_dataset
from rstar2_data.protocol import ANSWER_CLOSE, ANSWER_OPEN
from rstar2_data.schemas import MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.grading import Grade, InstructionResults
from rstar2_eval.loading import RowError, collect_problems, read_jsonl_objects
from rstar2_eval.registry import BenchmarkSpec

IFEVAL_EXTRA_HINT = (
    "install rstar2-eval's ifeval extra (pip install 'rstar2-eval[ifeval]': IFEval's checkers "
    "as lm-eval ships them)"
)


class InstructionChecks(BaseModel):
    """An IFEval prompt's instructions with their arguments; a problem's ``answer`` holds it as
    JSON. Arguments left empty (``None``, as the hub's rows pad them) are dropped, as IFEval's
    own evaluation drops them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["instructions"] = "instructions"
    prompt: str = Field(min_length=1)
    instruction_id_list: list[str] = Field(min_length=1)
    kwargs: list[dict[str, Any]]

    @model_validator(mode="after")
    def _one_kwargs_per_instruction(self) -> Self:
        if len(self.kwargs) != len(self.instruction_id_list):
            raise ValueError(
                f"{len(self.kwargs)} kwargs for {len(self.instruction_id_list)} instructions"
            )
        return self


def _checkers() -> Any:
    """lm-eval's IFEval module (``test_instruction_following_strict``/``_loose``)."""
    if importlib.util.find_spec("lm_eval") is None:
        raise InputError("ifeval", f"IFEval's checkers are not installed: {IFEVAL_EXTRA_HINT}")
    return importlib.import_module("lm_eval.tasks.ifeval.utils")


def known_instructions() -> frozenset[str]:
    """The instruction ids IFEval's checkers know."""
    _checkers()
    registry = importlib.import_module("lm_eval.tasks.ifeval.instructions_registry")
    return frozenset(registry.INSTRUCTION_DICT)


def ifeval_problem(
    row: Mapping[str, Any], origin: str, position: int, known: frozenset[str]
) -> MathProblem:
    """One IFEval row as a problem; RowError names the bad field."""
    try:
        checks = InstructionChecks(
            prompt=row.get("prompt"),
            instruction_id_list=row.get("instruction_id_list"),
            kwargs=[
                {k: v for k, v in kwargs.items() if v is not None}
                if isinstance(kwargs, Mapping)
                else kwargs
                for kwargs in row.get("kwargs") or []
            ],
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise RowError(first["msg"], field=str(first["loc"][0]) if first["loc"] else None) from None
    unknown = [i for i in checks.instruction_id_list if i not in known]
    if unknown:
        raise RowError(f"unknown instruction {unknown[0]!r}", field="instruction_id_list")
    key = row.get("key")
    used = {"key", "prompt", "instruction_id_list", "kwargs"}
    return MathProblem(
        id=str(key) if key is not None else str(position),
        source=origin,
        problem=checks.prompt,
        answer=checks.model_dump_json(),
        answer_kind="expression",
        metadata={k: v for k, v in row.items() if k not in used},
    )


def _rows(spec: BenchmarkSpec, data_dir: Path | None) -> tuple[str, Iterator[Any]]:
    if data_dir is not None:
        assert spec.path is not None
        path = data_dir / spec.path
        if not path.is_file():
            raise InputError(
                str(path),
                f"no local copy of {spec.name}; expected IFEval's JSON Lines (key, prompt, "
                "instruction_id_list, kwargs) at this path, or leave out `data_dir` to read "
                f"{spec.hub.path if spec.hub else 'it'} from the Hugging Face hub",
            )
        return str(path), read_jsonl_objects(path)
    assert spec.hub is not None
    hint = f"pass a folder holding a local copy ({spec.path}) as `data_dir`"
    hub = spec.hub
    rows = (
        (None, row)
        for config in hub.configs
        for row in iter_hub_dataset(hub.path, config=config, split=hub.split, hint=hint)
    )
    return hub.path, rows


def load_instruction_benchmark(spec: BenchmarkSpec, data_dir: Path | None) -> list[MathProblem]:
    """IFEval's prompts from ``data_dir`` or the hub; InputError names a bad row's file, line
    and field, and a missing checker package its extra."""
    known = known_instructions()
    origin, rows = _rows(spec, data_dir)
    try:
        return collect_problems(
            spec.name,
            rows,
            origin,
            lambda position, _line, row: ifeval_problem(row, origin, position, known),
            id_field="key",
        )
    except HubUnreachableError as error:  # rows from the hub are read lazily
        raise InputError(spec.name, str(error)) from None


def checked_text(response: str) -> str:
    """What the instructions are checked on: the last answer block, else the whole response."""
    start = response.rfind(ANSWER_OPEN)
    if start < 0:
        return response.strip()
    body = response[start + len(ANSWER_OPEN) :]
    end = body.find(ANSWER_CLOSE)
    return (body if end < 0 else body[:end]).strip()


def check_instructions(checks: InstructionChecks, response: str) -> InstructionResults:
    """Each instruction, checked strictly and loosely by IFEval's checkers."""
    utils = _checkers()
    example = utils.InputExample(
        key=0,
        instruction_id_list=checks.instruction_id_list,
        prompt=checks.prompt,
        kwargs=checks.kwargs,
    )
    text = checked_text(response)
    strict = utils.test_instruction_following_strict(example, text)
    loose = utils.test_instruction_following_loose(example, text)
    return InstructionResults(
        strict=list(strict.follow_instruction_list), loose=list(loose.follow_instruction_list)
    )


def grade_instructions(responses: Sequence[str], golds: Sequence[str]) -> list[Grade]:
    """One grade per response: correct when every instruction is followed strictly."""
    grades = []
    for response, gold in zip(responses, golds, strict=True):
        try:
            results = check_instructions(InstructionChecks.model_validate_json(gold), response)
        except LookupError as missing:  # NLTK data a checker needs (sentence counts)
            detail = " ".join(str(missing).split())[:300]
            grades.append(
                Grade(
                    correct=False,
                    status="ungradable",
                    answer=checked_text(response),
                    method="instructions",
                    detail=f"a checker's NLTK data is missing: {detail}",
                )
            )
            continue
        followed = all(results.strict)
        grades.append(
            Grade(
                correct=followed,
                status="correct" if followed else "incorrect",
                answer=checked_text(response),
                method="instructions",
                instructions=results,
            )
        )
    return grades


class InstructionScores(BaseModel):
    """IFEval's four accuracies over the checked samples (each sample counts as a response)."""

    prompt_strict: float = Field(description="Samples that follow every instruction strictly.")
    prompt_loose: float = Field(description="Samples that follow every instruction loosely.")
    instruction_strict: float = Field(description="Instructions followed strictly, of all.")
    instruction_loose: float = Field(description="Instructions followed loosely, of all.")
    checked: int = Field(description="Samples checked (ungradable ones are left out).")


def instruction_scores(grades: Sequence[Grade]) -> InstructionScores | None:
    """IFEval's accuracies over the grades that carry instruction verdicts; None without any."""
    results = [grade.instructions for grade in grades if grade.instructions is not None]
    if not results:
        return None
    strict = [verdict for r in results for verdict in r.strict]
    loose = [verdict for r in results for verdict in r.loose]
    return InstructionScores(
        prompt_strict=sum(all(r.strict) for r in results) / len(results),
        prompt_loose=sum(all(r.loose) for r in results) / len(results),
        instruction_strict=sum(strict) / len(strict),
        instruction_loose=sum(loose) / len(loose),
        checked=len(results),
    )
