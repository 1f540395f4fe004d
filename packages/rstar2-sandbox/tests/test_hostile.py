"""Hostile code: each case ends with the right status, leaves no process behind, and the sandbox
keeps serving afterwards."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable

import pytest

from rstar2_sandbox import LocalSandbox, RunRequest, RunResult, RunStatus

pytestmark = pytest.mark.asyncio(loop_scope="session")

TIMEOUT_S = 2.0


async def hostile(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None], code: str, **options: object
) -> RunResult:
    """Run ``code``, then check nothing survived and the sandbox still answers."""
    options.setdefault("timeout_s", TIMEOUT_S)
    result = await sandbox.run(RunRequest(code=code, **options))  # type: ignore[arg-type]
    no_leftovers()
    healthy = await sandbox.run(RunRequest(code="print('still serving')"))
    assert healthy.stdout == "still serving\n"
    return result


async def test_fork_bomb(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.TIMEOUT


async def test_memory_bomb(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    # The address-space limit makes the allocation fail inside the run: a MemoryError the run
    # raises, as under ``ulimit -v``, which no observer outside the run can tell from one the run
    # raises or prints itself, so it cannot be memory_exceeded (the traceback says it).
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))\n"
    result = await hostile(sandbox, no_leftovers, code, memory_mb=256, timeout_s=10)
    assert result.status is RunStatus.RUNTIME_ERROR
    assert result.stderr.rstrip().endswith("MemoryError")


async def test_numpy_allocation_over_budget(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    code = "import numpy as np\nnp.ones((20_000, 20_000))\n"
    result = await hostile(sandbox, no_leftovers, code, memory_mb=256)
    assert result.status is RunStatus.RUNTIME_ERROR
    assert "Unable to allocate" in result.stderr


# A run's status is what the sandbox saw (its timer, its output counters, the kernel's OOM count
# and CPU account, its quota), never what the run says or does to itself.
@pytest.mark.parametrize(
    ("code", "exit_code", "sig"),
    [
        ("import sys\nsys.stderr.write('MemoryError\\n')\nsys.exit(3)", 3, None),
        ("raise MemoryError", 1, None),
        (
            "import sys\nsys.stderr.write('OSError: [Errno 28] No space left on device\\n')\n"
            "sys.exit(1)",
            1,
            None,
        ),
        ("open('f', 'wb').write(b'x')\nraise OSError(28, 'No space left on device')", 1, None),
        ("raise OSError(27, 'File too large')", 1, None),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", None, 9),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", None, 24),
    ],
    ids=["memory-line", "memory-raise", "space-line", "space-raise", "too-large", "kill", "xcpu"],
)
async def test_a_run_cannot_choose_its_status(
    sandbox: LocalSandbox,
    no_leftovers: Callable[[], None],
    code: str,
    exit_code: int | None,
    sig: int | None,
) -> None:
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.RUNTIME_ERROR, result
    assert (result.exit_code, result.signal) == (exit_code, sig)
    assert "sandbox:" not in result.stderr


async def test_infinite_loop(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    result = await hostile(sandbox, no_leftovers, "while True:\n    pass\n")
    assert result.status is RunStatus.TIMEOUT
    assert TIMEOUT_S <= result.wall_time_s < TIMEOUT_S + 1.5


async def test_cpu_spin_in_threads(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = (
        "import threading\n"
        "def spin():\n    while True:\n        pass\n"
        "for _ in range(8):\n    threading.Thread(target=spin, daemon=True).start()\n"
        "threading.Event().wait()\n"
    )
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.TIMEOUT


async def test_sleeping_daemonized_grandchild(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    # Double fork + setsid: the grandchild leaves the run's session and process group.
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1000)\n"
        "    os._exit(0)\n"
        "print('parent exits')\n"
    )
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == "parent exits\n"


async def test_grandchild_holding_stdout_open(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    # The run's pipes stay open in the daemon; the result must not wait for them.
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(1000)\n"
        "print('done', flush=True)\n"
    )
    result = await hostile(sandbox, no_leftovers, code, timeout_s=30)
    assert result.status is RunStatus.SUCCESS
    assert result.wall_time_s < 5


async def test_ignoring_sigterm(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = (
        "import signal, time\n"
        "for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(sig, signal.SIG_IGN)\n"
        "time.sleep(100)\n"
    )
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.TIMEOUT


async def test_killing_the_parent(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('survived')\n"
    if sandbox.isolation.unprivileged_uid.active:
        result = await hostile(sandbox, no_leftovers, code)
        # The fork-server runs as root: the run may not signal it.
        assert result.status is RunStatus.RUNTIME_ERROR
        assert "PermissionError" in result.stderr
    else:
        # Same uid: the fork-server dies, the call fails cleanly, a new fork-server takes over.
        result = await sandbox.run(RunRequest(code=code, timeout_s=TIMEOUT_S))
        assert result.status is RunStatus.INTERNAL_ERROR
        healthy = await asyncio.wait_for(sandbox.run(RunRequest(code="print(1)")), 60)
        assert healthy.stdout == "1\n"


async def test_killing_everything_it_can(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    if not sandbox.isolation.unprivileged_uid.active:
        pytest.skip("kill(-1) from the server's own uid would kill the test process")
    code = "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alone')"
    result = await hostile(sandbox, no_leftovers, code)
    # kill(-1) spares the caller, and the slot's uid owns nothing else.
    assert result.status is RunStatus.SUCCESS
    assert result.stdout == "alone\n"


@pytest.mark.parametrize("target", ["/etc/rstar2-pwned", "/var/tmp/rstar2-pwned", "/rstar2-pwned"])
async def test_writing_outside_the_working_directory(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None], target: str
) -> None:
    if not sandbox.isolation.unprivileged_uid.active:
        pytest.skip("without a separate uid the server's own permissions apply")
    code = f"open({target!r}, 'w').write('pwned')\n"
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.RUNTIME_ERROR
    # Refused for want of permission, or (in the run's own read-only root) not writable or not
    # there at all.
    refused = r"PermissionError|Read-only file system|FileNotFoundError"
    assert re.search(refused, result.stderr.splitlines()[-1]), result.stderr
    assert not await asyncio.to_thread(os.path.exists, target)


async def test_writing_tmp_and_shm_stays_inside_the_run(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    """/tmp, /dev/shm and the working directory's parent are the run's own: writable, seen by
    no other run (not even one running meanwhile) nor the host, and gone when the run ends."""
    if not sandbox.isolation.run_tmp.active:
        pytest.skip("runs have their own /tmp only with mount namespaces")
    paths = ["/tmp/rstar2-pwned", "/dev/shm/rstar2-pwned", "../rstar2-pwned-too"]
    writer = (
        "import time\n"
        f"for path in {paths!r}:\n"
        "    open(path, 'w').write('pwned')\n"
        "print('written', flush=True)\n"
        "time.sleep(3)\n"
    )
    task = asyncio.create_task(sandbox.run(RunRequest(code=writer, timeout_s=10)))
    await asyncio.sleep(1.5)
    looker = (
        "import os, glob\n"
        "print(sorted(glob.glob('/tmp/**/rstar2-pwned*', recursive=True)))\n"
        "print(sorted(glob.glob('/dev/shm/*')))\n"
    )
    during = await sandbox.run(RunRequest(code=looker))
    first = await task
    after = await hostile(sandbox, no_leftovers, looker)
    assert first.status is RunStatus.SUCCESS, first.stderr
    assert first.stdout == "written\n"
    for seen in (during, after):
        assert seen.status is RunStatus.SUCCESS, seen.stderr
        assert seen.stdout == "[]\n[]\n"
    # Nor did anything reach the host's directories.
    for host_path in ("/tmp/rstar2-pwned", "/dev/shm/rstar2-pwned"):
        assert not await asyncio.to_thread(os.path.exists, host_path)


async def test_reading_another_runs_files(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    if not sandbox.isolation.unprivileged_uid.active:
        pytest.skip("runs share a uid without root")
    writer = (
        "import os, time\nopen('secret.txt', 'w').write('run A secret')\n"
        "print(os.getcwd(), flush=True)\ntime.sleep(3)\n"
    )
    task = asyncio.create_task(sandbox.run(RunRequest(code=writer, timeout_s=10)))
    await asyncio.sleep(1.0)
    reader = (
        "import glob, os\n"
        "parent = os.path.dirname(os.getcwd())\n"
        "try:\n    print('listing', os.listdir(parent))\n"
        "except OSError as exc:\n    print('listing denied', exc.errno)\n"
        "for path in glob.glob('/tmp/*/secret.txt') + glob.glob('/tmp/run-*/secret.txt')"
        " + glob.glob('/proc/*/cwd/secret.txt') + glob.glob('/proc/*/root/tmp/*/secret.txt'):\n"
        "    print('found', path)\n"
        "import subprocess\n"
        "out = subprocess.run(['sh', '-c', 'cat /tmp/run-*/secret.txt'], capture_output=True)\n"
        "print('cat', out.stdout, out.returncode)\n"
    )
    result = await sandbox.run(RunRequest(code=reader))
    first = await task
    assert first.status is RunStatus.SUCCESS
    assert "run A secret" not in result.stdout
    assert "found" not in result.stdout
    if sandbox.isolation.run_tmp.active:
        # The parent is the reader's own /tmp: the writer's directory is not in it.
        writer_dir = os.path.basename(first.stdout.strip())
        assert "listing [" in result.stdout
        assert writer_dir not in result.stdout
    else:
        assert "listing denied" in result.stdout
    no_leftovers()


async def test_connecting_to_a_loopback_listener(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    if not sandbox.isolation.network_namespace.active:
        pytest.skip("network namespaces are not available here")
    connections: list[str] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append("connected")
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result = await hostile(sandbox, no_leftovers, code)
    finally:
        server.close()
        await server.wait_closed()
    assert result.status is RunStatus.RUNTIME_ERROR
    assert "OSError" in result.stderr
    assert connections == []


def output_note(stream: str, limit: int) -> re.Pattern[str]:
    """The line the sandbox adds when ``stream`` went over its cap (how much was written)."""
    return re.compile(
        rf"sandbox: {stream} exceeded the output limit of {limit} bytes "
        r"\(at least (\d+) bytes were written\); the run was stopped\n$"
    )


async def test_printing_100_mb(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)"
    limit = 1 << 20
    result = await hostile(sandbox, no_leftovers, code, output_limit_bytes=limit, timeout_s=30)
    assert result.status is RunStatus.OUTPUT_LIMIT_EXCEEDED
    assert result.stdout_truncated
    assert len(result.stdout) == limit
    # Stopped at the cap, not after writing everything; stderr says why and how much came.
    assert result.wall_time_s < 5
    note = output_note("stdout", limit).fullmatch(result.stderr)
    assert note is not None, result.stderr
    assert limit < int(note.group(1)) <= 100 * limit


async def test_flooding_stderr(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    code = "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n"
    result = await hostile(sandbox, no_leftovers, code, output_limit_bytes=100_000)
    assert result.status is RunStatus.OUTPUT_LIMIT_EXCEEDED
    assert result.stderr_truncated
    # The captured 100,000 bytes, then on a line of its own the sandbox's note (after the cap:
    # it is not the run's output).
    captured, note = result.stderr[:100_000], result.stderr[100_000:]
    assert captured == "e" * 100_000
    assert output_note("stderr", 100_000).fullmatch(note.removeprefix("\n")) is not None
    assert note.startswith("\n")


async def test_writing_a_huge_file(sandbox: LocalSandbox, no_leftovers: Callable[[], None]) -> None:
    limit = sandbox.pool.settings.max_file_bytes
    code = f"with open('big.bin', 'wb') as f:\n    f.write(b'x' * {limit + (1 << 20)})\n"
    result = await hostile(sandbox, no_leftovers, code, memory_mb=1024)
    # A write limit, reported like the output caps: the status and a line saying which.
    assert result.status is RunStatus.OUTPUT_LIMIT_EXCEEDED
    assert "File too large" in result.stderr
    assert result.stderr.endswith(f"sandbox: a file reached the file-size limit of {limit} bytes\n")


async def test_reading_the_planted_secret_from_the_server_environment(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    if not sandbox.isolation.unprivileged_uid.active:
        pytest.skip("processes of one user can read each other's environment")
    secret = os.environ["RSTAR2_TEST_SECRET"]
    code = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = await hostile(sandbox, no_leftovers, code)
    assert result.status is RunStatus.SUCCESS
    assert secret not in result.stdout
