"""Code wrapped by a client (rStar2-Agent's Code Judge template): it runs as CPython runs it, on the
lean tier when what it carries needs only the standard library, and the fork-server compiles the
constant wrapper once (``PrefixCache``) without changing what a run does."""

from __future__ import annotations

import base64

import pytest

from rstar2_sandbox import LocalSandbox, RunRequest, RunStatus
from rstar2_sandbox.agent_template import rstar2_agent_wrap
from rstar2_sandbox.executor.child import compiled_parts
from rstar2_sandbox.executor.prefix_cache import PrefixCache

from .conftest import cpython_run  # type: ignore[import-not-found]

in_session_loop = pytest.mark.asyncio(loop_scope="session")

PAYLOAD_LINE = "code = base64.b64decode('{}').decode()\nexec(code)\n"


def carrying(prefix: str, carried: str, suffix: str = "") -> str:
    """Code that runs ``prefix``, then ``carried`` from a base64 literal, then ``suffix``."""
    literal = base64.b64encode(carried.encode()).decode()
    return "import base64\n" + prefix + PAYLOAD_LINE.format(literal) + suffix


@pytest.mark.parametrize(
    ("code", "stdin"),
    [
        ("import math\nprint(math.comb(10, 3))", ""),
        ("n = int(input())\nn * (n + 1) // 2", "100\n"),
        ("def f(x):\n    return 1 / x\nf(0)", ""),
        ("import sys\nprint('err', file=sys.stderr)\nsys.exit(2)", ""),
        ("x = [1, 2\n", ""),
    ],
)
@in_session_loop
async def test_wrapped_code_runs_as_cpython_runs_it(
    sandbox: LocalSandbox, code: str, stdin: str
) -> None:
    wrapped = rstar2_agent_wrap(code, history=["y = 1"])
    assert sandbox.pool.tier_for(RunRequest(code=wrapped)) == "lean"
    expected = cpython_run(wrapped, stdin)
    for _ in range(2):  # the second time, from the fork-server's compiled prefix
        result = await sandbox.run(RunRequest(code=wrapped, stdin=stdin))
        assert (result.stdout, result.stderr) == (expected.stdout, expected.stderr)
        assert result.exit_code == expected.returncode


@pytest.mark.parametrize(
    "code",
    [
        # A syntax error after the prefix: nothing of the prefix runs, the error is Python's.
        carrying("print('prefix ran')\n", "print(1)", "x = (\n"),
        # The rest continues the prefix's statement (for ... else): compiled whole.
        "import base64\nfor i in range(2):\n    pass\n"
        "else: exec(base64.b64decode('cHJpbnQoJ2Vsc2UgcmFuJyk='))\n",
        # A string right after the split would become a docstring on its own: compiled whole.
        "import base64\nprint(__doc__)\n'doc' if base64.b64decode('eA==') else 0\nprint(__doc__)\n",
        # ``global`` in the rest means something else in a module of its own.
        carrying("x = 1\n", "print(x)", "global x\n"),
    ],
)
@in_session_loop
async def test_splitting_at_a_cached_prefix_changes_nothing(
    sandbox: LocalSandbox, code: str
) -> None:
    expected = cpython_run(code)
    for _ in range(2):
        result = await sandbox.run(RunRequest(code=code))
        assert (result.stdout, result.stderr) == (expected.stdout, expected.stderr)


def test_prefix_cache_compiles_a_wrapper_once() -> None:
    cache = PrefixCache()
    first = cache.split(rstar2_agent_wrap("print(1)"))
    second = cache.split(rstar2_agent_wrap("print(2)", history=["import math"]))
    assert first is not None
    assert second is not None
    assert first[0] is second[0]  # the same compiled prefix
    # The rest keeps its line numbers: padded with the prefix's lines.
    wrapped = rstar2_agent_wrap("print(1)")
    rest = first[1]
    assert len(rest.splitlines()) == len(wrapped.splitlines())
    assert rest.lstrip("\n") == wrapped[len(wrapped) - len(rest.lstrip("\n")) :]


@pytest.mark.parametrize(
    "code",
    [
        "print(1)",  # nothing carried
        "import base64\nif True:\n    exec(base64.b64decode('eA=='))\n",  # indented split line
        "from __future__ import annotations\n" + carrying("", "print(1)"),
        "x = (\n" + carrying("", "print(1)"),  # the prefix is no module of its own
        carrying("", "print(1)").replace("import base64\n", ""),  # nothing before the line
    ],
)
def test_prefix_cache_leaves_other_code_whole(code: str) -> None:
    split = PrefixCache().split(code)
    assert split is None or compiled_parts(code, split) == [compile(code, "main.py", "exec")]


def test_prefix_cache_is_bounded() -> None:
    cache = PrefixCache(max_entries=3)
    for i in range(10):
        cache.split(carrying(f"x = {i}\n", "print(x)"))
    assert len(cache._compiled) == 3


def test_compiled_parts_runs_the_prefix_then_the_rest() -> None:
    code = carrying("x = 20\n", "x += 22", "print(x)\n")
    split = PrefixCache().split(code)
    assert split is not None
    parts = compiled_parts(code, split)
    assert len(parts) == 2
    scope: dict[str, object] = {"__name__": "__main__"}
    for part in parts:
        exec(part, scope)
    assert scope["x"] == 42


@in_session_loop
async def test_status_of_wrapped_code_is_the_wrappers(sandbox: LocalSandbox) -> None:
    result = await sandbox.run(RunRequest(code=rstar2_agent_wrap("1 / 0")))
    assert result.status is RunStatus.RUNTIME_ERROR
    assert result.stderr == "ZeroDivisionError at line 1: division by zero\n  1 / 0\n"
