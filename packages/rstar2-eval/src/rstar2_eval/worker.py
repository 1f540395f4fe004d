"""The grading worker process: runs math-verify on one item at a time under a wall-clock alarm.

Each worker is a separate process, so math-verify's ``signal``-based machinery runs in a main
thread, and a hung item can be killed with its process without touching the rest of the batch.
"""

from __future__ import annotations

import logging
import resource
import signal
from multiprocessing.connection import Connection
from types import FrameType
from typing import Literal

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


def verify_item(answer: str, gold: str, timeout_s: float) -> tuple[VerifyStatus, str | None]:
    """Grade one item with math-verify under an alarm; never raises for a bad item."""
    from rstar2_eval.verification import GoldParseError, math_verify_equal

    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        try:
            equal = math_verify_equal(answer, gold)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ItemTimeout:
        return "timeout", f"math-verify ran past {timeout_s:g} s"
    except GoldParseError as error:
        return "ungradable", str(error)
    except MemoryError:
        return "ungradable", "math-verify ran out of memory"
    except Exception as error:
        # Only the type: formatting a huge sympy object can itself hang.
        return "ungradable", f"math-verify failed with {type(error).__name__}"
    return ("correct" if equal else "incorrect"), None


def serve(connection: Connection, timeout_s: float, memory_limit_mb: int | None) -> None:
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
    verify_item("1/2", "\\frac{1}{2}", max(timeout_s, 30.0))
    connection.send(READY)
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        key, answer, gold = request
        connection.send((key, *verify_item(answer, gold, timeout_s)))
