"""Time to the first optimizer step, as a measured figure: how long a stage takes to start
training, split into model build, the first update (forward, backward and optimizer step) and
compilation (``torch.compile``: FlexAttention's kernels, anything else that compiles).

A user meets a GPU run first as the wait before its first step: a kernel that compiles in its
first forward can take minutes, and nothing else says so. The stage logs the split with the
first step's metrics (``startup/*``) and says so before a compiling path starts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from rstar2_scheduler.compilation import compile_seconds

logger = logging.getLogger(__name__)

_announced: set[str] = set()
_active: FirstStepClock | None = None


def announce_compile(what: str) -> None:
    """Log, once per process, that ``what`` compiles kernels before its first use: the first
    step then takes longer (minutes on a large model)."""
    if what not in _announced:
        _announced.add(what)
        logger.info("compiling attention kernels (%s); the first step takes longer", what)


def note_forward() -> None:
    """A trainer forward pass starts (``token_logprobs``): the first one with gradients opens
    the first update's time."""
    if _active is not None and _active.first_forward is None and torch.is_grad_enabled():
        _active.first_forward = time.perf_counter()


class FirstStepClock:
    """Seconds from a stage's start (the clock's creation) to its first optimizer step in this
    process, with the parts spent building the model, in the first update and compiling.

    The first optimizer step is seen through a global optimizer hook, so any ``Optimizer`` in
    this process ends the clock; where the optimizer runs elsewhere (Ray trainer ranks) the
    first step's end is the time the caller reports it (``metrics``), and the ranks log their
    own split.
    """

    def __init__(self) -> None:
        global _active
        self.started = time.perf_counter()
        self.compiled_before = compile_seconds()
        self.model_build_s = 0.0
        self.first_forward: float | None = None
        self.first_step: float | None = None
        self.compile_s: float | None = None
        self._reported = False
        self._hook: Any = register_optimizer_step_post_hook(self._stepped)
        _active = self

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        del optimizer, args, kwargs
        # The hook stays until ``close`` (torch iterates its hooks while calling this one).
        if self.first_step is None:
            self.first_step = time.perf_counter()
            self.compile_s = compile_seconds() - self.compiled_before

    @contextlib.contextmanager
    def model_build(self) -> Iterator[None]:
        """Time the block as model build (loading or creating it, moving it to its device)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.model_build_s += time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        """The ``startup/*`` figures, once (then ``{}``), logged as they are returned: call it
        when the first step has been taken."""
        if self._reported:
            return {}
        self._reported = True
        self.close()
        now = time.perf_counter()
        first_step = self.first_step if self.first_step is not None else now
        compile_s = self.compile_s
        if compile_s is None:
            compile_s = compile_seconds() - self.compiled_before
        figures = {
            "startup/first_step_s": first_step - self.started,
            "startup/model_build_s": self.model_build_s,
            "startup/compile_s": compile_s,
        }
        if self.first_forward is not None and self.first_step is not None:
            figures["startup/first_update_s"] = self.first_step - self.first_forward
        logger.info(
            "first optimizer step %.1f s after the start: model build %.1f s, first update %s, "
            "compilation %.1f s",
            figures["startup/first_step_s"],
            self.model_build_s,
            f"{figures['startup/first_update_s']:.1f} s"
            if "startup/first_update_s" in figures
            else "not in this process (trainer ranks)",
            compile_s,
        )
        return figures

    def close(self) -> None:
        """Stop watching forward passes and optimizer steps (idempotent)."""
        global _active
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if _active is self:
            _active = None
