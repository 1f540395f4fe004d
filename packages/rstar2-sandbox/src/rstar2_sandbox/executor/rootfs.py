"""Each fork-server's own root filesystem: everything a run can see of the host, in one place.

After preloading, a fork-server builds a small tmpfs holding only what running Python needs,
pivots into it and detaches the host's root, so every run it forks starts there and pays nothing
for it. The tree (the package README's "What a run sees" lists the same):

- **Read-only, at the same paths as on the host** (symlinks on the way are copied as they are):
  the Python installation a run needs (``python_paths``): the interpreter, a virtual
  environment's ``pyvenv.cfg``, the standard library (``lib-dynload`` with it), the
  site-packages directories on ``sys.path``, and each preloaded package found elsewhere; the
  system libraries (``library_paths``): the dynamic loader the interpreter names, and the
  directory of every shared object the fork-server has loaded from outside those paths (libc's
  directory holds the other system libraries later imports may load); and ``ETC_FILES``.
- **Devices**: ``DEVICES``, bound from the host, and the links of ``DEVICE_LINKS``.
- **Written for the runs**: ``/etc/passwd`` and ``/etc/group`` naming root, nobody and the slot
  users (``SLOT_USER``), so ``getpass.getuser()`` and ``pwd`` work as for a logged-in user.
- **Private**: ``/proc`` of the fork-server's own PID namespace, mounted ``hidepid=invisible`` (a
  run sees only its own processes); ``/tmp`` and ``/dev/shm`` (each slot's own tmpfs over them,
  see ``slot_tmp``), with the run's working directory ``/tmp/run-<uid>`` holding ``main.py``.

Nothing else: not the project, not ``/home`` or ``/root``, not the directories of the process
that started the service, no shell or other program. The root itself is read-only.

Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import os
import site
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from rstar2_sandbox.executor.binds import under, way_to
from rstar2_sandbox.executor.syscalls import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REMOUNT,
    Feature,
    mount,
    pivot_root,
    umount_detached,
)

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_LINKS = {
    "/dev/fd": "/proc/self/fd",
    "/dev/stdin": "/proc/self/fd/0",
    "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}
# The dynamic loader's cache (how ``dlopen`` finds system libraries) and the time zone.
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
SLOT_USER = "sandbox"
# Mounted over by the fork-server (``/proc``) and by each slot (``/tmp``, ``/dev/shm``).
MOUNT_POINTS = ("/proc", "/tmp", "/dev/shm")
# Holds directories, empty mount points and the two account files only.
ROOT_TMPFS = "size=4m,nr_inodes=4096,mode=0755"
PROC_OPTIONS = "hidepid=invisible"
PT_INTERP = 3


@dataclass(frozen=True)
class RootPlan:
    """What a fork-server's root holds: host paths bound read-only, and files written."""

    read_only: tuple[str, ...]
    files: dict[str, str]

    def describe(self) -> str:
        """One line for the isolation report."""
        return (
            f"read-only: {', '.join(self.read_only)}; devices: "
            f"{', '.join(os.path.basename(d) for d in DEVICES)}; written: "
            f"{', '.join(self.files)}; private: {', '.join(MOUNT_POINTS)} "
            f"(/proc {PROC_OPTIONS})"
        )


def python_paths(preloaded: Iterable[str]) -> list[str]:
    """The paths of the Python installation a run needs (as ``sys`` names them)."""
    paths = [sys.executable]
    if sys.prefix != sys.base_prefix:
        paths.append(os.path.join(sys.prefix, "pyvenv.cfg"))
    # The standard library (os.py lives there; lib-dynload too, on every layout we know) and
    # site-packages. (Not from sysconfig: importing it makes every fork copy more.)
    install = {os.path.dirname(os.__file__), *site.getsitepackages()}
    install = {os.path.realpath(p) for p in install}
    # sys.path entries inside the installation: the standard library, lib-dynload, site-packages
    # (not the project's own directories, which editable installs and test runners add).
    for entry in sys.path:
        if entry and os.path.exists(entry) and under(os.path.realpath(entry), install):
            paths.append(entry)
    covered = [os.path.realpath(p) for p in paths]
    for name in preloaded:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        locations = list(getattr(module, "__path__", None) or ([file] if file else []))
        for location in locations:
            if not under(os.path.realpath(location), covered):
                paths.append(location)
                covered.append(os.path.realpath(location))
    return list(dict.fromkeys(paths))


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable names (its ``PT_INTERP``), if any."""
    with open(path, "rb") as handle:
        header = handle.read(64)
        if header[:4] != b"\x7fELF":
            return None
        wide = header[4] == 2
        order = "<" if header[5] == 1 else ">"
        if wide:
            (table,) = struct.unpack_from(order + "Q", header, 32)
            size, count = struct.unpack_from(order + "HH", header, 54)
        else:
            (table,) = struct.unpack_from(order + "I", header, 28)
            size, count = struct.unpack_from(order + "HH", header, 42)
        for index in range(count):
            handle.seek(table + index * size)
            entry = handle.read(size)
            if struct.unpack_from(order + "I", entry)[0] != PT_INTERP:
                continue
            offset, length = (
                struct.unpack_from(order + "QQQQ", entry, 8)[::3]
                if wide
                else struct.unpack_from(order + "IIII", entry, 4)[::3]
            )
            handle.seek(offset)
            return handle.read(length).rstrip(b"\0").decode()
    return None


def library_paths(covered: Iterable[str]) -> list[str]:
    """The interpreter's dynamic loader, and the directory of every shared object this process
    has mapped from outside ``covered`` (read from ``/proc/self/maps``)."""
    roots = [os.path.realpath(p) for p in covered]
    paths: list[str] = []
    loader = elf_interpreter(os.path.realpath(sys.executable))
    if loader:
        paths.append(loader)
    with open("/proc/self/maps") as maps:
        fields = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    mapped = {entry[5] for entry in fields if len(entry) == 6}
    for path in sorted(mapped):
        if not path.startswith("/") or path.endswith(" (deleted)") or not os.path.isfile(path):
            continue
        directory = os.path.dirname(path)
        if not under(path, roots) and not under(directory, [*MOUNT_POINTS, "/dev"]):
            paths.append(directory)
    return list(dict.fromkeys(paths))


def account_files(slot_uids: Iterable[int]) -> dict[str, str]:
    """``/etc/passwd`` and ``/etc/group``: root, nobody and one ``SLOT_USER`` per slot uid."""
    uids = list(slot_uids)
    nologin = "/usr/sbin/nologin"
    passwd = [f"root:x:0:0:root:/root:{nologin}", f"nobody:x:65534:65534:nobody:/:{nologin}"]
    passwd += [f"{SLOT_USER}:x:{uid}:{uid}:{SLOT_USER}:/tmp/run-{uid}:{nologin}" for uid in uids]
    group = ["root:x:0:", "nogroup:x:65534:"] + [f"{SLOT_USER}:x:{uid}:" for uid in uids]
    return {"/etc/passwd": "\n".join(passwd) + "\n", "/etc/group": "\n".join(group) + "\n"}


def plan_root(preloaded: Iterable[str], slot_uids: Iterable[int]) -> RootPlan:
    """The root of a fork-server that preloaded ``preloaded`` and runs as ``slot_uids``."""
    python = python_paths(preloaded)
    etc = [path for path in ETC_FILES if os.path.lexists(path)]
    paths = list(dict.fromkeys([*python, *library_paths(python), *etc]))
    # A path without symlinks inside a directory of the list is there already.
    plain = [p for p in paths if os.path.realpath(p) == p]
    directories = [p for p in plain if os.path.isdir(p)]
    inside = {p for p in plain if any(p != d and under(p, [d]) for d in directories)}
    return RootPlan(
        read_only=tuple(p for p in paths if p not in inside), files=account_files(slot_uids)
    )


def _switch_root(root: str) -> str:
    """Make ``root`` this process's root and detach the old one; says how it was done."""
    os.chdir(root)
    try:
        # The old root is stacked on the new one, then detached: nothing of it stays reachable.
        pivot_root(".", ".")
    except OSError as exc:
        # pivot_root refuses an initramfs root; a run (no CAP_SYS_CHROOT) cannot leave a chroot.
        os.chroot(".")
        how = f"chroot (pivot_root failed: {exc.strerror})"
    else:
        umount_detached(".")
        how = "pivot_root"
    os.chdir("/")
    return how


def enter_root(plan: RootPlan, staging: str) -> tuple[Feature, list[str]]:
    """Build the root of ``plan`` on ``staging`` (an empty directory) and move into it.

    Needs this process's own private mount namespace (and, for ``/proc`` to show only the runs,
    its own PID namespace). On failure before the switch, nothing changes and the reason is
    returned; the caller mounts the private ``/tmp`` and ``/dev/shm`` after it, keeping the paths
    returned (what of the installation lies under ``/tmp``).
    """
    try:
        mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, ROOT_TMPFS)
    except OSError as exc:
        return (False, f"could not make the root: {exc}"), []
    try:
        way = way_to(plan.read_only, devices=DEVICES)
        try:
            way.make(staging)
            in_tmp = [path for path in way.leaves if under(path, ["/tmp"])]
        finally:
            way.close()
        for link, target in DEVICE_LINKS.items():
            os.symlink(target, staging + link)
        for path, text in plan.files.items():
            os.makedirs(os.path.dirname(staging + path), 0o755, exist_ok=True)
            with open(staging + path, "w") as handle:
                handle.write(text)
        for point in MOUNT_POINTS:
            os.makedirs(staging + point, 0o755, exist_ok=True)
        proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount("proc", staging + "/proc", "proc", proc_flags, PROC_OPTIONS)
        mount("none", staging, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        how = _switch_root(staging)
    except OSError as exc:
        umount_detached(staging)
        return (False, f"could not make the root: {exc}"), []
    return (True, f"{how}; {plan.describe()}"), in_tmp
