"""Escape probes: a run looks for the host's files, processes and the service's own, and finds
none of them (its own read-only root and PID namespace). Other runs' files: ``test_hostile``."""

from __future__ import annotations

import ast
import os
import site
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rstar2_sandbox import LocalSandbox, RunRequest, RunStatus

pytestmark = pytest.mark.asyncio(loop_scope="session")

PACKAGE = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def needs_own_root(sandbox: LocalSandbox) -> None:
    for feature in ("filesystem_root", "pid_namespace"):
        if not getattr(sandbox.isolation, feature).active:
            detail = getattr(sandbox.isolation, feature).detail
            pytest.skip(f"runs have no {feature.replace('_', ' ')} here: {detail}")


@pytest.fixture
def planted() -> Iterator[Path]:
    """A world-readable file in the home directory of the user running the service."""
    path = Path.home() / f".rstar2-escape-probe-{os.getpid()}"
    path.write_text("host secret")
    path.chmod(0o644)
    yield path
    path.unlink()


async def probe(sandbox: LocalSandbox, code: str) -> object:
    """Run ``code`` (which prints one Python literal) and return the literal."""
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    return ast.literal_eval(result.stdout)


READ = """
import os
found = {}
for path in %r:
    try:
        if os.path.isdir(path):
            found[path] = sorted(os.listdir(path))
        else:
            with open(path, 'rb') as handle:
                found[path] = handle.read(64).decode('latin-1')
    except OSError as exc:
        found[path] = type(exc).__name__
print(repr(found))
"""


async def test_host_files_are_out_of_sight(sandbox: LocalSandbox, planted: Path) -> None:
    paths = [
        str(PACKAGE / "README.md"),  # the project checkout
        str(PACKAGE),
        str(planted),  # the home of the user running the service
        str(Path.home()),
        "/home",
        "/etc/shadow",
        "/etc/hostname",
        "/etc/os-release",
        "/var/log",
        "/sys/class/net",
        "/bin/sh",
        "/usr/bin",
        os.getcwd(),  # where the service was started
    ]
    found = await probe(sandbox, READ % paths)
    assert isinstance(found, dict)
    # The Python installation may live under one of these (a virtual environment in the
    # project, an interpreter in the home): only the way to it is there.
    installation = [Path(p) for p in (sys.prefix, sys.base_prefix, *site.getsitepackages())]
    for path in paths:
        on_the_way = {i.relative_to(path).parts[0] for i in installation if i.is_relative_to(path)}
        if on_the_way and path != str(PACKAGE):
            assert set(found[path]) <= on_the_way, (path, found[path])
        else:
            assert found[path] == "FileNotFoundError", (path, found[path])


async def test_the_root_holds_only_what_python_needs(sandbox: LocalSandbox) -> None:
    found = await probe(sandbox, READ % ["/", "/etc", "/dev"])
    assert isinstance(found, dict)
    assert set(found["/etc"]) == {"group", "ld.so.cache", "localtime", "passwd"}
    assert set(found["/dev"]) == {
        *("fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero")
    }
    assert not {"home", "var", "sys", "srv", "opt", "mnt", "bin", "sbin", "boot"} & set(found["/"])
    writes = await sandbox.run(RunRequest(code="open('/usr/x', 'w')"))
    assert "Read-only file system" in writes.stderr or "No such file" in writes.stderr


async def test_a_run_sees_and_reaches_only_its_own_processes(sandbox: LocalSandbox) -> None:
    code = """
import ctypes, os, signal, time
if os.fork() == 0:
    time.sleep(5)
    os._exit(0)
seen = {}
for entry in os.listdir('/proc'):
    if entry.isdigit():
        with open(f'/proc/{entry}/status') as handle:
            status = dict(line.split(':', 1) for line in handle if ':' in line)
        with open(f'/proc/{entry}/cmdline', 'rb') as handle:
            cmdline = handle.read().decode(errors='replace')
        seen[int(entry)] = (int(status['Uid'].split()[0]), cmdline)
libc = ctypes.CDLL(None, use_errno=True)
traced = {}
for target in (1, os.getppid()):
    libc.ptrace(16, target, 0, 0)  # PTRACE_ATTACH
    traced[target] = ctypes.get_errno()
killed = {}
for target in (1, os.getppid(), %d):
    try:
        os.kill(target, 0)
        killed[target] = 'reached'
    except OSError as exc:
        killed[target] = type(exc).__name__
print(repr((os.getpid(), os.getuid(), seen, traced, killed)))
"""
    host_pid = os.getpid()
    found = await probe(sandbox, code % host_pid)
    assert isinstance(found, tuple)
    pid, uid, seen, traced, killed = found
    # Its own process and its child: nothing of the host, of the service or of other runs.
    assert pid in seen
    assert len(seen) == 2
    assert {owner for owner, _ in seen.values()} == {uid}
    # Both are copies of the fork-server's process: its command line, nothing else.
    assert len({cmdline for _, cmdline in seen.values()}) == 1
    assert not any("pytest" in cmdline for _, cmdline in seen.values())
    assert set(traced.values()) == {1}  # EPERM: neither the namespace's init nor the fork-server
    assert killed[1] == killed[2] == "PermissionError"
    if host_pid not in seen:  # unless this run happens to have the test's pid in its namespace
        assert killed[host_pid] == "ProcessLookupError"


async def test_the_services_own_files_are_out_of_sight(sandbox: LocalSandbox) -> None:
    """The fork-server's process (environment, descriptors, root, working directory) and the
    source of the service."""
    import rstar2_sandbox.executor.forkserver as forkserver

    code = READ % [
        "/proc/1/environ",
        "/proc/2/environ",
        "/proc/2/fd",
        "/proc/2/root",
        "/proc/2/cwd",
        forkserver.__file__,
    ]
    code += (
        "import sys\nprint(repr(sorted(p for p in sys.path if 'rstar2-sandbox' in p "
        "and 'site-packages' not in p)))\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    listing, paths = result.stdout.splitlines()
    found = ast.literal_eval(listing)
    for path, seen in found.items():
        if path == forkserver.__file__ and "site-packages" in path:
            continue  # installed as a package: its (public) source is part of the installation
        assert seen == "FileNotFoundError", (path, seen)
    assert ast.literal_eval(paths) == []
