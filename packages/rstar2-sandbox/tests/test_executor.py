"""Execution semantics of the fork-server pool, through ``LocalSandbox``."""

from __future__ import annotations

import asyncio
import os

import pytest

from rstar2_sandbox import ExecutorSettings, LocalSandbox, RunRequest, RunStatus, Sandbox
from rstar2_sandbox.agent_template import rstar2_agent_wrap

from .conftest import cpython_run  # type: ignore[import-not-found]

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def run(sandbox: LocalSandbox, code: str, **options: object) -> object:
    return await sandbox.run(RunRequest(code=code, **options))  # type: ignore[arg-type]


async def test_implements_the_sandbox_protocol(sandbox: LocalSandbox) -> None:
    assert isinstance(sandbox, Sandbox)


async def test_prints_stdout_and_reads_stdin(sandbox: LocalSandbox) -> None:
    result = await sandbox.run(
        RunRequest(code="a, b = map(int, input().split())\nprint(a * b)", stdin="6 7\n")
    )
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == "42\n"
    assert result.exit_code == 0
    assert result.wall_time_s > 0


async def test_large_stdin_is_fed_whole(sandbox: LocalSandbox) -> None:
    data = "x" * 900_000
    result = await sandbox.run(
        RunRequest(code="import sys\nprint(len(sys.stdin.read()))", stdin=data)
    )
    assert result.stdout == "900000\n"


async def test_uncaught_exception_is_a_runtime_error_with_a_clean_traceback(
    sandbox: LocalSandbox,
) -> None:
    result = await sandbox.run(RunRequest(code="x = 1\ny = x / 0\n"))
    assert result.status is RunStatus.RUNTIME_ERROR
    assert result.exit_code == 1
    assert 'File "main.py", line 2' in result.stderr
    assert "y = x / 0" in result.stderr
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    # The sandbox's own frames stay out of the user's traceback.
    assert "child.py" not in result.stderr


async def test_syntax_error_is_reported_like_python(sandbox: LocalSandbox) -> None:
    result = await sandbox.run(RunRequest(code="def f(:\n    pass\n"))
    assert result.status is RunStatus.RUNTIME_ERROR
    assert "SyntaxError" in result.stderr


TRACEBACK_CASES = [
    "x = [1, 2]\ny = 1 + x[5]",  # the last line, without a final newline
    "x = [1, 2]\ny = 1 + x[5]\n",
    "import math\nprint(math.sqrt(-1) + 2)",
    "def f(a):\n    return a.b + 1\n\nf(3)",
    "d = {'k': 1}\nprint(d['k'] + d['missing'])",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('bad') from e",
    "s = 'a\\x0cb\\u2028c'\nprint(len(s))\nint('x')",  # form feed, line separator in a string
    "x = 1\r\ny = x + None",
    "import json\njson.loads('{')",
    "def f(:\n    pass",
    "print('unclosed",
    "if True:\npass",
    "x = 1\nglobal x",  # a compiler error, not a parser error
    "def f():\n    nonlocal y\n",
    "print(__file__)\nprint(__name__)\nraise SystemExit('bye')",
]


@pytest.mark.parametrize("code", TRACEBACK_CASES)
async def test_output_and_tracebacks_match_cpython(sandbox: LocalSandbox, code: str) -> None:
    """What a model reads back is what Python itself prints for the same file, carets and all."""
    expected = cpython_run(code)
    result = await sandbox.run(RunRequest(code=code))
    assert (result.stdout, result.stderr) == (expected.stdout, expected.stderr)
    assert result.exit_code == expected.returncode


async def test_output_that_is_not_utf8_reads_with_replacement_characters(
    sandbox: LocalSandbox,
) -> None:
    """Bytes that are not UTF-8 come back as U+FFFD, each stream decoded on its own: a sequence
    cut at the end of stdout does not join the start of stderr."""
    code = (
        "import sys\n"
        "sys.stdout.buffer.write(b'ok \\xff\\xfe end \\xe2\\x82')\n"
        "sys.stderr.buffer.write(b'\\xe2\\x82\\xac euro \\xc3')\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == "ok \ufffd\ufffd end \ufffd"
    assert result.stderr == "\u20ac euro \ufffd"


async def test_file_is_defined_as_the_name_tracebacks_show(sandbox: LocalSandbox) -> None:
    code = "import os\nprint(__file__, os.path.basename(__file__))\n1 / 0"
    result = await sandbox.run(RunRequest(code=code))
    assert result.stdout == "main.py main.py\n"
    assert 'File "main.py", line 3' in result.stderr


async def test_exit_handlers_of_the_run_run_at_exit(sandbox: LocalSandbox) -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(print, 'second')\n"
        "atexit.register(print, 'first')\n"
        "print('main')\n"
        "sys.exit(3)\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert (result.stdout, result.exit_code) == ("main\nfirst\nsecond\n", 3)


@pytest.mark.parametrize(
    ("code", "exit_code", "status"),
    [
        ("import sys; sys.exit(0)", 0, RunStatus.SUCCESS),
        ("import sys; sys.exit(3)", 3, RunStatus.RUNTIME_ERROR),
        ("import sys; sys.exit('bye')", 1, RunStatus.RUNTIME_ERROR),
        ("import os; os._exit(7)", 7, RunStatus.RUNTIME_ERROR),
    ],
)
async def test_exit_codes(
    sandbox: LocalSandbox, code: str, exit_code: int, status: RunStatus
) -> None:
    result = await sandbox.run(RunRequest(code=code))
    assert (result.status, result.exit_code) == (status, exit_code)


@pytest.mark.parametrize(
    ("code", "shown"),
    [
        ("x = 20\nx + 22", "42\n"),
        ("'text'", "'text'\n"),
        ("print('printed')\n5", "printed\n"),  # something was printed: no repr
        ("None", ""),
        ("x = 5", ""),
        ("import sympy\nsympy.factor(sympy.Symbol('x')**2 - 1)", "(x - 1)*(x + 1)\n"),
    ],
)
async def test_display_last_expr(sandbox: LocalSandbox, code: str, shown: str) -> None:
    result = await sandbox.run(RunRequest(code=code, display_last_expr=True))
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == shown


async def test_last_expression_is_not_shown_unless_asked(sandbox: LocalSandbox) -> None:
    result = await sandbox.run(RunRequest(code="1 + 1"))
    assert result.stdout == ""


async def test_preloaded_numpy_works_under_a_small_memory_budget(sandbox: LocalSandbox) -> None:
    # The budget comes on top of what the fork-server maps, so 64 MiB is enough for real work.
    code = "import numpy as np\na = np.arange(1_000_000, dtype=np.float64)\nprint(int(a.sum()))"
    result = await sandbox.run(RunRequest(code=code, memory_mb=64))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert result.stdout == "499999500000\n"


async def test_runs_get_fresh_random_state(sandbox: LocalSandbox) -> None:
    code = "import random, numpy\nprint(random.random(), numpy.random.random())"
    first, second = await sandbox.run_many([RunRequest(code=code), RunRequest(code=code)])
    assert first.stdout != second.stdout


async def test_run_many_keeps_request_order(sandbox: LocalSandbox) -> None:
    requests = [
        RunRequest(code=f"import time\ntime.sleep({(i % 3) * 0.02})\nprint({i})") for i in range(12)
    ]
    results = await sandbox.run_many(requests)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]


async def test_minimal_environment_without_server_secrets(sandbox: LocalSandbox) -> None:
    secret = os.environ["RSTAR2_TEST_SECRET"]  # planted by conftest before the pool started

    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ['OMP_NUM_THREADS'], os.environ['OPENBLAS_NUM_THREADS'])\n"
        "for path in ('/proc/self/environ', '/proc/%d/environ' % os.getppid(),\n"
        f"             '/proc/{os.getpid()}/environ', '/proc/1/environ'):\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, 'denied', exc.errno)\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert secret not in result.stdout
    assert "RSTAR2_TEST_SECRET" not in result.stdout
    assert "1 1\n" in result.stdout


async def test_isolation_report_matches_privileges(sandbox: LocalSandbox) -> None:
    report = sandbox.isolation
    assert report.rlimits.active
    assert report.subreaper.active
    if os.geteuid() == 0:
        assert report.unprivileged_uid.active, report.unprivileged_uid.detail
        assert report.process_limit.active
        assert report.network_namespace.active, report.network_namespace.detail
        assert report.private_tmp.active, report.private_tmp.detail
        assert report.filesystem_root.active, report.filesystem_root.detail
        assert report.pid_namespace.active, report.pid_namespace.detail
        assert report.kernel_fence.active, report.kernel_fence.detail
    else:
        assert not report.unprivileged_uid.active
        assert "root" in report.unprivileged_uid.detail


async def test_runs_as_an_unprivileged_uid_in_a_private_directory_holding_main_py(
    sandbox: LocalSandbox,
) -> None:
    if not sandbox.isolation.unprivileged_uid.active:
        pytest.skip("per-slot uids need root")
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups(), os.listdir('.'))"
    result = await sandbox.run(RunRequest(code=code))
    uid, gid, groups, listing = result.stdout.split(" ", 3)
    settings = sandbox.pool.settings
    assert settings.uid_base <= int(uid) < settings.uid_base + sandbox.pool.slots
    assert gid == uid
    assert groups == "[]"
    assert listing.strip() == "['main.py']"


async def test_working_directory_is_removed_after_each_run(sandbox: LocalSandbox) -> None:
    code = "open('leftover.txt', 'w').write('x')\nimport os\nprint(sorted(os.listdir('.')))"
    results = await sandbox.run_many([RunRequest(code=code) for _ in range(sandbox.pool.slots * 2)])
    # Every slot is reused at least once and each time starts with main.py alone.
    assert all(r.stdout == "['leftover.txt', 'main.py']\n" for r in results), results


async def test_a_dead_fork_server_fails_its_calls_and_is_replaced(sandbox: LocalSandbox) -> None:
    pool = sandbox.pool
    victims = pool.server_pids
    sleeper = RunRequest(code="import time; time.sleep(30)")
    slow = [asyncio.create_task(sandbox.run(sleeper)) for _ in range(2)]
    await asyncio.sleep(0.5)
    for pid in victims:
        os.kill(pid, 9)
    results = await asyncio.wait_for(asyncio.gather(*slow), 20)
    assert {r.status for r in results} == {RunStatus.INTERNAL_ERROR}
    for _ in range(600):  # up to 60 s for the supervisor to start replacements
        if pool.restarts >= len(victims) and pool.live_servers == pool.servers:
            break
        await asyncio.sleep(0.1)
    after = await sandbox.run(RunRequest(code="print('back')"))
    assert after.stdout == "back\n", after
    assert pool.restarts >= len(victims)
    assert set(pool.server_pids).isdisjoint(victims)


async def test_a_dead_template_fails_its_calls_and_its_fork_server_is_replaced() -> None:
    """Without its template a fork-server cannot start a run (and a new template would not be
    clean): it stops, and the pool replaces it as it replaces a dead one."""
    async with LocalSandbox(ExecutorSettings(servers=1, slots=2, preload=[])) as local:
        pool = local.pool
        servers, templates = pool.server_pids, pool.template_pids
        assert len(templates) == 1
        sleeper = RunRequest(code="import time; time.sleep(30)")
        slow = [asyncio.create_task(local.run(sleeper)) for _ in range(2)]
        await asyncio.sleep(0.5)
        os.kill(templates[0], 9)
        results = await asyncio.wait_for(asyncio.gather(*slow), 20)
        assert {r.status for r in results} == {RunStatus.INTERNAL_ERROR}
        for _ in range(300):
            if pool.restarts >= 1 and pool.live_servers == pool.servers:
                break
            await asyncio.sleep(0.1)
        after = await local.run(RunRequest(code="print('back')"))
        assert after.stdout == "back\n", after
        assert set(pool.server_pids).isdisjoint(servers)
        assert set(pool.template_pids).isdisjoint(templates)


@pytest.mark.parametrize(
    ("code", "preloaded"),
    [
        ("print(1 + 1)", False),
        ("import math, itertools\nfrom fractions import Fraction", False),
        ("import numpy as np", True),
        ("from sympy import Symbol", True),
        ("import os, numpy.linalg", True),
        ("m = __import__('numpy')", True),
        ("import importlib\nimportlib.import_module('sympy')", True),
        ("exec('import math')", True),
        # Code wrapped as rStar2-Agent's client sends it: routed by the code it carries.
        (rstar2_agent_wrap("import math\nprint(math.comb(10, 3))"), False),
        (rstar2_agent_wrap("x = 2\nx ** 10", history=["import fractions"]), False),
        (rstar2_agent_wrap("import numpy as np\nnp.eye(2)"), True),
        (rstar2_agent_wrap("print(1)", history=["import sympy"]), True),
        ("import base64\nexec(base64.b64decode('aW1wb3J0IG51bXB5').decode())", True),
        ("import base64\nraw = base64.b64decode('//79')\nexec('x = 1')", True),  # not code
    ],
)
async def test_stdlib_only_code_runs_on_the_lean_tier(
    sandbox: LocalSandbox, code: str, preloaded: bool
) -> None:
    expected = "preloaded" if preloaded else "lean"
    assert sandbox.pool.tier_for(RunRequest(code=code)) == expected
    probe = code + "\nimport sys\nprint('numpy' in sys.modules and 'sympy' in sys.modules)"
    result = await sandbox.run(RunRequest(code=probe))
    assert result.status is RunStatus.SUCCESS, result.stderr
    # The lean tier has nothing preloaded; the other has both (imports above add only numpy).
    assert result.stdout.strip().splitlines()[-1] == str(preloaded)


async def test_children_inherit_the_fork_servers_warm_up(sandbox: LocalSandbox) -> None:
    # sympy loads sympy.combinatorics lazily on the first factor(); the fork-server's warm-up
    # did that already, so a run starts with it loaded.
    code = "import sys, sympy\nprint('sympy.combinatorics' in sys.modules)"
    result = await sandbox.run(RunRequest(code=code))
    assert result.stdout == "True\n"


async def test_without_isolation_runs_work_and_leftovers_still_die() -> None:
    """The path a non-root server takes: same uid for all runs, leftovers found by session."""
    from .conftest import children_of  # type: ignore[import-not-found]

    settings = ExecutorSettings(servers=1, slots=2, preload=[], isolate=False)
    async with LocalSandbox(settings) as plain:
        report = plain.isolation
        assert not report.unprivileged_uid.active
        assert not report.network_namespace.active
        assert report.unprivileged_uid.detail == "disabled"
        daemon = (
            "import os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"
            f"print(os.getuid() == {os.getuid()})\n"
        )
        result = await plain.run(RunRequest(code=daemon))
        assert result.status is RunStatus.SUCCESS
        assert result.stdout == "True\n"
        templates = plain.pool.template_pids
        assert len(templates) == 1
        assert [children_of(pid, templates) for pid in plain.pool.server_pids] == [[]]
