"""The template: the process every run of a fork-server forks from, which never holds a request.

A fork copies its parent's memory, freed memory included. Forked from the fork-server itself, a
run would start with whatever the fork-server had held: earlier runs' code, stdin and output, and
a concurrent run's result on its way out, readable through ``/proc/self/mem`` or
``gc.get_objects()``. So the fork-server forks once, when its set-up (preloads, warm-up, root,
kernel fence) is done and before any request arrives, and that copy, the template, forks the
runs. It receives only descriptors: for each run, its pipes and its slot's namespace handle
(``SCM_RIGHTS`` over a socket pair); the run's process reads its own plan (code, limits) from
the head of its stdin pipe after the fork (``child.read_plan``), and its output goes back through
its own pipes to the fork-server. The template answers each request with the run's pid, nothing
else.

It forks with ``clone(CLONE_PARENT)``: the run is the fork-server's child, not the template's, so
the fork-server reaps it (wait status, CPU time), gets its orphans (a subreaper) and is the
parent whose death kills it, as when it forked runs itself; the template only ever waits for the
next request. Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import struct
from typing import NoReturn

from rstar2_sandbox.executor.child import STATUS_FD, RunDescriptors, ServerLimits, child_main
from rstar2_sandbox.executor.syscalls import set_parent_death_signal

# The template's answer to a request: the run's pid, or minus the errno that stopped the fork.
ANSWER = struct.Struct("=i")
# A request is one byte with the run's descriptors attached (5: with the slot's namespace).
MAX_FDS = 5
# Where the template keeps its end of the socket: the fd a run's status pipe takes in the run, so
# no descriptor the template receives is ever numbered there (see ``child._confine``).
CHANNEL_FD = STATUS_FD

CLONE_PARENT = 0x00008000
# clone(2)'s number where its first argument is the flags (all but s390, where it is the stack).
_SYS_CLONE = {
    "x86_64": 56,
    "aarch64": 220,
    "riscv64": 220,
    "loongarch64": 220,
    "ppc64le": 120,
    "ppc64": 120,
    "i686": 120,
    "armv7l": 120,
}
# Called with the interpreter's lock held (a PyDLL), as ``os.fork`` calls fork(2).
_python = ctypes.pythonapi
_libc = ctypes.PyDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def fork_beside() -> int:
    """``os.fork``, except that the child's parent is this process's parent.

    The interpreter's own preparation and clean-up around the fork run as for ``os.fork``
    (``PyOS_BeforeFork`` / ``PyOS_AfterFork_Child``: locks, threads, ``os.register_at_fork``
    hooks such as ``random``'s reseeding); the C library's own fork handlers do not, which in a
    single-threaded process holding no lock changes nothing a run can see.
    """
    number = _SYS_CLONE.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"clone: unknown syscall number on {os.uname().machine}")
    flags = CLONE_PARENT | signal.SIGCHLD
    zero = ctypes.c_long(0)
    _python.PyOS_BeforeFork()
    pid = _libc.syscall(ctypes.c_long(number), ctypes.c_long(flags), zero, zero, zero, zero)
    error = ctypes.get_errno()
    if pid == 0:
        _python.PyOS_AfterFork_Child()
        return 0
    _python.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return int(pid)


class Template:
    """The fork-server's handle on its template."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.channel = channel

    @classmethod
    def start(cls, limits: ServerLimits) -> Template:
        """Fork the template (before this process has held any request)."""
        if os.uname().machine not in _SYS_CLONE:
            raise OSError(errno.ENOSYS, f"clone: unknown syscall number on {os.uname().machine}")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _serve(limits, parent, theirs)
            finally:
                os._exit(1)
        theirs.close()
        return cls(pid, ours)

    def fork(self, fds: RunDescriptors) -> int:
        """A run's process with these descriptors, this process's child; its pid. Waits for the
        template's answer (as long as a fork takes)."""
        socket.send_fds(self.channel, [b"r"], fds.as_list())
        answer = self.channel.recv(ANSWER.size, socket.MSG_WAITALL)
        if len(answer) < ANSWER.size:
            raise OSError(errno.EPIPE, "the template exited")
        (pid,) = ANSWER.unpack(answer)
        if pid < 0:
            raise OSError(-pid, f"fork failed: {os.strerror(-pid)}")
        return int(pid)


def _serve(limits: ServerLimits, parent: int, channel: socket.socket) -> NoReturn:
    """The template's life: fork a run per request until the fork-server goes (its end of the
    socket closes, or the parent-death signal)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
    # Nothing of the fork-server's (its control pipe, slots, counters) stays open here.
    os.dup2(channel.fileno(), CHANNEL_FD, inheritable=False)
    channel.close()
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX"))
    channel = socket.socket(fileno=CHANNEL_FD)
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 1, MAX_FDS)
        if not message:
            os._exit(0)
        try:
            pid = fork_beside()
        except OSError as exc:
            pid = -(exc.errno or errno.EAGAIN)
        if pid == 0:
            child_main(limits, parent, RunDescriptors.of(fds))
        channel.sendall(ANSWER.pack(pid))
        for fd in fds:
            os.close(fd)
