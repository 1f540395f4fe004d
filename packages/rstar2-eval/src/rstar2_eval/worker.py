"""The grading worker process: runs math-verify on one item at a time under a wall-clock alarm.

Each worker is a separate process, so math-verify's ``signal``-based machinery runs in a main
thread, and a hung item can be killed with its process without touching the rest of the batch.
"""

from __future__ import annotations

import logging
import resource
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Literal

from rstar2_eval.verification import GoldParseError

Verifier = Callable[[str, str], bool]
"""``(answer, gold) -> equal``: importable by name (spawned workers receive it by reference) and
callable on the warm-up item ``("1/2", "\\frac{1}{2}")`` without raising."""

VerifyStatus = Literal["correct", "incorrect", "timeout", "ungradable"]
"""What a worker reports for one item."""

READY = "ready"
"""First message of a worker: imports done, caches warm."""


class ItemTimeout(BaseException):
    """Raised by the alarm. A BaseException, so library ``except Exception`` cannot absorb it."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise ItemTimeout


def _limit_memory(extra_mb: int) -> None:
    """Cap the address space at what is mapped now plus ``extra_mb``.

    Relative to the current size, because a worker spawned from a process that imported large
    libraries starts out with a large address space.
    """
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    limit = mapped + extra_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


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

    A ``None`` request (or a closed pipe) ends the loop.
    """
    # Ctrl-C belongs to the parent, which kills its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    # math-verify warns once that its own timeouts are off; the alarm replaces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if memory_limit_mb is not None:
        _limit_memory(memory_limit_mb)
    # Warm up (imports, parser caches) with no alarm: an alarm landing inside an import would
    # leave modules half-initialized; the parent's start timeout bounds this instead. An error
    # here (a broken install) ends the worker before READY, which the parent reports.
    verifier("1/2", "\\frac{1}{2}")
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
