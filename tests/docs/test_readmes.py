"""The documentation's code runs: every ```python block and every ```bash block that calls an
rstar2 command line, of every README (the root's, each package's) and of docs/*.md.

Each block runs on its own, in a fresh namespace (Python) or a fresh ``bash -euo pipefail``
(``uv run X`` runs X from this environment), in an empty working directory, and must print its
result on stdout. A block that names ``runs/demo`` finds there a copy of what
``rstar2-train demo --quick`` wrote, made once per session (about a minute). A block that cannot
run here (it needs a GPU, the model hub, a running service, several machines, or minutes of
benchmark, or it is a fragment of a larger program) follows, on the line before its fence, the
HTML comment (hidden where the Markdown is rendered, so the reader's copy of the block is clean)

    <!-- not run by the docs tests: REASON -->

and is reported as skipped with that reason; a Python one is still compiled, so its syntax is
checked. Every rstar2 command with its options named in any bash block, run or not, is checked
against that command's ``--help``, so a renamed command or option fails here.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.main import get_command

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/*.md")]
)
SKIP = re.compile(r"^ *<!-- not run by the docs tests: (?P<reason>.+) -->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>\S*)")
TOOLS = {
    "rstar2-sandbox": "rstar2_sandbox",
    "rstar2-data": "rstar2_data",
    "rstar2-scheduler": "rstar2_scheduler",
    "rstar2-eval": "rstar2_eval",
    "rstar2-train": "rstar2_train",
}
SEPARATORS = {"|", "||", "&&", ";", "&"}
# The session's environment: its command lines, as `uv run` would find them in a checkout.
BIN = Path(sys.executable).parent
# `uv run X` in a block runs X from this environment (no project lookup from a temporary folder).
BASH_PREAMBLE = 'uv() { if [ "$1" = run ]; then shift; "$@"; else command uv "$@"; fi; }\n'
DEMO_TIMEOUT_S = 1800
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the block's first code line, 1-based
    language: str
    code: str
    skip: str | None = None
    """Why the docs tests do not run it (the comment before its fence), if they do not."""

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
            marked = SKIP.match(lines[number - 1]) if number > 0 else None
            skip = marked["reason"] if marked is not None else None
        else:
            code = "\n".join(text[indent:] for text in lines[start:number])
            found.append(Block(document, start + 1, language, code + "\n", skip))
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


def test_notes_for_the_docs_tests_stay_out_of_the_code_readers_copy() -> None:
    noted = [block for block in ALL if "not run by the docs tests" in block.code]
    assert noted == [], [str(block) for block in noted]
    assert [block for block in ALL if block.skip is not None]  # the comments are read


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``runs`` folder of ``rstar2-train demo --quick``, run once per session as a user
    would, from its own folder with the default ``--out runs/demo``."""
    home = tmp_path_factory.mktemp("demo-home")
    log = home / "demo.log"
    with log.open("w") as sink:
        done = subprocess.run(
            [str(BIN / "rstar2-train"), "demo", "--quick"],
            cwd=home,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=DEMO_TIMEOUT_S,
            check=False,
        )
    assert done.returncode == 0, f"rstar2-train demo --quick failed:\n{log.read_text()[-4000:]}"
    return home / "runs"


def _workdir(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """An empty folder for the block, holding a copy of the demo's output if the block uses it."""
    if "runs/demo" in block.code:
        demo: Path = request.getfixturevalue("demo_runs")
        shutil.copytree(demo, tmp_path / "runs")


def _skip_if_marked(block: Block) -> None:
    if block.skip is not None:
        pytest.skip(f"{block}: {block.skip}")


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block_runs(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    # Padded so that a traceback's line numbers are the document's.
    source = "\n" * (block.line - 1) + block.code
    compiled = compile(
        source, str(block.document), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    _skip_if_marked(block)
    _workdir(block, tmp_path, request)
    monkeypatch.chdir(tmp_path)
    exec(compiled, {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), f"{block} printed nothing: an example shows its result"


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
RUNNABLE_BASH = [block for block in BASH if commands(block)]


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


@pytest.mark.parametrize("block", RUNNABLE_BASH, ids=str)
def test_bash_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _skip_if_marked(block)
    _workdir(block, tmp_path, request)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", BASH_PREAMBLE + block.code],
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block} exited with {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
        f"stderr:\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), f"{block} printed nothing on stdout: an example shows its result"


def test_the_demo_output_is_not_tracked_by_git() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "runs/demo/summary.json"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, "runs/ (where the demo writes) is not in .gitignore"


def test_the_setup_says_how_to_get_uv_and_how_much_disk_it_takes() -> None:
    setup = (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up and test", 1)[1]
    setup = " ".join(setup.split("\n## ", 1)[0].split())
    assert "astral.sh/uv/install.sh" in setup
    assert "uv cache dir" in setup
    assert re.search(r"\d+(\.\d+)? GB", setup)
