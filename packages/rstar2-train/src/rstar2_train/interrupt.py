"""Stopping a stage on SIGINT or SIGTERM without losing its work.

A checkpoint is written every ``checkpoint.every_steps`` steps (hundreds for SFT), so stopping
wherever the signal lands would lose every step since the last one. Instead the signal is noted,
the step that runs finishes, its checkpoint is saved and the stage raises ``StageInterrupted``;
the command line then exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a
process killed by it would. A resumed run continues from that checkpoint exactly as from any
other. A second Ctrl-C stops at once, as Python does by default.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StageInterrupted(BaseException):
    """The stage stopped on a signal after saving the checkpoint of ``step``: a
    BaseException like KeyboardInterrupt, so no handler of errors takes it for a failure."""

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"interrupted at step {step}")
        self.step = step
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process ended by the signal."""
        return 128 + self.signum


class StopSignals:
    """From ``install`` to ``restore``: SIGINT and SIGTERM are noted in ``received`` (the stage
    stops at its next step boundary). Only the main thread can handle signals; elsewhere (a
    stage run from a worker thread) nothing changes."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._note)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        logger.warning(
            "%s: stopping after this step and its checkpoint (Ctrl-C again stops at once, "
            "losing the step)",
            signal.Signals(signum).name,
        )
