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
import os
import resource
import signal
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
class ChildPlan:
    """Everything the child needs, prepared by the fork-server before forking."""

    code: str
    split: Split | None  # the code split at a cached prefix, when it starts with one
    display_last_expr: bool
    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    status_fd: int
    workdir: str
    server_pid: int  # the fork-server, as the child sees it (1 in its own PID namespace)
    uid: int | None  # None: keep the server's uid (not root)
    # The slot's mount namespace (its own /tmp and /dev/shm, see ``slot_tmp``); None: the run
    # shares the fork-server's view and keeps its files in ``workdir`` only.
    mount_ns_fd: int | None
    mapped_bytes: int  # what the fork-server maps: the child starts with all of it
    address_space_bytes: int
    cpu_seconds: int
    max_processes: int
    max_open_files: int
    max_file_bytes: int
    # No capabilities, no_new_privs and the seccomp filter (``seccomp``); None: not available.
    fence: KernelFence | None


class _TrackingWriter(io.TextIOWrapper):
    """stdout that remembers whether anything was printed (for ``display_last_expr``)."""

    wrote = False

    def write(self, s: str) -> int:
        self.wrote = True
        return super().write(s)


def child_main(plan: ChildPlan) -> NoReturn:
    """Entry point of the forked child; never returns."""
    try:
        _confine(plan)
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


def _confine(plan: ChildPlan) -> None:
    if plan.mount_ns_fd is not None:
        # First, before any descriptor is moved: the handle is one of the fork-server's.
        setns(plan.mount_ns_fd, CLONE_NEWNS)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Own session and process group: a timeout kills the whole group at once.
    os.setsid()
    for target, fd in ((0, plan.stdin_fd), (1, plan.stdout_fd), (2, plan.stderr_fd)):
        os.dup2(fd, target)
    os.dup2(plan.status_fd, STATUS_FD)
    # Nothing of the fork-server (control pipe, other runs' pipes) stays reachable.
    os.closerange(STATUS_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

    os.mkdir(plan.workdir, 0o700)
    if plan.uid is not None:
        os.chown(plan.workdir, plan.uid, plan.uid)
    os.chdir(plan.workdir)
    # On disk, as for ``python main.py``: open(__file__), inspect, runpy and multiprocessing's
    # spawn and forkserver start methods (which import the main module again) read it.
    _write_main(plan.code, plan.uid)

    # The address-space budget comes on top of what the fork-server already maps (preloads).
    _set_limit(resource.RLIMIT_AS, plan.mapped_bytes + plan.address_space_bytes)
    resource.setrlimit(resource.RLIMIT_CPU, (plan.cpu_seconds, plan.cpu_seconds + 1))
    _set_limit(resource.RLIMIT_FSIZE, plan.max_file_bytes)
    _set_limit(resource.RLIMIT_NOFILE, plan.max_open_files)
    _set_limit(resource.RLIMIT_CORE, 0)
    if plan.uid is not None:
        # Counted per uid, so it only bounds this run when the run has its own uid.
        _set_limit(resource.RLIMIT_NPROC, plan.max_processes)
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
        # The run's own processes see each other in /proc (hidepid shows a run nothing else).
        set_dumpable()
    # After the uid change, which clears it: die with the fork-server.
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != plan.server_pid:
        raise RuntimeError("fork-server exited during setup")
    if plan.fence is not None:
        # Last of the calls the filter refuses (setns above), before anything of the run's.
        plan.fence.apply()

    # The fork-server's environment is already minimal (nothing of the service's).
    os.environ["HOME"] = plan.workdir
    os.environ["TMPDIR"] = "/tmp" if plan.mount_ns_fd is not None else plan.workdir
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


def _execute(plan: ChildPlan) -> int:
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
