"""One build at a time in a folder: an exclusive ``flock`` on ``DIR/.lock``.

Two builds into one folder would append to the same checkpoint files and leave a cache that
no later build can read. A build holds the lock from its start to its end and writes its pid
into the file, so a second build can say whom it waits for. The kernel drops the lock when
its holder exits, however it exits (SIGKILL included), so a lock is never stale. The holder
removes the file before it lets go; whoever then gets the lock on the removed file tries
again on the path's new one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

logger = logging.getLogger(__name__)
LOCK_FILE = ".lock"
_PID_WAIT_S = 1.0  # a new holder writes its pid right after taking the lock


class FolderLockedError(RuntimeError):
    """Another process holds the folder's lock."""


@contextmanager
def folder_lock(folder: Path, *, wait: bool) -> Iterator[None]:
    """Hold ``folder``'s lock for the block (creating the folder); when another process holds
    it, wait for it (``wait``) or raise ``FolderLockedError`` naming its pid."""
    path = folder / LOCK_FILE
    descriptor = _acquire(path, wait=wait)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(descriptor)


def _acquire(path: Path, *, wait: bool) -> int:
    announced = False
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # a failed build removed the folder it had created
            continue
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(descriptor)
                if not wait:
                    raise FolderLockedError(
                        f"{path.parent} is being built by process {holder}; wait for it to "
                        "finish, or pass --wait to start when it does"
                    ) from None
                if not announced:
                    logger.warning("waiting for process %s, building into %s", holder, path.parent)
                    announced = True
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            if _is_current(descriptor, path):
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
                return descriptor
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)  # the holder removed this file as it let go: lock the new one


def _holder(descriptor: int) -> str:
    """The pid the holder wrote, or "unknown" when none appears."""
    deadline = time.monotonic() + _PID_WAIT_S
    while True:
        text = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip()
        if text or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.05)


def _is_current(descriptor: int, path: Path) -> bool:
    """Whether ``descriptor`` is still the file at ``path``."""
    with suppress(FileNotFoundError):
        current, held = os.stat(path), os.fstat(descriptor)
        return (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)
    return False
