"""The documentation's code runs: every ```python block of every README (the root's, each
package's) and of docs/*.md, and every rstar2 command with its options named in a ```bash block.

A Python block runs on its own, in a fresh namespace and an empty working directory. A block that
cannot run here (it needs a GPU, a checkpoint, a running service, or it is a fragment of a larger
program) starts with the marker comment

    # not run by the docs tests: REASON

and is reported as skipped with that reason; it is still compiled, so its syntax is checked.
Bash blocks do not run: each line that calls an rstar2 command line is checked against that
command's ``--help``, so a renamed command or option fails here.
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.main import get_command

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/*.md")]
)
SKIP = re.compile(r"^# not run by the docs tests: (?P<reason>.+)$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>\S*)")
TOOLS = {
    "rstar2-sandbox": "rstar2_sandbox",
    "rstar2-data": "rstar2_data",
    "rstar2-scheduler": "rstar2_scheduler",
    "rstar2-eval": "rstar2_eval",
    "rstar2-train": "rstar2_train",
}
SEPARATORS = {"|", "||", "&&", ";", "&"}


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the block's first code line, 1-based
    language: str
    code: str

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file."""
    found: list[Block] = []
    lines = document.read_text(encoding="utf-8").splitlines()
    start, language, indent = -1, "", 0
    for number, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence is None:
            continue
        if start < 0:
            start, language, indent = number + 1, fence["language"], len(fence["indent"])
        else:
            code = "\n".join(text[indent:] for text in lines[start:number])
            found.append(Block(document, start + 1, language, code + "\n"))
            start = -1
    return found


ALL = [block for document in DOCUMENTS for block in blocks(document)]
PYTHON = [block for block in ALL if block.language in ("python", "py")]
BASH = [block for block in ALL if block.language in ("bash", "sh", "shell", "console")]


def test_every_document_is_found() -> None:
    names = {str(document.relative_to(ROOT)) for document in DOCUMENTS}
    assert {"README.md", "docs/architecture.md"} <= names
    assert len([name for name in names if name.startswith("packages/")]) == len(TOOLS) + 1
    assert PYTHON
    assert BASH


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Padded so that a traceback's line numbers are the document's.
    source = "\n" * (block.line - 1) + block.code
    compiled = compile(
        source, str(block.document), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    skip = SKIP.match(block.code.splitlines()[0])
    if skip is not None:
        pytest.skip(f"{block}: {skip['reason']}")
    monkeypatch.chdir(tmp_path)
    exec(compiled, {"__name__": "__main__"})


def commands(block: Block) -> list[list[str]]:
    """The rstar2 command lines of a bash block, each as its words from the tool's name on."""
    logical = block.code.replace("\\\n", " ")
    found = []
    for line in logical.splitlines():
        if not any(tool in line for tool in TOOLS):
            continue  # other tools' lines (curl, vllm, nox) need not even split
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for word in [*words, ";"]:
            if word not in SEPARATORS:
                segment.append(word)
                continue
            tool = next((i for i, w in enumerate(segment) if w in TOOLS), None)
            # The tool as the command run (maybe after `uv run` or VAR=value), not an argument.
            if tool is not None and all(w in ("uv", "run") or "=" in w for w in segment[:tool]):
                found.append(segment[tool:])
            segment = []
    return found


COMMANDS = [(block, words) for block in BASH for words in commands(block)]


def test_bash_blocks_name_rstar2_commands() -> None:
    assert {words[0] for _, words in COMMANDS} == set(TOOLS)


@pytest.mark.parametrize(
    ("block", "words"), COMMANDS, ids=[f"{b} {' '.join(w[:2])}" for b, w in COMMANDS]
)
def test_bash_command_and_options_exist(block: Block, words: list[str]) -> None:
    group = get_command(importlib.import_module(TOOLS[words[0]] + ".cli").app)
    name = words[1] if len(words) > 1 and not words[1].startswith("-") else None
    context = group.make_context(words[0], [], resilient_parsing=True)
    command = group.get_command(context, name) if name else group  # type: ignore[attr-defined]
    assert command is not None, f"{block}: {words[0]} has no command {name!r}"
    known = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
    for word in words[1:]:
        option = word.split("=", 1)[0]
        if option.startswith("--"):
            assert option in known, f"{block}: {words[0]} {name or ''} has no option {option}"
