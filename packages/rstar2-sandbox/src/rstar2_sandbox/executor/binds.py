"""Host paths shown at their own place inside a directory the fork-server builds or covers.

Runs must import from the Python installation wherever it lives: a virtual environment under
``/tmp`` or ``/var/tmp``, a tool environment under ``~/.cache``, ``$HOME``, ``/opt``. The
fork-server replaces the directories around it: its own root (``rootfs``), the private tmpfs over
``/tmp`` and the other shared writable directories, each slot's own ``/tmp``. Each of these shows
the installation's paths at the same place as on the host, and nothing else of the directory:
the symlinks on the way copied as they are, the directories on the way made empty, and each path
bound read-only as what it is (a file on a file, a directory on a directory).

``way_to`` reads the way while the host's view is still there, and holds a handle on each path to
bind; ``make`` builds it afterwards, under a new root or in a tmpfs that now hides the originals.
Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from rstar2_sandbox.executor.syscalls import (
    CLONE_NEWNS,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    SHARED_WRITABLE_DIRS,
    Feature,
    mount,
    unshare,
)

MAX_LINKS = 40


def under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one."""
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def bind_read_only(source: str, target: str, *, devices: bool = False) -> None:
    """Bind ``source`` at ``target``, read-only, without set-uid programs (or devices, unless
    ``devices``): the flags the source's own mount has are kept, since a mount may not lose them.
    """
    mount(source, target, None, MS_BIND, None)
    kept = os.statvfs(source).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if devices else MS_NODEV)
    for st_flag, ms_flag in (
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if kept & st_flag:
            flags |= ms_flag
    mount("none", target, None, flags, None)


@dataclass
class Way:
    """The steps that make host paths appear at their place: directories to make, symlinks to
    copy, and paths to bind (each with an ``O_PATH`` handle taken while it was visible, and
    whether it is a directory, a file or a device)."""

    within: str
    directories: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    binds: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def leaves(self) -> list[str]:
        """The paths bound and the symlinks copied: what a cover of a directory above them must
        keep for the same view."""
        return [*self.binds, *self.links]

    def add(self, path: str, *, device: bool = False, depth: int = 0) -> None:
        """Plan ``path`` (absolute): the way to it inside ``within``, then the path itself."""
        if depth > MAX_LINKS:
            raise OSError(f"too many levels of symbolic links under {path}")
        parts = [part for part in path.split(os.sep) if part]
        if not parts:
            raise ValueError("the host's root itself cannot be exposed")
        host = os.sep
        for index, part in enumerate(parts):
            host = os.path.join(host, part)
            if host in self.binds:
                return  # visible already, through a bind of it or of a directory above it
            if not under(host, [self.within]) or host == self.within:
                continue  # the covered directory and what is above it are there already
            info = os.lstat(host)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(host)
                self.links.setdefault(host, target)
                resolved = os.path.normpath(
                    os.path.join(os.path.dirname(host), target, *parts[index + 1 :])
                )
                if under(resolved, [self.within]):
                    self.add(resolved, device=device, depth=depth + 1)
                return  # outside: visible at its own place
            if index == len(parts) - 1:
                break
            if not stat.S_ISDIR(info.st_mode):
                raise NotADirectoryError(f"{host} (on the way to {path}) is not a directory")
            if host not in self.directories:
                self.directories.append(host)
        if host == self.within or host in self.links:
            return
        handle = os.open(host, os.O_PATH | os.O_CLOEXEC)
        if device:
            kind = "device"
        else:
            kind = "directory" if stat.S_ISDIR(os.fstat(handle).st_mode) else "file"
        self.binds[host] = (handle, kind)

    def make(self, root: str = "") -> None:
        """Build the planned view under ``root`` (``""``: in place, in a tmpfs now covering
        ``within``): directories, symlinks, then each bind, read-only."""
        for directory in self.directories:
            if not os.path.isdir(root + directory):
                os.mkdir(root + directory, 0o755)
        for link, target in self.links.items():
            if not os.path.lexists(root + link):
                os.symlink(target, root + link)
        for path, (handle, kind) in self.binds.items():
            inside = root + path
            if kind == "directory":
                os.makedirs(inside, 0o755, exist_ok=True)
            elif not os.path.lexists(inside):
                os.makedirs(os.path.dirname(inside), 0o755, exist_ok=True)
                os.close(os.open(inside, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            bind_read_only(f"/proc/self/fd/{handle}", inside, devices=kind == "device")

    def close(self) -> None:
        """Let go of the handles."""
        for handle, _ in self.binds.values():
            os.close(handle)
        self.binds.clear()


def way_to(paths: Iterable[str], within: str = os.sep, *, devices: Iterable[str] = ()) -> Way:
    """The way to each of ``paths`` inside ``within``, read from the current view (directories
    planned before files, so a file inside a bound directory is not bound again)."""
    way = Way(within)
    try:
        # Directories first: a path inside one already planned is skipped.
        for path in sorted(paths, key=lambda p: (not os.path.isdir(p), p)):
            way.add(path)
        for device in devices:
            way.add(device, device=True)
    except BaseException:
        way.close()
        raise
    return way


def cover(directory: str, keep: Iterable[str], options: str) -> list[str]:
    """Mount an empty tmpfs over ``directory``, with each of ``keep`` (paths inside it) shown again
    at its place, read-only. Returns the leaves kept (for a cover of this cover)."""
    way = way_to([path for path in keep if under(path, [directory])], directory)
    try:
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
        way.make()
        return way.leaves
    finally:
        way.close()


def enable_private_tmp(
    size_mb: int,
    keep: list[str],
    *,
    new_namespace: bool = True,
    directories: tuple[str, ...] = SHARED_WRITABLE_DIRS,
) -> tuple[Feature, list[str]]:
    """Hide the shared writable directories behind private, root-owned tmpfs mounts.

    Runs this process in a new mount namespace (with ``new_namespace``; else it has its own
    already), so the host never sees these mounts; they vanish with the process. Runs cannot
    create files in them (mode 0711): each run enters a namespace with its own ``/tmp`` and
    ``/dev/shm`` over them (``slot_tmp``), or, where that fails, keeps its working directory in
    this ``/tmp``. The paths of ``keep`` inside them (the Python installation, say a virtual
    environment under ``/tmp``) stay where they are, read-only. Returns the feature and the
    leaves kept under ``/tmp`` (what a slot's own ``/tmp`` must keep in turn).
    """
    try:
        if new_namespace:
            unshare(CLONE_NEWNS)
            # Keep our mounts from propagating back to the host's namespace.
            mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    except OSError as exc:
        return (False, f"mount namespace unavailable: {exc}"), []
    hidden: list[str] = []
    visible: list[str] = []
    kept_in_tmp: list[str] = []
    for directory in directories:
        if not os.path.isdir(directory):
            continue
        try:
            # 0711: a run may enter its own working directory but cannot create files here.
            kept = cover(directory, keep, f"size={size_mb}m,mode=0711")
        except OSError as exc:
            visible.append(f"{directory} ({exc})")
        else:
            hidden.append(directory)
            if directory == "/tmp":
                kept_in_tmp = kept
    if "/tmp" not in hidden:
        return (False, f"could not mount a private /tmp: {'; '.join(visible)}"), []
    detail = f"hidden: {', '.join(hidden)}"
    if visible:
        detail += f"; left visible: {', '.join(visible)}"
    return (True, detail), kept_in_tmp


def _closed_ancestor(path: str) -> str | None:
    """The outermost ancestor of ``path`` that other users cannot traverse, if any."""
    current = os.sep
    for part in path.strip(os.sep).split(os.sep)[:-1]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def expose_python(roots: list[str]) -> Feature:
    """Make the Python installation reachable for unprivileged runs, hiding what surrounds it.

    When the interpreter lives under a directory others cannot enter (say ``/root``), a run with
    its own uid could not import anything. Inside this process's private mount namespace, that
    directory is covered by an empty tmpfs and only the Python roots are shown again in it: runs
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
