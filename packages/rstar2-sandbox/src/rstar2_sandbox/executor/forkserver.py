"""The fork-server: a long-lived, pre-warmed process that forks one confined child per run.

Started by ``ExecutorPool`` as ``python -m rstar2_sandbox.executor.forkserver``. It talks over its
stdin/stdout (frames, see ``wire``), imports the preload modules once, forks its template (a copy
that never holds a request, see ``template``), and for each call has the template fork a child
(``child.child_main``), feeds the child its plan and stdin, drains stdout/stderr as they come with
byte caps, enforces the wall-clock limit, and after the child exits kills everything the run left
behind before it reports the slot free. Standard library only: what this process maps, every
fork pays for.
"""

from __future__ import annotations

import errno
import gc
import importlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rstar2_sandbox.executor.binds import enable_private_tmp, expose_python, under
from rstar2_sandbox.executor.child import (
    FILENAME,
    RunDescriptors,
    RunPlan,
    ServerLimits,
    minimal_environment,
)
from rstar2_sandbox.executor.loop import Loop, Timer
from rstar2_sandbox.executor.prefix_cache import PrefixCache
from rstar2_sandbox.executor.rootfs import enter_root, plan_root
from rstar2_sandbox.executor.seccomp import KernelFence, prepare_fence
from rstar2_sandbox.executor.slot_tmp import SlotTmp
from rstar2_sandbox.executor.syscalls import (
    Feature,
    can_read_python_as,
    enable_network_namespace,
    enable_subreaper,
    enter_pid_namespace,
    kill_quietly,
    python_roots,
    set_parent_death_signal,
)
from rstar2_sandbox.executor.template import Template
from rstar2_sandbox.executor.warmup import warm_up
from rstar2_sandbox.executor.wire import REQUEST, message_header

log = logging.getLogger("rstar2_sandbox.forkserver")

READ_CHUNK = 1 << 16
# After the run's process exits and its leftovers are killed, its pipes reach EOF at once; this
# bounds the wait should a writer somehow survive.
EOF_GRACE_S = 2.0
SWEEP_ROUNDS = 50
# Room a full tmpfs may still report: a write that fails with ENOSPC has used every page.
QUOTA_SLACK_BYTES = 64 << 10
# CPU time the kernel's SIGXCPU may come short of the soft limit (rusage is sampled per tick).
CPU_SLACK_S = 0.5


class OomCounter:
    """The kernel's count of processes its OOM killer has killed since boot (``/proc/vmstat``,
    kept open: read at every run's start, it costs about 30 microseconds)."""

    def __init__(self) -> None:
        try:
            self.fd = os.open("/proc/vmstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = -1

    def read(self) -> int:
        """The count now; -1 when the kernel does not say."""
        if self.fd < 0:
            return -1
        data = os.pread(self.fd, 1 << 16, 0)
        at = data.find(b"\noom_kill ")
        return -1 if at < 0 else int(data[at + 10 : data.index(b"\n", at + 1)])


@dataclass(frozen=True)
class Observed:
    """What the fork-server saw of a finished run, itself or from the kernel: never the run's
    output, which the run writes as it likes."""

    timed_out: bool  # its own wall-clock timer fired (and it killed the run)
    output_exceeded: bool  # its own byte counters passed a stream's cap (and it killed the run)
    cpu_time_s: float  # the kernel's account of the run's CPU time
    cpu_limit_s: int  # RLIMIT_CPU's soft limit, at which the kernel sends SIGXCPU
    oom_killed: bool  # the kernel's OOM-kill count rose while the run ran
    file_at_limit: bool  # a file of the run's reached the file-size limit
    quota_full: bool  # the run's own /tmp or /dev/shm had no room left when it ended


def classify(wait_status: int, seen: Observed) -> tuple[str, int | None, int | None, str | None]:
    """(status, exit code, signal, write limit) of a finished run, from what was observed.

    The write limit is which limit on what a run writes stopped it, if one did: ``output``
    (stdout/stderr caps), ``file`` (the file-size limit) or ``space`` (the quota of its own
    ``/tmp`` or ``/dev/shm``). A signal the run sends itself, or an error it prints, chooses
    nothing: a SIGKILL counts as the OOM killer's only when the kernel's count rose, a SIGXCPU
    as the CPU limit only when the run used that much CPU, a failure as a write limit only when
    the limit was reached.
    """
    exit_code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
    sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    limit: str | None = None
    if seen.output_exceeded:
        status, limit = "output_limit_exceeded", "output"
    elif seen.timed_out or (
        sig == signal.SIGXCPU and seen.cpu_time_s >= seen.cpu_limit_s - CPU_SLACK_S
    ):
        status = "timeout"
    elif sig == signal.SIGKILL and seen.oom_killed:
        status = "memory_exceeded"
    elif exit_code == 0:
        status = "success"
    elif seen.file_at_limit:
        status, limit = "output_limit_exceeded", "file"
    elif seen.quota_full:
        status, limit = "output_limit_exceeded", "space"
    else:
        status = "runtime_error"
    return status, exit_code, sig, limit


def _has_file_at(top: str, dir_fd: int | None, size: int) -> bool:
    """Whether a regular file under ``top`` (relative to ``dir_fd``) is ``size`` bytes or more."""
    for _, _, files, root_fd in os.fwalk(top, dir_fd=dir_fd):
        for name in files:
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size >= size:
                return True
    return False


def _is_full(dir_fd: int) -> bool:
    """Whether the tmpfs at ``dir_fd`` has no room for another page or no inode left."""
    info = os.statvfs(dir_fd)
    return info.f_bavail * info.f_frsize <= QUOTA_SLACK_BYTES or info.f_favail == 0


class Capture:
    """Reads one pipe as data arrives, keeping at most ``cap`` bytes and counting the rest."""

    __slots__ = ("cap", "data", "eof", "fd", "name", "on_change", "produced", "truncated")

    def __init__(self, name: str, fd: int, cap: int, on_change: Any) -> None:
        self.name = name
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.produced = 0
        self.truncated = False
        self.eof = False
        self.on_change = on_change

    def read(self) -> None:
        """Read everything available now."""
        while self.fd >= 0:
            try:
                chunk = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                self.on_change()
                return
            self.produced += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room and not self.truncated:
                # Stops the run (and may finish it, closing the pipe); what still comes is
                # only counted, for the note that says how much the run wrote.
                self.truncated = True
                self.on_change()

    def close(self) -> None:
        """Close the pipe."""
        os.close(self.fd)
        self.fd = -1

    def note(self) -> str:
        """The line that tells the run's reader it went over this stream's cap."""
        return (
            f"sandbox: {self.name} exceeded the output limit of {self.cap} bytes "
            f"(at least {self.produced} bytes were written); the run was stopped"
        )


class Run:
    """One call, from fork to the reported result."""

    def __init__(self, server: ForkServer, call_id: int, slot: int, request: dict[str, Any]):
        self.server = server
        self.call_id = call_id
        self.slot = slot
        self.uid = server.slot_uids[slot] if server.drop_uid else None
        self.timed_out = False
        self.exited: tuple[int, float] | None = None
        self.finished = False
        self.eof_timer: Timer | None = None
        self.workdir = os.path.join(server.workroot, f"run-{server.slot_uids[slot]}")
        limit = int(request["output_limit_bytes"])
        timeout_s = float(request["timeout_s"])
        code = str(request["code"])
        display_last_expr = bool(request["display_last_expr"])
        plan = RunPlan(
            code=code,
            split=None if display_last_expr else server.prefixes.split(code),
            display_last_expr=display_last_expr,
            workdir=self.workdir,
            uid=self.uid,
            address_space_bytes=int(request["memory_mb"]) << 20,
            cpu_seconds=math.ceil(timeout_s) + 1,
        )
        self.cpu_limit_s = plan.cpu_seconds
        # The child reads its plan first, then the rest is its stdin.
        self.stdin_data = memoryview(plan.encode() + str(request["stdin"]).encode())

        # First: should the slot's namespace need making and fail, nothing is left open.
        mount_ns_fd = server.slot_tmps[slot].ensure() if server.slot_tmps else None
        in_r, self.stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        self.oom_kills = server.oom.read()
        self.started = time.monotonic()
        loop = server.loop
        # Before the fork: the child finds its plan in the pipe instead of waiting for it.
        os.set_blocking(self.stdin_w, False)
        self.feed_stdin()
        try:
            self.pid = server.template.fork(
                RunDescriptors(in_r, out_w, err_w, status_w, mount_ns_fd)
            )
        except OSError:
            if self.stdin_w >= 0:
                loop.remove_writer(self.stdin_w)
                os.close(self.stdin_w)
            for fd in (out_r, err_r, status_r):
                os.close(fd)
            raise
        finally:
            # The child's ends (the template passed copies on and closed its own).
            for fd in (in_r, out_w, err_w, status_w):
                os.close(fd)
        server.runs[self.pid] = self
        self.status_r = status_r
        self.stdout = Capture("stdout", out_r, limit, self.check)
        self.stderr = Capture("stderr", err_r, limit, self.check)
        for capture in (self.stdout, self.stderr):
            os.set_blocking(capture.fd, False)
            loop.add_reader(capture.fd, capture.read)
        self.timer = loop.call_later(timeout_s, self.on_timeout)

    def feed_stdin(self) -> None:
        """Write as much stdin as the pipe takes; close it when done (the child sees EOF)."""
        loop = self.server.loop
        try:
            while self.stdin_data:
                written = os.write(self.stdin_w, self.stdin_data)
                self.stdin_data = self.stdin_data[written:]
        except BlockingIOError:
            loop.add_writer(self.stdin_w, self.feed_stdin)
            return
        except OSError:
            pass  # The child closed stdin or exited: the rest is unwanted.
        loop.remove_writer(self.stdin_w)
        os.close(self.stdin_w)
        self.stdin_w = -1

    def on_timeout(self) -> None:
        self.timed_out = True
        self.kill()

    def kill(self) -> None:
        """Kill the run's process group (its session leader's group)."""
        if self.exited is None:
            kill_quietly(self.pid, group=True)
            kill_quietly(self.pid)

    def check(self) -> None:
        """Advance the run: stop a run over its output cap, finish once exited and drained."""
        if self.stdout.truncated or self.stderr.truncated:
            self.kill()
        if self.exited is None or self.finished:
            return
        drained = all(c.eof or c.truncated for c in (self.stdout, self.stderr))
        if drained or (self.eof_timer is not None and self.eof_timer.cancelled):
            self.finish()

    def on_exit(self, wait_status: int, cpu_time_s: float) -> None:
        """The run's process exited (its wait status and CPU time, its reaped descendants'
        included): kill what it left behind, then finish when pipes close."""
        self.exited = (wait_status, cpu_time_s)
        self.wall_time_s = time.monotonic() - self.started
        self.timer.cancel()
        kill_quietly(self.pid, group=True)
        self.server.sweep(self)
        for capture in (self.stdout, self.stderr):
            capture.read()
        self.eof_timer = self.server.loop.call_later(EOF_GRACE_S, self.on_eof_grace)
        self.check()

    def on_eof_grace(self) -> None:
        assert self.eof_timer is not None
        self.eof_timer.cancelled = True
        self.check()

    def finish(self) -> None:
        self.finished = True
        assert self.exited is not None
        wait_status, cpu_time_s = self.exited
        loop = self.server.loop
        if self.eof_timer is not None:
            self.eof_timer.cancel()
        for capture in (self.stdout, self.stderr):
            loop.remove_reader(capture.fd)
            capture.close()
        if self.stdin_w >= 0:
            loop.remove_writer(self.stdin_w)
            os.close(self.stdin_w)
        try:
            setup_error = os.read(self.status_r, 4096)
        except BlockingIOError:
            setup_error = b""
        os.close(self.status_r)
        seen = self.observe(wait_status, cpu_time_s)
        if self.server.slot_tmps:
            try:
                self.server.slot_tmps[self.slot].reset(os.path.basename(self.workdir), (FILENAME,))
            except OSError:
                # The slot is closed: its next run makes the namespace again or fails cleanly.
                log.exception("could not give slot %d a fresh /tmp", self.slot)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        stderr = self.stderr.data
        notes: list[str] = []
        if setup_error:
            status, exit_code, sig = "internal_error", None, None
            stderr = bytearray(b"sandbox setup failed: " + setup_error)
            log.error("run setup failed: %s", setup_error.decode("utf-8", "replace"))
        else:
            status, exit_code, sig, limit = classify(wait_status, seen)
            notes = self.limit_notes(limit)
        if notes:
            # Said after what the run printed (past the cap: the note is the sandbox's, not the
            # run's output), so every API shows why the run stopped and how much it wrote.
            if stderr and not stderr.endswith(b"\n"):
                stderr += b"\n"
            stderr += ("\n".join(notes) + "\n").encode()
        result = {
            "status": status,
            "exit_code": exit_code,
            "signal": sig,
            "stdout_bytes": len(self.stdout.data),
            "stdout_truncated": self.stdout.truncated,
            "stderr_truncated": self.stderr.truncated,
            "wall_time_s": self.wall_time_s,
            "cpu_time_s": cpu_time_s,
        }
        self.server.send({"id": self.call_id, "result": result}, self.stdout.data, stderr)

    def observe(self, wait_status: int, cpu_time_s: float) -> Observed:
        """What the server saw of the run, before its files are removed. Its files are only
        looked at when it failed (a success is a success whatever it wrote)."""
        failed = not (os.WIFEXITED(wait_status) and os.WEXITSTATUS(wait_status) == 0)
        file_at_limit = quota_full = False
        if failed:
            size = self.server.settings["max_file_bytes"]
            if self.server.slot_tmps:
                slot = self.server.slot_tmps[self.slot]
                places = [fd for fd in (slot.tmp_fd, slot.shm_fd) if fd >= 0]
                file_at_limit = any(_has_file_at(".", fd, size) for fd in places)
                quota_full = any(_is_full(fd) for fd in places)
            else:
                file_at_limit = _has_file_at(self.workdir, None, size)
        # Read again only when it matters: the run died of a SIGKILL the server did not send.
        killed = os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGKILL
        oom_killed = killed and self.server.oom.read() > self.oom_kills >= 0
        return Observed(
            timed_out=self.timed_out,
            output_exceeded=self.stdout.truncated or self.stderr.truncated,
            cpu_time_s=cpu_time_s,
            cpu_limit_s=self.cpu_limit_s,
            oom_killed=oom_killed,
            file_at_limit=file_at_limit,
            quota_full=quota_full,
        )

    def limit_notes(self, limit: str | None) -> list[str]:
        """Lines saying which write limit stopped the run (none when none did)."""
        settings = self.server.settings
        if limit == "output":
            return [c.note() for c in (self.stdout, self.stderr) if c.truncated]
        if limit == "file":
            cap = settings["max_file_bytes"]
            return [f"sandbox: a file reached the file-size limit of {cap} bytes"]
        if limit == "space" and self.server.run_tmp_mb is not None:
            tmp_mb, shm_mb = self.server.run_tmp_mb
            return [
                f"sandbox: the run's disk quota is full ({tmp_mb} MiB for /tmp and the working "
                f"directory, {shm_mb} MiB for /dev/shm)"
            ]
        return []


class ForkServer:
    """The fork-server's state: control channel, runs in flight, children to reap."""

    def __init__(
        self,
        ctl_in: int,
        ctl_out: int,
        config: dict[str, Any],
        workroot: str,
        drop_uid: bool,
        run_tmp_mb: tuple[int, int] | None,
        slot_tmps: list[SlotTmp],
        template: Template,
    ) -> None:
        self.ctl_in = ctl_in
        self.ctl_out = ctl_out
        self.settings: dict[str, Any] = config["settings"]
        self.slot_uids: list[int] = config["slot_uids"]
        self.workroot = workroot
        self.drop_uid = drop_uid
        # Quotas of each run's own /tmp and /dev/shm (MiB), and each slot's namespace with them;
        # None and empty: runs share this server's view.
        self.run_tmp_mb = run_tmp_mb
        self.slot_tmps = slot_tmps
        self.template = template
        self.prefixes = PrefixCache()
        self.oom = OomCounter()
        self.runs: dict[int, Run] = {}
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.loop = Loop(self.reap)
        os.set_blocking(ctl_in, False)
        os.set_blocking(ctl_out, False)
        self.loop.add_reader(ctl_in, self.on_control)

    # -- control channel ------------------------------------------------------------------------

    def on_control(self) -> None:
        try:
            chunk = os.read(self.ctl_in, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self.shutdown()
            return
        self.inbox += chunk
        while len(self.inbox) >= REQUEST.size:
            (length,) = REQUEST.unpack_from(self.inbox)
            if len(self.inbox) < REQUEST.size + length:
                break
            message = json.loads(self.inbox[REQUEST.size : REQUEST.size + length])
            del self.inbox[: REQUEST.size + length]
            self.start(message)

    def start(self, message: dict[str, Any]) -> None:
        call_id = int(message["id"])
        try:
            Run(self, call_id, int(message["slot"]), message["request"])
        except Exception as exc:
            log.exception("could not start call %s", call_id)
            result = {"status": "internal_error", "stdout_bytes": 0}
            self.send({"id": call_id, "result": result}, str(exc).encode())

    def send(self, message: dict[str, Any], *raw: bytes | bytearray) -> None:
        """Queue a message with raw bytes after it (a result's output streams), and write."""
        self.outbox += message_header(message, sum(len(part) for part in raw))
        for part in raw:
            self.outbox += part
        self.flush()

    def flush(self) -> None:
        try:
            while self.outbox:
                written = os.write(self.ctl_out, self.outbox)
                del self.outbox[:written]
        except BlockingIOError:
            self.loop.add_writer(self.ctl_out, self.flush)
            return
        except BrokenPipeError:
            self.shutdown()
            return
        self.loop.remove_writer(self.ctl_out)

    def shutdown(self) -> None:
        """The pool went away: kill every run and stop."""
        for run in list(self.runs.values()):
            run.kill()
        for uid in self.slot_uids if self.drop_uid else ():
            kill_uid(uid)
        self.loop.running = False

    # -- children -------------------------------------------------------------------------------

    def reap(self) -> None:
        """Collect every exited child: runs get their status, adopted orphans are discarded."""
        while True:
            try:
                pid, wait_status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.runs.pop(pid, None)
            if run is not None:
                run.on_exit(wait_status, rusage.ru_utime + rusage.ru_stime)
            elif pid == self.template.pid:
                # No run can start without it, and no new one can be made clean: stop, without
                # a result for the runs this kills (the pool fails them and starts a new server).
                log.error("the template (pid %d) exited", pid)
                self.shutdown()
                return

    def orphans_of(self, run: Run) -> list[int]:
        """Live adopted descendants (subreaper) that belong to ``run``'s slot."""
        pid = os.getpid()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as handle:
                children = [int(p) for p in handle.read().split()]
        except OSError:
            return []
        found = []
        for child in children:
            if child in self.runs or child == self.template.pid:
                continue
            owner = _owner(child, by_uid=self.drop_uid)
            if owner is None:
                continue
            if self.drop_uid:
                mine = owner == self.slot_uids[run.slot]
            else:
                # Same uid for all runs: attribute by session; unattributable escapees go too.
                mine = owner == run.pid or owner not in self.runs
            if mine:
                found.append(child)
        return found

    def sweep(self, run: Run) -> None:
        """Kill everything the run started that outlived it (daemons, setsid escapees, bombs)."""
        for _ in range(SWEEP_ROUNDS):
            orphans = self.orphans_of(run)
            if not orphans:
                return
            if self.drop_uid:
                kill_uid(self.slot_uids[run.slot])
            else:
                for orphan in orphans:
                    kill_quietly(orphan, group=True)
                    kill_quietly(orphan)
            time.sleep(0.001)
            self.reap()
        log.error("processes of call %s survived %d kill rounds", run.call_id, SWEEP_ROUNDS)


def _owner(pid: int, *, by_uid: bool) -> int | None:
    """Real uid (``by_uid``) or session id of a live process; None for zombies and the gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    if not by_uid:
        return int(fields[3])
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a short-lived helper that becomes ``uid`` to do it).

    ``kill(-1)`` from a process of that uid reaches exactly the processes of that uid, including
    ones that escaped the run's session; a pending SIGKILL also stops a fork in flight.
    """
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(3):
                os.kill(-1, signal.SIGKILL)
        except BaseException:
            pass
        finally:
            os._exit(0)
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def _read_frame(fd: int) -> bytes:
    def read_exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("control pipe closed before the configuration arrived")
            data += chunk
        return data

    (length,) = REQUEST.unpack(read_exactly(REQUEST.size))
    return read_exactly(length)


def _feature(result: Feature) -> dict[str, Any]:
    return {"active": result[0], "detail": result[1]}


def _prune_sys_path(visible: list[str]) -> None:
    """Keep only the ``sys.path`` entries runs can see (``visible``, as real paths)."""
    kept = [p for p in sys.path if under(os.path.realpath(p), visible)]
    for entry in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept


class StartError(Exception):
    """The fork-server cannot serve: what failed, and what to do about it."""

    def __init__(self, cause: str, remedy: str) -> None:
        super().__init__(f"{cause}; {remedy}")


def start_failure(exc: BaseException) -> str:
    """What the pool is told when this fork-server cannot start: the cause (path, mount or
    capability) and what to do about it."""
    if isinstance(exc, StartError):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES):
        remedy = (
            "the service lacks a privilege its isolation needs (root, or CAP_SYS_ADMIN for "
            "namespaces and mounts; in a container, one allowed to make them); start as root, or "
            "with isolate=False (--no-isolate) to run code without isolation"
        )
    elif isinstance(exc, OSError) and exc.errno == errno.EROFS:
        remedy = f"{exc.filename or 'a path it writes'} is on a read-only mount: report this"
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.ENOSPC):
        remedy = "the machine is out of memory or of tmpfs space: free some, or lower the quotas"
    else:
        remedy = "see the fork-server's log above; isolate=False (--no-isolate) skips isolation"
    return f"{text}; {remedy}"


def main() -> None:
    """Configure, isolate and preload, then serve calls until the pool closes the pipe."""
    logging.basicConfig(level=logging.INFO, format="forkserver %(process)d: %(message)s")
    # The control pipe moves off fds 0/1 so nothing a preloaded module prints can corrupt it.
    ctl_in, ctl_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    config = json.loads(_read_frame(ctl_in))
    sys.path[:] = config["sys_path"]
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != config["parent_pid"]:
        return
    try:
        server, hello = _start(ctl_in, ctl_out, config)
    except Exception as exc:
        log.exception("could not start")
        os.write(ctl_out, message_header({"error": start_failure(exc)}, 0))
        sys.exit(1)
    server.send(hello)
    try:
        server.loop.run()
    finally:
        if server.workroot != "/tmp":
            shutil.rmtree(server.workroot, ignore_errors=True)


def _start(ctl_in: int, ctl_out: int, config: dict[str, Any]) -> tuple[ForkServer, dict[str, Any]]:
    """Isolate this process, preload, and make the server; the message that says it is ready."""
    settings = config["settings"]
    is_root = os.geteuid() == 0
    isolate = bool(settings["isolate"])
    drop_uid = isolate and is_root
    reason = "" if drop_uid else ("disabled" if not isolate else "server is not root")
    slot_uids: list[int] = config["slot_uids"]
    # Found before any mount can hide them; runs must always be able to import from these.
    roots = python_roots()
    quotas = (int(settings["tmp_size_mb"]), int(settings["shm_size_mb"]))
    # Sized for the fallback where runs keep their working directories in this /tmp.
    shared_mb = quotas[0] * len(slot_uids)
    host_pid = os.getpid()
    features: dict[str, Feature] = {}
    if isolate:
        # First: from here on this process is pid 1 of its own PID namespace (its parent, left
        # outside, only waits for it), in a mount namespace of its own with its own /proc.
        features["pid_namespace"], host_pid = enter_pid_namespace((ctl_in, ctl_out))
        logging.getLogger().handlers[0].setFormatter(
            logging.Formatter(f"forkserver {host_pid}: %(message)s")
        )
        features["network_namespace"] = enable_network_namespace()
        features["private_tmp"], keep_under_tmp = enable_private_tmp(
            shared_mb, keep=roots, new_namespace=not features["pid_namespace"][0]
        )
    else:
        features["pid_namespace"] = features["network_namespace"] = (False, "disabled")
        features["private_tmp"], keep_under_tmp = (False, "disabled"), []
    # Not inherited across the fork above.
    features["subreaper"] = enable_subreaper()
    features["rlimits"] = (True, "")

    # Before preloading (numeric libraries size their thread pools at import); runs inherit it.
    os.environ.clear()
    os.environ.update(minimal_environment())
    preloaded, failed = [], {}
    for name in settings["preload"]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
        else:
            preloaded.append(name)
    warm_up(preloaded)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # The first reseed imports and initialises its entropy source (~30 ms); do it once here
        # instead of in every child.
        numpy.random.seed()

    # After preloading, which reads the host's files: the root holding only what runs need.
    if features["private_tmp"][0]:
        plan = plan_root(preloaded, slot_uids)
        visible = [os.path.realpath(path) for path in plan.read_only]
        # Built in this server's own /tmp (a private tmpfs), wherever the interpreter lives.
        staging = tempfile.mkdtemp(prefix="root-", dir="/tmp")
        features["filesystem_root"], in_tmp = enter_root(plan, staging)
        if features["filesystem_root"][0]:
            _prune_sys_path(visible)
            # The root's own /tmp and /dev/shm, which each slot's namespace covers in turn; what
            # of the installation lies under /tmp stays there, read-only.
            features["private_tmp"], keep_under_tmp = enable_private_tmp(
                shared_mb, in_tmp, new_namespace=False, directories=("/tmp", "/dev/shm")
            )
            if not features["private_tmp"][0]:
                raise StartError(
                    f"its root has no writable /tmp ({features['private_tmp'][1]})",
                    "free memory for a tmpfs, or start with isolate=False (--no-isolate)",
                )
    else:
        features["filesystem_root"] = (False, "disabled" if not isolate else "needs private_tmp")
    features["unprivileged_uid"] = features["process_limit"] = (drop_uid, reason)
    if drop_uid:
        exposed: Feature = (True, "")
        if features["private_tmp"][0] and not features["filesystem_root"][0]:
            exposed = expose_python(roots)
        readable = can_read_python_as(slot_uids[0]) if exposed[0] else exposed
        if not readable[0]:
            # Runs that cannot import are useless: keep the server's uid and say why.
            drop_uid = False
            features["unprivileged_uid"] = features["process_limit"] = readable
        elif exposed[1]:
            features["unprivileged_uid"] = (True, exposed[1])
    run_tmp_mb: tuple[int, int] | None = None
    slot_tmps: list[SlotTmp] = []
    if features["private_tmp"][0]:
        workroot = "/tmp"
        try:
            slot_tmps = [SlotTmp(*quotas, keep_under_tmp) for _ in slot_uids]
        except OSError as exc:
            for slot_tmp in slot_tmps:
                slot_tmp.close()
            slot_tmps = []
            features["run_tmp"] = (False, str(exc))
        else:
            run_tmp_mb = quotas
            features["run_tmp"] = (
                True,
                f"/tmp {quotas[0]} MiB (working directory included), /dev/shm {quotas[1]} MiB",
            )
    else:
        features["run_tmp"] = (False, "disabled" if not isolate else "needs private_tmp")
        try:
            workroot = tempfile.mkdtemp(prefix="rstar2-sandbox-")
        except OSError as exc:
            raise StartError(
                f"no place for the runs' working directories: {exc}",
                "make /tmp writable for this user",
            ) from exc
        os.chmod(workroot, 0o711)
    fence: KernelFence | None = None
    if isolate:
        features["kernel_fence"], fence = prepare_fence()
    else:
        features["kernel_fence"] = (False, "disabled")
    if drop_uid:
        # Leftovers of an earlier fork-server that held these uids and died.
        for uid in slot_uids:
            kill_uid(uid)

    if fence is not None:
        # Last of this server's set-up: what it may still do (new slot namespaces, kill helpers)
        # needs only the capabilities it holds, which the bounding set does not take away.
        fence.drop_bounding_set()
    # Objects that exist now are never collected: children then do not touch (copy) their pages.
    gc.collect()
    gc.freeze()

    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    limits = ServerLimits(
        mapped_bytes=mapped_bytes,
        max_processes=settings["max_processes"],
        max_open_files=settings["max_open_files"],
        max_file_bytes=settings["max_file_bytes"],
        fence=fence,
    )
    # Last, before the first request can arrive: runs fork from a copy that never holds one.
    template = Template.start(limits)
    server = ForkServer(
        ctl_in, ctl_out, config, workroot, drop_uid, run_tmp_mb, slot_tmps, template
    )
    hello = {
        "pid": host_pid,
        "template_pid": template.pid,
        "preloaded": preloaded,
        "failed_preloads": failed,
        "isolation": {name: _feature(value) for name, value in features.items()},
    }
    return server, hello


if __name__ == "__main__":
    try:
        main()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
