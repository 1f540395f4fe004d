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
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# World-writable places where an unprivileged run could otherwise leave files for other runs.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

Feature = tuple[bool, str]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """Move this process into new namespaces (``unshare(2)``)."""
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    """``mount(2)``."""
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that forked it exits."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0), "prctl(PDEATHSIG)")


def enable_subreaper() -> Feature:
    """Make orphaned descendants re-parent to this process (so it can find and reap them)."""
    try:
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0), "prctl")
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


def enable_private_tmp(size_mb: int, keep: list[str]) -> Feature:
    """Hide the shared writable directories behind private, root-owned tmpfs mounts.

    Runs this process in a new mount namespace, so the host never sees these mounts; they vanish
    with the process. Runs cannot create files in them (mode 0711): each run enters a namespace
    with its own ``/tmp`` and ``/dev/shm`` over them (``slot_tmp``), or, where that fails, keeps
    its working directory in this ``/tmp``. Directories in ``keep`` (the Python installation, say
    a virtual environment under ``/tmp``) stay reachable: they are bound back into the tmpfs that
    covers them.
    """
    try:
        unshare(CLONE_NEWNS)
        # Keep our mounts from propagating back to the host's namespace.
        mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    except OSError as exc:
        return False, f"mount namespace unavailable: {exc}"
    hidden: list[str] = []
    visible: list[str] = []
    for directory in SHARED_WRITABLE_DIRS:
        inside = [root for root in keep if root.startswith(directory + os.sep)]
        if not os.path.isdir(directory) or directory in keep:
            visible.append(directory)
            continue
        try:
            # 0711: a run may enter its own working directory but cannot create files here.
            cover(directory, inside, f"size={size_mb}m,mode=0711")
        except OSError:
            visible.append(directory)
        else:
            hidden.append(directory)
    if "/tmp" not in hidden:
        return False, "could not mount a private /tmp"
    detail = f"hidden: {', '.join(hidden)}"
    if visible:
        detail += f"; left visible: {', '.join(visible)}"
    return True, detail


def setns(fd: int, nstype: int) -> None:
    """Move this process into the namespace ``fd`` refers to (``setns(2)``)."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


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


MS_BIND = 0x1000


def python_roots() -> list[str]:
    """Directories a run must be able to read: the interpreter, its stdlib, every import root."""
    candidates = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    candidates.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    roots = sorted(candidates)
    # Keep only outermost directories: binding a root exposes everything under it.
    return [r for r in roots if not any(r.startswith(o + os.sep) for o in roots if o != r)]


def _closed_ancestor(path: str) -> str | None:
    """The outermost ancestor of ``path`` that other users cannot traverse, if any."""
    current = os.sep
    for part in path.strip(os.sep).split(os.sep)[:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def cover(directory: str, keep: list[str], options: str) -> None:
    """Mount an empty tmpfs over ``directory``, then bind each of ``keep`` (inside it) back."""
    # Handles taken before the tmpfs hides the originals; binding from them reaches what is below.
    handles = {root: os.open(root, os.O_PATH | os.O_DIRECTORY) for root in keep}
    try:
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for root, handle in handles.items():
            os.makedirs(root, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{handle}", root, None, MS_BIND | MS_REC, None)
    finally:
        for handle in handles.values():
            os.close(handle)


def expose_python(roots: list[str]) -> Feature:
    """Make the Python installation reachable for unprivileged runs, hiding what surrounds it.

    When the interpreter lives under a directory others cannot enter (say ``/root``), a run with
    its own uid could not import anything. Inside this process's private mount namespace, that
    directory is covered by an empty tmpfs and only the Python roots are bound back into it: runs
    can import, and the rest of the directory (a home with keys, say) stays out of sight.
    """
    plan: dict[str, list[str]] = {}
    for root in roots:
        closed = _closed_ancestor(root)
        if closed is not None:
            plan.setdefault(closed, []).append(root)
    for closed, inside in plan.items():
        try:
            cover(closed, inside, "size=1m,mode=0755")
        except OSError as exc:
            return False, f"could not expose {inside} under {closed}: {exc}"
    exposed = [root for inside in plan.values() for root in inside]
    return True, f"re-exposed {', '.join(exposed)}" if exposed else ""


def can_read_python_as(uid: int) -> Feature:
    """Check, in a forked probe that becomes ``uid``, that a run could import the stdlib."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
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
