"""The kernel boundary, tried as an attacker would: a run holds no capability, cannot gain any
(``no_new_privs``), and every call that opens the kernel's larger attack surface (namespaces,
mounts, ptrace, bpf, perf, keyrings, io_uring, modules, kexec, userfaultfd, netlink and other
socket families) fails with EPERM inside the run, while the service keeps serving."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

import pytest

from rstar2_sandbox import LocalSandbox, RunRequest, RunStatus
from rstar2_sandbox.executor.seccomp import ARCHES

pytestmark = pytest.mark.asyncio(loop_scope="session")

NUMBERS = ARCHES[os.uname().machine].numbers if os.uname().machine in ARCHES else {}

# Each attempt is a call through libc; the run prints {name: errno (0: it worked)}.
ATTEMPTS = {
    "unshare(user|mount|net|pid)": "libc.unshare(0x10000000 | 0x20000 | 0x40000000 | 0x20000000)",
    "unshare(ipc)": "libc.unshare(0x08000000)",
    "clone(user)": f"libc.syscall({NUMBERS.get('clone')}, 0x10000000 | 17, 0, 0, 0, 0)",
    "setns(net)": "libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0)",
    "mount(tmpfs)": "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
    "umount2(/tmp)": "libc.umount2(b'/tmp', 2)",
    "pivot_root": f"libc.syscall({NUMBERS.get('pivot_root')}, b'/tmp', b'/tmp')",
    "chroot": "libc.chroot(b'/tmp')",
    "ptrace(TRACEME)": "libc.ptrace(0, 0, None, None)",
    "bpf": f"libc.syscall({NUMBERS.get('bpf')}, 0, None, 0)",
    # A counter on this very thread: allowed to any process when perf_event_paranoid < 2.
    "perf_event_open": (
        f"libc.syscall({NUMBERS.get('perf_event_open')}, "
        "(ctypes.c_uint32 * 32)(1, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), 0, -1, -1, 0)"
    ),
    "keyctl(join)": f"libc.syscall({NUMBERS.get('keyctl')}, 1, b'stolen')",
    "add_key": (
        f"libc.syscall({NUMBERS.get('add_key')}, b'user', b'probe', b'secret', 6, -3)"  # session
    ),
    "request_key": f"libc.syscall({NUMBERS.get('request_key')}, b'user', b'probe', None, 0)",
    "io_uring_setup": "libc.syscall(425, 8, (ctypes.c_uint32 * 30)())",
    "init_module": f"libc.syscall({NUMBERS.get('init_module')}, None, 0, b'')",
    "finit_module": f"libc.syscall({NUMBERS.get('finit_module')}, 0, b'', 0)",
    "delete_module": f"libc.syscall({NUMBERS.get('delete_module')}, b'loop', 0)",
    "kexec_load": f"libc.syscall({NUMBERS.get('kexec_load')}, 0, 0, None, 0)",
    "userfaultfd(user mode)": f"libc.syscall({NUMBERS.get('userfaultfd')}, 1)",
    "socket(AF_NETLINK)": "libc.socket(16, 3, 0)",
    "socket(AF_VSOCK)": "libc.socket(40, 1, 0)",
    "socket(AF_PACKET)": "libc.socket(17, 3, 0)",
}
PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
found = {}
for name, attempt in ATTEMPTS.items():
    ctypes.set_errno(0)
    result = eval(attempt)
    found[name] = ctypes.get_errno() if result == -1 else 0
print(repr(found))
"""


@pytest.fixture(autouse=True)
def needs_fence(sandbox: LocalSandbox) -> None:
    fence = sandbox.isolation.kernel_fence
    if not fence.active:
        pytest.skip(f"no kernel fence here: {fence.detail}")


async def test_every_refused_call_fails_with_eperm_and_the_service_keeps_serving(
    sandbox: LocalSandbox, no_leftovers: Callable[[], None]
) -> None:
    code = f"ATTEMPTS = {ATTEMPTS!r}\n{PROBE}"
    result = await sandbox.run(RunRequest(code=code, timeout_s=10))
    assert result.status is RunStatus.SUCCESS, result.stderr
    found = ast.literal_eval(result.stdout)
    assert {name: os.strerror(err) for name, err in found.items() if err != 1} == {}
    no_leftovers()
    healthy = await sandbox.run(RunRequest(code="print('still serving')"))
    assert healthy.stdout == "still serving\n"


async def test_a_run_holds_no_capability_and_cannot_gain_one(sandbox: LocalSandbox) -> None:
    code = (
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith(('Cap', 'NoNewPrivs', 'Seccomp:')):\n"
        "        print(line, end='')\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    fields = dict(line.split(":\t") for line in result.stdout.splitlines())
    assert fields == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }


async def test_what_tool_code_needs_still_works(sandbox: LocalSandbox) -> None:
    # Sockets of the families multiprocessing and ordinary code use (no network: they only
    # open), threads (clone without namespace flags; clone3 falls back to it) and subprocess.
    code = (
        "import socket, subprocess, sys, threading\n"
        "for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):\n"
        "    socket.socket(family, socket.SOCK_STREAM).close()\n"
        "a, b = socket.socketpair()\n"
        "a.sendall(b'pair ')\n"
        "print(b.recv(5).decode(), end='')\n"
        "out = []\n"
        "threads = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(sorted(out), end=' ')\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,\n"
        "                     text=True).stdout, end='')\n"
    )
    result = await sandbox.run(RunRequest(code=code))
    assert result.status is RunStatus.SUCCESS, result.stderr
    assert result.stdout == "pair [0, 1, 2, 3] 42\n"
