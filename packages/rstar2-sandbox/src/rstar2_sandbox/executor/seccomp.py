"""The kernel boundary of a run: no capabilities, ``no_new_privs`` and a seccomp filter.

A run forked from the fork-server inherits its capability bounding set and could ask the kernel
for what containers are built from: ``unshare(CLONE_NEWUSER)`` gives a full capability set in a
new user namespace, and with it mounts, netlink sockets and the rest of the kernel's attack
surface. Before its code runs, each run therefore drops every capability (bounding, ambient,
inheritable, then effective and permitted), sets ``no_new_privs`` (no exec can give any back) and
loads a seccomp filter that refuses, with ``EPERM``, the calls in ``DENIED`` (namespaces,
mounts, ``ptrace``, ``bpf``, ``perf_event_open``, keyrings, ``io_uring``, modules, ``kexec``,
``userfaultfd``), ``clone`` with a namespace flag, and ``socket`` for any family but
``AF_UNIX``, ``AF_INET`` and ``AF_INET6``. ``clone3``, whose flags sit in memory a filter cannot
read, answers ``ENOSYS``: the C library then falls back to ``clone``, whose flags it can.

The filter is a classic BPF program built here and loaded with ``prctl(PR_SET_SECCOMP)``: no
dependency (the libseccomp bindings are not on PyPI but built with the C library; a
repackaging of them is not worth a compiled dependency for 49 instructions). Its verdict for
every call but ``clone`` and ``socket`` depends on the call's number alone, so the kernel caches
it and allowed calls cost nothing measurable. Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

from rstar2_sandbox.executor.syscalls import Feature, check_errno, libc

PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_SETPCAP = 8

# Classic BPF, as seccomp runs it over ``struct seccomp_data`` (nr, arch, ip, args[6]).
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets; arg 0's low half (both architectures are little-endian)
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# The namespace flags of clone(2) (CLONE_NEWTIME is 0x80, which in clone's flags is the exit
# signal: it only exists for clone3 and unshare, both refused whole).
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
CLONE_NAMESPACES |= 0x40000000
ALLOWED_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6

# Numbers 403 and up are shared by every architecture.
_COMMON = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}


@dataclass(frozen=True)
class Arch:
    """One architecture's ``AUDIT_ARCH`` value and the numbers of the calls that matter."""

    audit: int
    numbers: dict[str, int]
    x32_bit: bool = False  # x86_64: numbers with bit 30 set are the x32 ABI's (refused)


ARCHES = {
    "x86_64": Arch(
        0xC000003E,
        {
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "perf_event_open": 298,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "userfaultfd": 323,
            "open_by_handle_at": 304,
            "clone": 56,
            "socket": 41,
        },
        x32_bit=True,
    ),
    "aarch64": Arch(
        0xC00000B7,
        {
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "perf_event_open": 241,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "userfaultfd": 282,
            "open_by_handle_at": 265,
            "clone": 220,
            "socket": 198,
        },
    ),
}
# Refused whole: everything above but clone and socket (judged by their first argument) and
# clone3 (ENOSYS).
DENIED = tuple(
    name
    for name in [*ARCHES["x86_64"].numbers, *_COMMON]
    if name not in ("clone", "socket", "clone3")
)


def build_filter(arch: Arch) -> bytes:
    """The filter program for ``arch``: ``struct sock_filter`` entries, back to back."""
    numbers = {**arch.numbers, **_COMMON}
    # Each entry: (code, jump-if-true label, jump-if-false label, k); labels resolve to offsets.
    program: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, _ARCH),
        (_JEQ, None, "deny", arch.audit),
        (_LD_ABS, None, None, _NR),
    ]
    if arch.x32_bit:
        program.append((_JGE, "deny", None, 0x40000000))
    program += [(_JEQ, "deny", None, numbers[name]) for name in DENIED]
    program += [
        (_JEQ, "enosys", None, numbers["clone3"]),
        (_JEQ, "clone", None, numbers["clone"]),
        (_JEQ, "socket", None, numbers["socket"]),
        (_RET, None, None, RET_ALLOW),
    ]
    labels = {"clone": len(program)}
    program += [(_LD_ABS, None, None, _ARG0), (_JSET, "deny", "allow", CLONE_NAMESPACES)]
    labels["socket"] = len(program)
    program.append((_LD_ABS, None, None, _ARG0))
    program += [(_JEQ, "allow", None, family) for family in ALLOWED_FAMILIES]
    # Any other family falls through to the refusal.
    returns = (("deny", errno.EPERM | RET_ERRNO), ("allow", RET_ALLOW))
    for label, ret in (*returns, ("enosys", errno.ENOSYS | RET_ERRNO)):
        labels[label] = len(program)
        program.append((_RET, None, None, ret))

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(
        struct.pack("=HBBI", code, offset(at, jt), offset(at, jf), k)
        for at, (code, jt, jf, k) in enumerate(program)
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _prctl(option: int, arg: int, what: str, pointer: ctypes.Structure | None = None) -> None:
    zero = ctypes.c_ulong(0)
    third = zero if pointer is None else ctypes.byref(pointer)
    check_errno(libc.prctl(option, ctypes.c_ulong(arg), third, zero, zero), what)


class KernelFence:
    """The filter and what a run needs to fence itself in, made once in the fork-server: the
    child only makes four calls with it (each call's arguments built in the child would cost
    it more than the calls)."""

    def __init__(self, program: bytes, last_cap: int, drop_bounding: bool) -> None:
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // 8, ctypes.addressof(self._buffer))
        self._cap_header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
        self._cap_data = (_CapData * 2)()  # all zero: no capability at all
        self._capset = libc.capset  # looked up here: in each child the lookup alone costs 0.1 ms
        self.last_cap = last_cap
        self.drop_bounding = drop_bounding

    def drop_bounding_set(self) -> None:
        """Empty this process's capability bounding set (needs CAP_SETPCAP). The fork-server
        does it once, after its own set-up: the bounding set only limits what an exec or a
        capset can add, so it keeps the capabilities it has, and every run inherits the empty
        set."""
        if self.drop_bounding:
            for cap in range(self.last_cap + 1):
                _prctl(PR_CAPBSET_DROP, cap, "drop a capability from the bounding set")

    def apply(self) -> None:
        """Give up every capability, set ``no_new_privs`` and load the filter (this thread and
        all it starts from now on: a run is one thread when it is fenced)."""
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clear the ambient capabilities")
        header, data = ctypes.byref(self._cap_header), ctypes.byref(self._cap_data)
        check_errno(self._capset(header, data), "capset")
        _prctl(PR_SET_NO_NEW_PRIVS, 1, "set no_new_privs")
        _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, "load the seccomp filter", self._fprog)


def _has_cap(cap: int) -> bool:
    """Whether this process has ``cap`` in its effective set (``/proc/self/status``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    return False


def prepare_fence() -> tuple[Feature, KernelFence | None]:
    """The fence for this machine's architecture, tried in a throwaway child (a namespace and a
    netlink socket must be refused, an AF_UNIX socket must still open)."""
    machine = os.uname().machine
    arch = ARCHES.get(machine)
    if arch is None:
        return (False, f"no seccomp filter for {machine}"), None
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last_cap = int(handle.read())
    fence = KernelFence(build_filter(arch), last_cap, drop_bounding=_has_cap(CAP_SETPCAP))
    error = _try_fence(fence)
    if error:
        return (False, error), None
    bounding = (
        "bounding set emptied" if fence.drop_bounding else "bounding set kept (no CAP_SETPCAP)"
    )
    detail = (
        f"no capabilities ({bounding}), no_new_privs, seccomp refuses namespaces, mounts, "
        "ptrace, bpf, perf_event_open, keyrings, io_uring, modules, kexec, userfaultfd and "
        "sockets but AF_UNIX/AF_INET/AF_INET6 (EPERM)"
    )
    return (True, detail), fence


def _try_fence(fence: KernelFence) -> str:
    """Fence a forked child and check the filter bites; '' when it does, else what failed."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = b""
        try:
            os.close(read_fd)
            fence.drop_bounding_set()  # as the fork-server will, once it is set up
            fence.apply()
            # With libc, not the socket module: this process stays lean.
            for call, result in (
                ("socket(AF_NETLINK)", libc.socket(16, 3, 0)),
                ("unshare(CLONE_NEWUSER)", libc.unshare(ctypes.c_int(0x10000000))),
            ):
                if result != -1:
                    message = f"{call} was not refused".encode()
            if libc.socket(1, 1, 0) < 0:  # AF_UNIX, SOCK_STREAM
                message = b"an AF_UNIX socket was refused"
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}".encode()
        finally:
            os.write(write_fd, message[:1000])
            os._exit(0)
    os.close(write_fd)
    try:
        return os.read(read_fd, 1000).decode("utf-8", "replace")
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
