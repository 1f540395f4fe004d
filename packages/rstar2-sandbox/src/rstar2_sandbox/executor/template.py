"""The template: the process every run of a fork-server forks from, which never holds a request.

A fork copies its parent's memory, freed memory included. Forked from the fork-server itself, a
run would start with whatever the fork-server had held: earlier runs' code, stdin and output, and
a concurrent run's result on its way out, readable through ``/proc/self/mem`` or
``gc.get_objects()``. So the fork-server forks once, when its set-up (preloads, warm-up, root,
kernel fence) is done and before any request arrives, and that copy, the template, forks the
runs. It receives only descriptors: for each run, its pipes and its slot's namespace handle
(``SCM_RIGHTS`` over a socket pair), and the run's process reads its own plan (code, limits)
from the head of its stdin pipe after the fork (``child.read_plan``); its output goes back
through its own pipes to the fork-server. What the template sends back is each run's pid and,
when the run exits, its wait status and CPU time (it is the runs' parent, so it reaps them).
Orphans of a run re-parent to the fork-server (a subreaper; the template is not one), which
finds and kills them as before. Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
from collections.abc import Iterator
from typing import NoReturn

from rstar2_sandbox.executor.child import STATUS_FD, RunDescriptors, ServerLimits, child_main
from rstar2_sandbox.executor.loop import Loop
from rstar2_sandbox.executor.syscalls import set_parent_death_signal

# The template's messages: kind, pid, wait status or errno, CPU seconds.
REPLY = struct.Struct("=Biid")
FORKED, FORK_FAILED, EXITED = 1, 2, 3
# A request is one byte with the run's descriptors attached (5: with the slot's namespace).
MAX_FDS = 5
# Where the template keeps its end of the socket: the fd a run's status pipe takes in the run, so
# no descriptor the template receives is ever numbered there (see ``child._confine``).
CHANNEL_FD = STATUS_FD


class Template:
    """The fork-server's handle on its template: ask for runs, read what happened to them."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.channel = channel
        self._replies = bytearray()

    @classmethod
    def start(cls, limits: ServerLimits) -> Template:
        """Fork the template (before this process has held any request)."""
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
        ours.setblocking(False)
        return cls(pid, ours)

    def fork(self, fds: RunDescriptors) -> None:
        """Ask for a run with these descriptors (the template answers ``FORKED`` or
        ``FORK_FAILED``, in the order asked)."""
        socket.send_fds(self.channel, [b"r"], fds.as_list())

    def replies(self) -> Iterator[tuple[int, int, int, float]]:
        """The messages that have arrived, as (kind, pid, status or errno, CPU seconds); raises
        ``EOFError`` once the template is gone."""
        while True:
            try:
                chunk = self.channel.recv(1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError("the template exited")
            self._replies += chunk
        whole = len(self._replies) - len(self._replies) % REPLY.size
        for at in range(0, whole, REPLY.size):
            yield REPLY.unpack_from(self._replies, at)
        del self._replies[:whole]


def _serve(limits: ServerLimits, parent: int, channel: socket.socket) -> NoReturn:
    """The template's life: fork a run per request, report pids and exits, until the fork-server
    goes (its end of the socket closes, or the parent-death signal)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
    # Nothing of the fork-server's (its control pipe, slots, counters) stays open here.
    os.dup2(channel.fileno(), CHANNEL_FD, inheritable=False)
    channel.close()
    os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX"))
    channel = socket.socket(fileno=CHANNEL_FD)
    own_pid = os.getpid()

    def report(kind: int, pid: int, value: int, cpu_s: float) -> None:
        channel.sendall(REPLY.pack(kind, pid, value, cpu_s))

    def on_request() -> None:
        message, fds, _, _ = socket.recv_fds(channel, 1, MAX_FDS)
        if not message:
            loop.running = False
            return
        try:
            pid = os.fork()
        except OSError as exc:
            report(FORK_FAILED, 0, exc.errno or errno.EAGAIN, 0.0)
        else:
            if pid == 0:
                child_main(limits, own_pid, RunDescriptors.of(fds))
            report(FORKED, pid, 0, 0.0)
        finally:
            for fd in fds:
                os.close(fd)

    def reap() -> None:
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            report(EXITED, pid, status, rusage.ru_utime + rusage.ru_stime)

    loop = Loop(reap)
    loop.add_reader(CHANNEL_FD, on_request)
    loop.run()
    os._exit(0)
