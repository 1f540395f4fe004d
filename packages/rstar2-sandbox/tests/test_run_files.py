"""What ordinary tool code does with processes and files: multiprocessing works within the run's
limits, each run has its own writable /tmp and /dev/shm with quotas, and what it wrote is gone
when it ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from rstar2_sandbox import ExecutorSettings, LocalSandbox, RunRequest, RunStatus

pytestmark = pytest.mark.asyncio(loop_scope="session")

TMP_MB, SHM_MB = 8, 4


@pytest.fixture(autouse=True)
def needs_run_tmp(sandbox: LocalSandbox) -> None:
    if not sandbox.isolation.run_tmp.active:
        pytest.skip(f"runs have no /tmp of their own here: {sandbox.isolation.run_tmp.detail}")


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def single() -> AsyncIterator[LocalSandbox]:
    """One fork-server, one slot: every run follows the previous one in the same slot."""
    async with LocalSandbox(ExecutorSettings(servers=1, slots=1, preload=[])) as local:
        yield local


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def small() -> AsyncIterator[LocalSandbox]:
    """One fork-server, two slots, small quotas: two runs side by side on the same server."""
    settings = ExecutorSettings(
        servers=1, slots=2, preload=[], tmp_size_mb=TMP_MB, shm_size_mb=SHM_MB
    )
    async with LocalSandbox(settings) as local:
        yield local


@pytest.mark.parametrize(
    "code",
    [
        # As models write it (no close, no __main__ guard).
        "from multiprocessing import Pool; print(Pool(2).map(abs, [-1, -2]))",
        "from multiprocessing import Pool\n"
        "def size(x):\n    return abs(x)\n"
        "if __name__ == '__main__':\n"
        "    with Pool(2) as pool:\n        print(pool.map(size, [-1, -2]))\n",
        "from concurrent.futures import ProcessPoolExecutor\n"
        "with ProcessPoolExecutor(2) as ex:\n    print(list(ex.map(abs, [-1, -2])))\n",
        "import multiprocessing as mp\n"
        "q = mp.Queue()\np = mp.Process(target=q.put, args=([1, 2],))\np.start()\n"
        "print(q.get())\np.join()\n",
        # The preloaded tier forks from a server holding numpy: workers use it too.
        "import numpy as np\nfrom multiprocessing import Pool\n"
        "print(Pool(2).map(int, np.array([1, 2])))\n",
    ],
)
async def test_multiprocessing_works(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None], code: str
) -> None:
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert result.stdout == "[1, 2]\n"
    assert result.stderr == ""
    no_leftovers()


async def test_shared_memory_is_the_runs_own_and_removed_after(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    code = (
        "import os\nfrom multiprocessing import shared_memory\n"
        "block = shared_memory.SharedMemory(create=True, size=1 << 20, name='rstar2-shm')\n"
        "block.buf[:3] = b'abc'\n"
        "print(sorted(os.listdir('/dev/shm')), bytes(block.buf[:3]))\n"
        "block.close()\n"  # not unlinked: the run's /dev/shm goes with the run
    )
    first = await sandbox.run(RunRequest(code=code))
    assert first.status is RunStatus.SUCCESS, first.stderr
    assert first.stdout == "['rstar2-shm'] b'abc'\n"
    # A later run creates the same name from scratch: nothing was left.
    again = await sandbox.run(RunRequest(code=code))
    assert again.stdout == first.stdout, again.stderr
    assert not await asyncio.to_thread(os.path.exists, "/dev/shm/rstar2-shm")
    no_leftovers()


async def test_tmp_is_writable_and_tempfile_uses_it(sandbox: LocalSandbox) -> None:
    code = (
        "import os, tempfile\n"
        "open('/tmp/notes.txt', 'w').write('x')\n"
        "with tempfile.NamedTemporaryFile(dir=None) as handle:\n"
        "    print(os.path.dirname(handle.name))\n"
        "cwd = os.getcwd()\n"
        "print(os.environ['TMPDIR'], os.path.dirname(cwd), cwd == os.environ['HOME'])\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert result.stdout == "/tmp\n/tmp /tmp True\n"


@pytest.mark.parametrize(
    ("path", "quota_mb"), [("/tmp/fill", TMP_MB), ("fill", TMP_MB), ("/dev/shm/fill", SHM_MB)]
)
async def test_filling_a_quota_fails_only_that_run(
    small: LocalSandbox, path: str, quota_mb: int
) -> None:
    filler = (
        f"with open({path!r}, 'wb') as handle:\n"
        f"    for _ in range({4 * quota_mb}):\n"
        "        handle.write(b'x' * (1 << 20))\n"
    )
    # A neighbour on the same fork-server writes most of its own quota before and after.
    neighbour = (
        "import time\n"
        f"open('/tmp/mine', 'wb').write(b'y' * ({TMP_MB - 2} << 20))\n"
        "time.sleep(1.0)\n"
        f"open('/dev/shm/mine', 'wb').write(b'z' * ({SHM_MB - 1} << 20))\n"
        "print(len(open('/tmp/mine', 'rb').read()) >> 20, 'MiB kept')\n"
    )
    calm = asyncio.create_task(small.run(RunRequest(code=neighbour)))
    await asyncio.sleep(0.3)
    full = await small.run(RunRequest(code=filler))
    other = await calm
    assert other.status is RunStatus.SUCCESS, other.stderr
    assert other.stdout == f"{TMP_MB - 2} MiB kept\n"
    assert full.status is RunStatus.OUTPUT_LIMIT_EXCEEDED
    assert "No space left on device" in full.stderr
    assert full.stderr.endswith(
        f"sandbox: the run's disk quota is full ({TMP_MB} MiB for /tmp and the working "
        f"directory, {SHM_MB} MiB for /dev/shm)\n"
    )


async def test_files_are_gone_after_a_run_is_killed(small: LocalSandbox) -> None:
    code = (
        "open('/tmp/left', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')\n"
        "open('left', 'w').write('x')\nwhile True:\n    pass\n"
    )
    killed = await small.run(RunRequest(code=code, timeout_s=0.5))
    assert killed.status is RunStatus.TIMEOUT
    look = "import glob\nprint(glob.glob('/tmp/**/left', recursive=True), glob.glob('/dev/shm/*'))"
    # Both slots, each run afresh: nothing of the killed run anywhere.
    results = await small.run_many([RunRequest(code=look)] * 4)
    assert [r.stdout for r in results] == ["[] []\n"] * 4


async def test_many_runs_leave_no_mounts_behind(small: LocalSandbox) -> None:
    """A run's mounts live in its own mount namespace: the fork-server's table does not grow."""
    server = small.pool.server_pids[0]

    def mounts() -> int:
        with open(f"/proc/{server}/mountinfo") as handle:
            return len(handle.readlines())

    before = mounts()
    code = "open('/tmp/x', 'w').write('x')"
    results = await small.run_many([RunRequest(code=code)] * 20)
    assert {r.status for r in results} == {RunStatus.SUCCESS}
    assert mounts() == before


LOOK = (
    "import os, time\n"
    "cwd = os.stat('.')\n"
    "print(oct(cwd.st_mode & 0o7777), time.time() - cwd.st_mtime < 60, os.listdir('.'),"
    " os.listxattr('.'), sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))\n"
)


@pytest.mark.parametrize(
    "leave",
    [
        "open('/tmp/note', 'w').write('for the next run')",
        "open('note', 'w').write('for the next run')",
        "open('/dev/shm/note', 'w').write('x')",
        "os.mkdir('/tmp/dir')",
        "os.chmod('.', 0o755)\nos.utime('.', (0, 0))",  # metadata only: no inode added
        "os.setxattr('.', 'user.note', b'for the next run')",
        "os.chdir('/tmp')\nos.remove(os.environ['HOME'] + '/main.py')\n"
        "os.rmdir(os.environ['HOME'])\nos.symlink('/etc', os.environ['HOME'])",
    ],
)
async def test_the_next_run_in_the_slot_starts_clean(single: LocalSandbox, leave: str) -> None:
    clean = await single.run(RunRequest(code=LOOK))
    assert clean.status is RunStatus.SUCCESS, clean.stderr
    left = await single.run(RunRequest(code="import os\n" + leave))
    if "setxattr" in leave and "Operation not supported" in left.stderr:
        pytest.skip("this kernel's tmpfs has no user extended attributes")
    assert left.status is RunStatus.SUCCESS, left.stderr
    after = await single.run(RunRequest(code=LOOK))
    assert after.stdout == clean.stdout, after.stderr
