"""A sandbox that cannot start says why and what to do, not only that a fork-server exited."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rstar2_sandbox import ExecutorSettings, LocalSandbox, SandboxStartError
from rstar2_sandbox.executor.forkserver import StartError, start_failure

# Imported at start by every interpreter that has this directory on its path: the fork-servers of
# a pool made while it is on sys.path (they inherit the pool's path). It makes the fork-server's
# working directory fail as a read-only /tmp would.
READ_ONLY_TMP = """
import errno, tempfile

def mkdtemp(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system", "/tmp/rstar2-sandbox-x")

tempfile.mkdtemp = mkdtemp
"""


@pytest.mark.asyncio
async def test_a_fork_server_that_cannot_start_names_the_path_and_the_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sitecustomize.py").write_text(READ_ONLY_TMP)
    monkeypatch.syspath_prepend(str(tmp_path))
    sandbox = LocalSandbox(ExecutorSettings(servers=1, slots=1, preload=[], isolate=False))
    with pytest.raises(SandboxStartError) as raised:
        await sandbox.start()
    message = str(raised.value)
    assert message.startswith("fork-server 0 could not start: no place for the runs' working")
    assert "/tmp/rstar2-sandbox-x" in message
    assert "make /tmp writable" in message
    await sandbox.aclose()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            OSError(errno.EPERM, "mount /tmp: Operation not permitted"),
            "CAP_SYS_ADMIN for namespaces and mounts",
        ),
        (
            OSError(errno.EROFS, "Read-only file system", "/tmp/root-x"),
            "/tmp/root-x is on a read-only mount",
        ),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), "out of memory or of tmpfs space"),
        (StartError("its root has no writable /tmp", "free memory"), "free memory"),
        (ValueError("bad"), "see the fork-server's log"),
    ],
)
def test_each_cause_comes_with_what_to_do(error: Exception, expected: str) -> None:
    message = start_failure(error)
    assert expected in message
    assert str(error) in message or str(error.args[0]) in message
