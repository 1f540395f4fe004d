"""The grading worker process: runs math-verify on one item at a time under a wall-clock alarm.

Each worker is a separate Python interpreter started as ``python -c BOOT FD`` (see ``pool``): it
never imports the caller's ``__main__``, so grading works from unguarded scripts, ``python -``,
notebooks and other libraries' worker processes alike. It talks to the pool over a socket whose
descriptor it inherits; its stdout and stderr go to a log file the pool reads when it dies.
"""

from __future__ import annotations

import importlib
import logging
import resource
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Literal, NamedTuple

from rstar2_eval.verification import GoldParseError

Verifier = Callable[[str, str], bool]
"""``(answer, gold) -> equal``: a module-level function importable by name (workers import it
with its module) and callable on every ``WARM_UP_ITEMS`` pair without raising."""

WARM_UP_ITEMS = (("1/2", "\\frac{1}{2}"), ("12ab34", "1234"))
"""What a worker verifies before it takes work. The second pair, letters inside an integer
against an integer (a common garbled answer), takes math-verify's symbolic path: the letters
parse as a product of symbols and ``sympy.simplify`` runs, whose first call in a process imports
sympy modules (``sympy.physics.units``, ``sympy.combinatorics``). Without it the first such
answer a fresh worker grades pays that: about 0.5 s on a loaded 2-core machine."""

VerifyStatus = Literal["correct", "incorrect", "timeout", "ungradable"]
"""What a worker reports for one item."""

READY = "ready"
"""First message of a worker: imports done, caches warm."""

BOOT = """\
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
from multiprocessing.connection import Connection
connection = Connection(int(sys.argv[1]))
sys.path[:] = connection.recv()
from rstar2_eval.worker import main
main(connection)
"""
"""The worker's whole ``__main__``: ignore Ctrl-C (the pool owns its workers), take the caller's
``sys.path`` (so the same rstar2_eval and verifier modules are found), then serve."""


class WorkerSetup(NamedTuple):
    """The second message to a worker (after ``sys.path``): what to run and under which limits."""

    verifier_module: str
    verifier_name: str
    timeout_s: float
    memory_limit_mb: int | None


class ItemTimeout(BaseException):
    """Raised by the alarm. A BaseException, so library ``except Exception`` cannot absorb it."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise ItemTimeout


def _limit_memory(extra_mb: int) -> None:
    """Cap the address space at what is mapped now plus ``extra_mb``."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    limit = mapped + extra_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def verifier_reference(verifier: Verifier) -> tuple[str, str]:
    """``(module, qualified name)`` by which a worker imports ``verifier``.

    Raises ValueError for functions no other interpreter can import: those defined in the
    caller's ``__main__`` (workers never run it), lambdas and nested functions.
    """
    module = getattr(verifier, "__module__", None)
    name = getattr(verifier, "__qualname__", None)
    if not module or not name or "<" in name:
        raise ValueError(f"the verifier {verifier!r} must be a module-level function")
    if module == "__main__":
        raise ValueError(
            f"the verifier {name} is defined in the main script, which grading workers never "
            "import; move it into an importable module"
        )
    return module, name


def resolve_verifier(module: str, name: str) -> Verifier:
    """Import the verifier a ``WorkerSetup`` names."""
    target: object = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{module}.{name} is not callable")
    return target


def verify_item(
    verifier: Verifier, answer: str, gold: str, timeout_s: float
) -> tuple[VerifyStatus, str | None]:
    """Run ``verifier`` on one item under an alarm; never raises for a bad item."""
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        try:
            equal = verifier(answer, gold)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ItemTimeout:
        return "timeout", f"verification ran past {timeout_s:g} s"
    except GoldParseError as error:
        return "ungradable", str(error)
    except MemoryError:
        return "ungradable", "verification ran out of memory"
    except Exception as error:
        # Only the type: formatting a huge sympy object can itself hang.
        return "ungradable", f"verification failed with {type(error).__name__}"
    return ("correct" if equal else "incorrect"), None


def serve(
    connection: Connection, verifier: Verifier, timeout_s: float, memory_limit_mb: int | None
) -> None:
    """Worker main loop: warm up, say READY, then answer ``(key, answer, gold)`` requests.

    A ``None`` request (or a closed connection) ends the loop.
    """
    signal.signal(signal.SIGALRM, _on_alarm)
    # math-verify warns once that its own timeouts are off; the alarm replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if memory_limit_mb is not None:
        _limit_memory(memory_limit_mb)
    # Warm up (imports, parser caches) with no alarm: an alarm landing inside an import would
    # leave modules half-initialized; the pool's start timeout bounds this instead. An error
    # here (a broken install) ends the worker before READY with its traceback in the log.
    for answer, gold in WARM_UP_ITEMS:
        verifier(answer, gold)
    connection.send(READY)
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        key, answer, gold = request
        connection.send((key, *verify_item(verifier, answer, gold, timeout_s)))


def main(connection: Connection) -> None:
    """Entry point run by ``BOOT``: read the setup, import the verifier, serve."""
    setup = WorkerSetup(*connection.recv())
    verifier = resolve_verifier(setup.verifier_module, setup.verifier_name)
    serve(connection, verifier, setup.timeout_s, setup.memory_limit_mb)
