"""What runs inside the forked child: confine the process, then execute the user's code.

Runs in a fork of the fork-server, so it must never return into the fork-server's loop: every path
ends in ``os._exit``. Standard library only (see ``syscalls``).
"""

from __future__ import annotations

import ast
import atexit
import builtins
import io
import linecache
import marshal
import os
import resource
import signal
import struct
import sys
import threading
import traceback
import types
from dataclasses import dataclass
from typing import NoReturn

from rstar2_sandbox.executor.seccomp import KernelFence
from rstar2_sandbox.executor.syscalls import (
    CLONE_NEWNS,
    set_dumpable,
    set_parent_death_signal,
    setns,
)

FILENAME = "main.py"
STATUS_FD = 3
# Exit code when confinement failed before user code ran (the status pipe says why).
SETUP_FAILED = 125
PLAN_LENGTH = struct.Struct("=Q")

# Every numeric library reads one of these; one thread per run keeps runs from oversubscribing.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)


def minimal_environment() -> dict[str, str]:
    """The fork-server's whole environment, which runs inherit (plus HOME and TMPDIR)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(dict.fromkeys(THREAD_VARS, "1"))
    return env


Split = tuple[types.CodeType, str]
"""Code as its compiled prefix (cached by the fork-server, see ``prefix_cache``) and the source
of the rest, padded with newlines so that its line numbers are those of the whole."""


@dataclass(frozen=True)
class ServerLimits:
    """What every run of a fork-server shares, fixed before its template forks (``template``):
    nothing of any request."""

    mapped_bytes: int  # what the fork-server maps: the child starts with all of it
    max_processes: int
    max_open_files: int
    max_file_bytes: int
    # No capabilities, no_new_privs and the seccomp filter (``seccomp``); None: not available.
    fence: KernelFence | None


@dataclass(frozen=True)
class RunPlan:
    """One run's own part. It reaches only the run's process: the fork-server writes it at the
    head of the run's stdin pipe (``encode``), and the child reads it from there after the fork
    (``read_plan``), so the template the child forks from never holds it."""

    code: str
    split: Split | None  # the code split at a cached prefix, when it starts with one
    display_last_expr: bool
    workdir: str
    uid: int | None  # None: keep the server's uid (not root)
    address_space_bytes: int
    cpu_seconds: int

    def encode(self) -> bytes:
        """The plan as the child reads it: its length, then its fields (``marshal``, which
        carries the compiled prefix as it is)."""
        data = marshal.dumps(
            (
                self.code,
                self.split,
                self.display_last_expr,
                self.workdir,
                self.uid,
                self.address_space_bytes,
                self.cpu_seconds,
            )
        )
        return PLAN_LENGTH.pack(len(data)) + data


@dataclass(frozen=True)
class RunDescriptors:
    """The descriptors of one run's process, as its template received them."""

    stdin: int  # the plan, then the run's stdin
    stdout: int
    stderr: int
    status: int  # setup errors, for the fork-server
    # The slot's mount namespace (its own /tmp and /dev/shm, see ``slot_tmp``); None: the run
    # shares the fork-server's view and keeps its files in ``workdir`` only.
    mount_ns: int | None

    @classmethod
    def of(cls, fds: list[int]) -> RunDescriptors:
        """From the list ``as_list`` made."""
        stdin, stdout, stderr, status, *namespace = fds
        return cls(stdin, stdout, stderr, status, namespace[0] if namespace else None)

    def as_list(self) -> list[int]:
        """In the order ``of`` reads them."""
        fds = [self.stdin, self.stdout, self.stderr, self.status]
        return fds if self.mount_ns is None else [*fds, self.mount_ns]


def _read_exactly(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            raise EOFError("the run's plan ended early")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def read_plan(fd: int) -> RunPlan:
    """The plan at the head of the run's stdin pipe; what follows it is the run's stdin."""
    (length,) = PLAN_LENGTH.unpack(_read_exactly(fd, PLAN_LENGTH.size))
    code, split, display_last_expr, workdir, uid, address_space, cpu = marshal.loads(
        _read_exactly(fd, length)
    )
    return RunPlan(code, split, display_last_expr, workdir, uid, address_space, cpu)


class _TrackingWriter(io.TextIOWrapper):
    """stdout that remembers whether anything was printed (for ``display_last_expr``)."""

    wrote = False

    def write(self, s: str) -> int:
        self.wrote = True
        return super().write(s)


def child_main(limits: ServerLimits, parent_pid: int, fds: RunDescriptors) -> NoReturn:
    """Entry point of the forked child (``parent_pid``: the fork-server, its parent); never
    returns."""
    try:
        plan = _confine(limits, parent_pid, fds)
    except BaseException as exc:
        try:
            os.write(STATUS_FD, f"{type(exc).__name__}: {exc}".encode()[:4096])
        finally:
            os._exit(SETUP_FAILED)
    os.close(STATUS_FD)
    exit_code = 1
    try:
        exit_code = _execute(plan)
    finally:
        os._exit(exit_code)


def _set_limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _confine(limits: ServerLimits, parent_pid: int, fds: RunDescriptors) -> RunPlan:
    # Setup errors go to the status pipe from the start: fd 3 is the template's until then.
    os.dup2(fds.status, STATUS_FD)
    if fds.mount_ns is not None:
        # Before any descriptor is moved: the handle is one the template received.
        setns(fds.mount_ns, CLONE_NEWNS)
    plan = read_plan(fds.stdin)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Own session and process group: a timeout kills the whole group at once.
    os.setsid()
    for target, fd in ((0, fds.stdin), (1, fds.stdout), (2, fds.stderr)):
        os.dup2(fd, target)
    # Nothing of the template (its channel, its loop) stays reachable.
    os.closerange(STATUS_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

    os.mkdir(plan.workdir, 0o700)
    if plan.uid is not None:
        os.chown(plan.workdir, plan.uid, plan.uid)
    os.chdir(plan.workdir)
    # On disk, as for ``python main.py``: open(__file__), inspect, runpy and multiprocessing's
    # spawn and forkserver start methods (which import the main module again) read it.
    _write_main(plan.code, plan.uid)

    # The address-space budget comes on top of what the fork-server already maps (preloads).
    _set_limit(resource.RLIMIT_AS, limits.mapped_bytes + plan.address_space_bytes)
    resource.setrlimit(resource.RLIMIT_CPU, (plan.cpu_seconds, plan.cpu_seconds + 1))
    _set_limit(resource.RLIMIT_FSIZE, limits.max_file_bytes)
    _set_limit(resource.RLIMIT_NOFILE, limits.max_open_files)
    _set_limit(resource.RLIMIT_CORE, 0)
    if plan.uid is not None:
        # Counted per uid, so it only bounds this run when the run has its own uid.
        _set_limit(resource.RLIMIT_NPROC, limits.max_processes)
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
        # The run's own processes see each other in /proc (hidepid shows a run nothing else).
        set_dumpable()
    # After the uid change, which clears it: die with the fork-server.
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        raise RuntimeError("fork-server exited during setup")
    if limits.fence is not None:
        # Last of the calls the filter refuses (setns above), before anything of the run's.
        limits.fence.apply()

    # The fork-server's environment is already minimal (nothing of the service's).
    os.environ["HOME"] = plan.workdir
    os.environ["TMPDIR"] = "/tmp" if fds.mount_ns is not None else plan.workdir
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"
    )
    sys.stdout = _TrackingWriter(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.argv = [FILENAME]
    sys.path.insert(0, plan.workdir)
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        # Where spawned workers look for main.py (set when a preload imported multiprocessing).
        mp_process.ORIGINAL_DIR = plan.workdir  # type: ignore[attr-defined]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Forked children share the parent's generator state; ``random`` reseeds itself at fork.
        numpy.random.seed()
    # Tracebacks quote the source from here (writing a file would cost more than the run). The
    # lines are those linecache reads from a file: universal newlines, and a final newline even
    # when the source lacks one (without it, carets under the last line shift by a column).
    lines = io.StringIO(plan.code, newline=None).readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[FILENAME] = (len(plan.code), None, lines, FILENAME)
    # Exit handlers are the run's own (as at interpreter exit): the fork-server's are not run,
    # except multiprocessing's, which a preload may have imported and which stops worker pools.
    atexit._clear()
    multiprocessing_util = sys.modules.get("multiprocessing.util")
    if multiprocessing_util is not None:
        atexit.register(multiprocessing_util._exit_function)
    return plan


def _write_main(code: str, uid: int | None) -> None:
    """``main.py`` in the working directory (the current one), owned by the run's uid."""
    fd = os.open(FILENAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        if uid is not None:
            os.fchown(fd, uid, uid)
        data = memoryview(code.encode("utf-8", "surrogatepass"))
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _exit_code(exc: SystemExit) -> int:
    """The process exit code Python gives a ``SystemExit``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback a fresh interpreter would print, without the sandbox's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    if tb is None and isinstance(exc, SyntaxError):
        # main.py did not compile: the interpreter's own printer, whose carets under a syntax
        # error differ from the traceback module's. Some errors (the compiler's, not the
        # parser's) leave the line for the printer to read from the file: give it ours.
        if exc.text is None and exc.filename == FILENAME and exc.lineno:
            exc.text = linecache.getline(FILENAME, exc.lineno) or None
        sys.__excepthook__(type(exc), exc.with_traceback(None), None)
        return
    traceback.print_exception(type(exc), exc, tb)


def compiled_parts(code: str, split: Split | None) -> list[types.CodeType]:
    """The code objects to run in turn: the cached prefix and the rest, or the whole code.

    The rest must stand alone: it compiles by itself (else the whole code decides, say an
    ``else:`` that continues the prefix), it is no docstring and holds no ``__future__`` import
    or ``global`` statement (each means something else in a module of its own).
    """
    if split is not None:
        prefix, rest = split
        if "__future__" not in rest and "global" not in rest:
            try:
                compiled = compile(rest, FILENAME, "exec")
            except (SyntaxError, ValueError):
                pass
            else:
                if "__doc__" not in compiled.co_names:
                    return [prefix, compiled]
    return [compile(code, FILENAME, "exec")]


def _execute(plan: RunPlan) -> int:
    code = plan.code
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    main.__dict__["__file__"] = FILENAME
    sys.modules["__main__"] = main
    exit_code = 0
    try:
        if plan.display_last_expr:
            tree = ast.parse(code, FILENAME)
            last = tree.body[-1] if tree.body else None
            trailing = last if isinstance(last, ast.Expr) else None
            if trailing is not None:
                tree.body.pop()
            exec(compile(tree, FILENAME, "exec"), main.__dict__)
            if trailing is not None:
                expression = ast.Expression(trailing.value)
                value = eval(compile(expression, FILENAME, "eval"), main.__dict__)
                stdout = sys.stdout
                if value is not None and not (isinstance(stdout, _TrackingWriter) and stdout.wrote):
                    print(repr(value))
        else:
            # Compiled before anything runs: a syntax error anywhere runs nothing, as in Python.
            for part in compiled_parts(code, plan.split):
                exec(part, main.__dict__)
    except SystemExit as exc:
        exit_code = _exit_code(exc)
    except BaseException as exc:
        _print_user_traceback(exc)
        exit_code = 1
    # Interpreter shutdown, in its order: wait for the run's non-daemon threads, then run the exit
    # handlers (multiprocessing's stop its worker pools; errors are printed, as there).
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            # The reader is gone (output cap reached) or the run closed the stream itself.
            exit_code = exit_code or 1
    return exit_code
