"""Each slot's own ``/tmp`` and ``/dev/shm``: tmpfs in a mount namespace that its runs enter.

A run must see a writable ``/tmp`` and ``/dev/shm`` that no other run sees, with a quota of its
own, and empty when it starts. A fresh mount namespace per run gives that, but creating and
tearing down a namespace costs each run more than the rest of its setup. A slot runs one call at
a time, so each slot gets one namespace, made once: fresh tmpfs on ``/tmp`` and ``/dev/shm`` over
the fork-server's view. A run enters it with ``setns`` (no copy, no teardown) and creates its
working directory there; when it has ended and every process of it is gone, the fork-server
removes the working directory and checks with ``statvfs`` that both filesystems hold exactly the
inodes they held before the run. If the run left anything (a file, a directory, a changed
working directory), the slot gets a brand-new namespace instead of a cleanup: nothing a run
leaves, files, metadata or extended attributes, reaches the next one. The old namespace, and the
memory of its files, is freed when the last reference to it goes.

Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import contextlib
import os

from rstar2_sandbox.executor.binds import cover
from rstar2_sandbox.executor.syscalls import CLONE_NEWNS, mount_quota_options, unshare

# Files (and directories) a run may create in its /tmp and in its /dev/shm: an inode costs kernel
# memory that the size quota does not count.
TMP_INODES = 65536
SHM_INODES = 4096


class SlotTmp:
    """One slot's mount namespace with its own tmpfs on ``/tmp`` and ``/dev/shm``.

    ``ns_fd`` is what a run passes to ``setns``; ``reset`` (after a run) makes the slot clean
    again. Raises ``OSError`` when the namespace cannot be made (no CAP_SYS_ADMIN, say).
    """

    def __init__(self, tmp_mb: int, shm_mb: int, keep_under_tmp: list[str]) -> None:
        self.tmp_mb = tmp_mb
        self.shm_mb = shm_mb
        self.keep_under_tmp = keep_under_tmp
        self.ns_fd = self.tmp_fd = self.shm_fd = -1
        self._baseline = (0, 0)
        self._create()

    def _create(self) -> None:
        """Make the namespace in a short-lived helper, and keep handles on it."""
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(ready_r)
                os.close(done_w)
                unshare(CLONE_NEWNS)
                tmp = mount_quota_options(self.tmp_mb, TMP_INODES)
                cover("/tmp", self.keep_under_tmp, tmp)
                cover("/dev/shm", [], mount_quota_options(self.shm_mb, SHM_INODES))
                os.write(ready_w, b"ok")
                os.read(done_r, 1)  # stay in the namespace until the handles are taken
                code = 0
            except BaseException as exc:
                os.write(ready_w, f"{type(exc).__name__}: {exc}".encode()[:1000])
            finally:
                os._exit(code)
        os.close(ready_w)
        os.close(done_r)
        try:
            answer = os.read(ready_r, 1000)
            if answer != b"ok":
                raise OSError(f"could not make a slot's mount namespace: {answer.decode()}")
            # Through the helper's root, paths resolve in its namespace.
            ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            tmp_fd = os.open(f"/proc/{pid}/root/tmp", flags)
            shm_fd = os.open(f"/proc/{pid}/root/dev/shm", flags)
        finally:
            os.close(ready_r)
            os.close(done_w)
            os.waitpid(pid, 0)
        self.close()
        self.ns_fd, self.tmp_fd, self.shm_fd = ns_fd, tmp_fd, shm_fd
        self._baseline = self._used()

    def _used(self) -> tuple[int, int]:
        """Inodes in use on the slot's /tmp and /dev/shm."""
        tmp, shm = os.statvfs(self.tmp_fd), os.statvfs(self.shm_fd)
        return tmp.f_files - tmp.f_ffree, shm.f_files - shm.f_ffree

    def reset(self, workdir: str, files: tuple[str, ...] = ()) -> bool:
        """After a run (all of its processes gone): remove its working directory (a name in
        ``/tmp``) with the ``files`` the sandbox put there, and make sure nothing else is left;
        a new namespace when something is. Returns whether the slot was clean."""
        try:
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(workdir, name), dir_fd=self.tmp_fd)
            os.rmdir(workdir, dir_fd=self.tmp_fd)
            clean = self._used() == self._baseline
        except OSError:
            clean = False  # not empty, gone, not a directory: the run changed it
        if not clean:
            self.close()  # whatever happens next, no run enters this namespace again
            self._create()
        return clean

    def ensure(self) -> int:
        """The handle for the next run's ``setns`` (the namespace is made again if making it
        failed after the last run)."""
        if self.ns_fd < 0:
            self._create()
        return self.ns_fd

    def close(self) -> None:
        """Let go of the namespace (freed once no process is in it)."""
        for fd in (self.ns_fd, self.tmp_fd, self.shm_fd):
            if fd >= 0:
                os.close(fd)
        self.ns_fd = self.tmp_fd = self.shm_fd = -1
