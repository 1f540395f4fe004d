"""Linux primitives the fork-server needs (namespaces, mounts, prctl), through libc.

Python 3.11 has no ``os.unshare`` or ``prctl``. This module is imported by the fork-server, which
must stay lean (every byte it maps makes each fork slower), so it uses the standard library only.
Each ``enable_*`` function returns ``(active, detail)``: a feature that could not be enabled is
reported inactive with the reason, never assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
# pivot_root(2) has no libc wrapper; its number differs between architectures.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

# World-writable places where an unprivileged run could otherwise leave files for other runs.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

Feature = tuple[bool, str]

libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def check_errno(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """Move this process into new namespaces (``unshare(2)``)."""
    check_errno(libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    """``mount(2)``."""
    check_errno(
        libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def umount_detached(target: str) -> None:
    """Detach the mount at ``target`` (``umount2(MNT_DETACH)``)."""
    check_errno(libc.umount2(target.encode(), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """``pivot_root(2)``."""
    machine = os.uname().machine
    number = _SYS_PIVOT_ROOT.get(machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {machine}")
    check_errno(libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def enter_pid_namespace(keep_out: tuple[int, ...] = ()) -> tuple[Feature, int]:
    """Go on in a new PID namespace, as its second process, with a ``/proc`` of its own.

    Three processes come of this one. The caller stays outside: it waits, then exits as the
    namespace's first process did. That one (pid 1, the namespace's init) only reaps and, when the
    second exits, exits with its status; when it exits, the kernel kills everything left in the
    namespace. The second (pid 2) returns from here, in a new private mount namespace with the
    new PID namespace's own ``/proc``. Being an ordinary process of the namespace, not its init,
    it receives orphans as a subreaper would, and signals as anywhere else (and ``kill(-1)``
    from a run reaches it, as on any host, where it fails for want of permission). The two
    others close the descriptors in ``keep_out``. Returns the feature and the second's pid as the
    caller's namespace sees it. When ``/proc`` cannot be mounted (say a container masks parts of
    the host's), the caller goes on alone, outside, and the feature is inactive.
    """
    own_pid = os.getpid()
    try:
        outside = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return (False, f"cannot open the PID namespace: {exc}"), own_pid
    try:
        unshare(CLONE_NEWPID)
    except OSError as exc:
        os.close(outside)
        return (False, f"unshare(CLONE_NEWPID) failed: {exc}"), own_pid
    ready_r, ready_w = os.pipe()
    # Held open by the caller until it exits: at EOF, it is gone.
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(ready_r)
        os.close(alive_w)
        os.close(outside)
        set_parent_death_signal(signal.SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)  # the caller died before the signal was armed
        os.close(alive_r)
        server = os.fork()
        if server == 0:
            # Killed with the namespace should pid 1 go: no parent-death signal needed.
            answer = b"ok"
            try:
                # Read before /proc is replaced: this process as the caller's namespace sees it.
                host_pid = int(os.readlink("/proc/self"))
                unshare(CLONE_NEWNS)
                mount("none", "/", None, MS_REC | MS_PRIVATE, None)
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            except OSError as exc:
                answer = str(exc).encode()
            os.write(ready_w, answer)
            os.close(ready_w)
            if answer != b"ok":
                os._exit(0)
            return (True, ""), host_pid
        os.close(ready_w)
        for fd in keep_out:
            os.close(fd)
        os._exit(_reap_until(server))
    os.close(ready_w)
    os.close(alive_r)
    answer = os.read(ready_r, 4096)
    os.close(ready_r)
    if answer != b"ok":
        os.close(alive_w)
        os.waitpid(init, 0)
        # Forks go to this process's own namespace again (the new one lost its pid 1).
        setns(outside, CLONE_NEWPID)
        os.close(outside)
        return (False, f"no /proc of its own in a PID namespace: {answer.decode()}"), own_pid
    os.close(outside)
    for fd in keep_out:
        os.close(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
    if code > 128:
        # Die as the fork-server did, so whoever started this process sees the same end.
        signal.signal(code - 128, signal.SIG_DFL)
        os.kill(os.getpid(), code - 128)
    os._exit(code & 0xFF)


def _reap_until(pid: int) -> int:
    """Reap every child (as a namespace's init must) until ``pid`` exits; its exit code, or 128
    plus the signal that killed it."""
    while True:
        try:
            child, status = os.wait()
        except InterruptedError:
            continue
        if child == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that forked it exits."""
    check_errno(libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0), "prctl(PDEATHSIG)")


def set_dumpable() -> None:
    """Let processes of this uid inspect this one (``/proc/<pid>``, ``ptrace``), as for any
    process a user starts; a change of uid had made it root's to inspect only."""
    check_errno(libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0), "prctl(DUMPABLE)")


def enable_subreaper() -> Feature:
    """Make orphaned descendants re-parent to this process (so it can find and reap them)."""
    try:
        check_errno(libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0), "prctl")
    except OSError as exc:
        return False, f"PR_SET_CHILD_SUBREAPER failed: {exc}"
    return True, ""


def enable_network_namespace() -> Feature:
    """Enter a fresh network namespace: its only interface (lo) is down, so nothing connects."""
    try:
        unshare(CLONE_NEWNET)
    except OSError as exc:
        return False, f"unshare(CLONE_NEWNET) failed: {exc}"
    return True, ""


def setns(fd: int, nstype: int) -> None:
    """Move this process into the namespace ``fd`` refers to (``setns(2)``)."""
    check_errno(libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount_quota_options(size_mb: int, inodes: int) -> str:
    """tmpfs options of a world-writable (sticky) directory with a size and an inode quota."""
    return f"size={size_mb}m,nr_inodes={inodes},mode=1777"


def kill_quietly(pid: int, sig: int = signal.SIGKILL, *, group: bool = False) -> None:
    """Send a signal to a process (or its group), ignoring ones already gone."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def python_roots() -> list[str]:
    """Directories a run must be able to read: the interpreter, its stdlib, every import root.

    A shared writable directory itself (``/tmp`` on ``sys.path`` when the caller's script lives
    there) is left out: what is in it is not the installation, and it is covered for the runs.
    """
    candidates = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    candidates.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    roots = sorted(candidates - {os.sep, *SHARED_WRITABLE_DIRS})
    # Keep only outermost directories: binding a root exposes everything under it.
    return [r for r in roots if not any(r.startswith(o + os.sep) for o in roots if o != r)]


def can_read_python_as(uid: int) -> Feature:
    """Check, in a forked probe that becomes ``uid``, that a run could import the stdlib."""
    stdlib = os.path.dirname(os.__file__)
    probe = os.path.join(stdlib, "secrets.py")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with open(probe, "rb"):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return True, ""
    return False, f"an unprivileged uid cannot read the Python installation ({stdlib})"
