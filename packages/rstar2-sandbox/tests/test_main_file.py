"""``main.py`` is on disk in the run's working directory: what reads a script's own file behaves
as under ``python main.py`` (compared with a fresh interpreter running the same file)."""

from __future__ import annotations

import pytest

from rstar2_sandbox import LocalSandbox, RunRequest, RunStatus

from .conftest import cpython_run  # type: ignore[import-not-found]

pytestmark = pytest.mark.asyncio(loop_scope="session")

POOL = """
import multiprocessing as mp

def square(x):
    return x * x

if __name__ == "__main__":
    with mp.get_context({method!r}).Pool(2) as pool:
        print(pool.map(square, range(5)))
    child = mp.get_context({method!r}).Process(target=print, args=("from a child",))
    child.start()
    child.join()
    print(child.exitcode)
"""


@pytest.mark.parametrize(
    "code",
    [
        "print(open(__file__).read().splitlines()[0])",
        "import inspect\n\ndef f(x):\n    return x + 1\n\nprint(inspect.getsource(f), end='')",
        "import inspect, sys\nprint(len(inspect.getsource(sys.modules[__name__])))",
        # runpy runs the file again, under another name.
        "import runpy\nX = 1\nif __name__ == '__main__':\n"
        "    print(runpy.run_path(__file__, run_name='again')['X'] + 1)",
        "import os\nprint(os.path.exists('main.py'), os.path.basename(__file__))",
        POOL.format(method="spawn"),
        POOL.format(method="forkserver"),
    ],
    ids=["open", "getsource", "getsource-module", "runpy", "exists", "spawn", "forkserver"],
)
async def test_code_reading_its_own_file_runs_as_in_cpython(
    sandbox: LocalSandbox, code: str
) -> None:
    expected = cpython_run(code)
    assert expected.returncode == 0, expected.stderr
    result = await sandbox.run(RunRequest(code=code, timeout_s=30))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert result.stdout == expected.stdout
    assert result.stderr == expected.stderr
