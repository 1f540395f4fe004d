"""Running one stage from its config: the entry point of the CLI and of Python callers."""

from __future__ import annotations

from pathlib import Path

from rstar2_train.config.schema import StageConfig
from rstar2_train.progress import Reporter
from rstar2_train.rl.trainer import train_rl
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
