"""A verifier that hangs where no signal can interrupt it, standing in for a stuck C call."""

from __future__ import annotations

import signal
import time


def verify_or_hang(answer: str, gold: str) -> bool:
    """Equal strings compare normally; the answer "hang" blocks SIGALRM and sleeps."""
    if answer == "hang":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)
    return answer == gold
