"""Running one stage from its config: the entry point of the CLI and of Python callers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rstar2_train.config.schema import StageConfig
from rstar2_train.progress import Reporter
from rstar2_train.rl.asynchronous import AsyncRLTrainer
from rstar2_train.rl.trainer import RLTrainer
from rstar2_train.sft import train_sft
from rstar2_train.stage import StageRun


def run_stage(
    config: StageConfig,
    *,
    resume: bool = False,
    allow_changes: bool = False,
    reporter: Reporter | None = None,
) -> Path:
    """Train the stage to its end; returns its final checkpoint (``<output_dir>/final``).

    With ``resume``, continue from the newest checkpoint in ``output_dir`` with the same data
    order and random state (from the beginning when there is none yet).
    """
    run = StageRun(config, resume=resume, allow_changes=allow_changes, reporter=reporter)
    failed = True
    try:
        final = train_sft(run) if config.kind == "sft" else train_rl(run)
        failed = False
        return final
    finally:
        run.close(failed=failed)


def train_rl(run: StageRun) -> Path:
    """The stage's loop: synchronous at ``rl.max_staleness`` 0, else bounded-staleness."""
    assert run.config.rl is not None
    trainer = RLTrainer(run) if run.config.rl.max_staleness == 0 else AsyncRLTrainer(run)
    return asyncio.run(trainer.train())
