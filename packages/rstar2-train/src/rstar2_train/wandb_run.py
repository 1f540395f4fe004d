"""A stage's Weights & Biases run: its resolved config, every step's metrics, sample rollouts.

wandb is an optional extra, imported only when a config has a ``logging.wandb`` section. The
run's id is kept in the run directory, so ``--resume`` continues the same W&B run; steps that
the killed process had already logged are not logged again (a resumed run redoes them exactly).
In offline mode nothing touches the network: the run is written under ``<output_dir>/wandb``
and ``wandb sync`` uploads it later.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import atomic_write_text
from rstar2_train.config.schema import StageConfig, WandbConfig
from rstar2_train.run_dir import RunError

logger = logging.getLogger(__name__)

ROLLOUTS_KEY = "samples/rollouts"
ID_FILE = "run-id"


class WandbRun:
    """Logs one stage to W&B; ``logged_until``: the last step an earlier process logged."""

    def __init__(
        self,
        settings: WandbConfig,
        stage: StageConfig,
        folder: Path,
        *,
        logged_until: int | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as missing:
            raise ImportError(
                "logging.wandb needs Weights & Biases: pip install 'rstar2-train[wandb]'"
            ) from missing
        self._wandb = wandb
        self.logged_until = logged_until
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:
            run_id = secrets.token_hex(4)
            atomic_write_text(id_file, run_id + "\n")
        try:
            self.run = wandb.init(
                project=settings.project,
                entity=settings.entity,
                name=settings.name or stage.name,
                group=settings.group,
                tags=settings.tags,
                mode=settings.mode,
                dir=folder.parent,  # wandb writes into <dir>/wandb
                id=run_id,
                resume="allow",
                config=stage.model_dump(mode="json"),
                # The terminal keeps the logs; W&B must not wrap stdout under a live display.
                settings=wandb.Settings(console="off"),
            )
        except wandb.Error as error:
            raise RunError(
                f"logging.wandb: could not start a W&B run ({error}); log in with `wandb login`, "
                "or set logging.wandb.mode=offline"
            ) from error
        logger.info("W&B run %s (%s)", run_id, settings.mode or "mode from WANDB_MODE or online")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics (non-finite values left out, as W&B cannot chart them)."""
        if self._logged(step):
            return
        finite = {name: value for name, value in metrics.items() if math.isfinite(value)}
        self.run.log(finite, step=step)

    def log_rollouts(self, step: int, rows: Sequence[dict[str, Any]]) -> None:
        """Sample rollouts of a step as a W&B table (one row per rollout)."""
        if self._logged(step) or not rows:
            return
        names = list(rows[0])
        columns: list[str | int] = [*names]
        table = self._wandb.Table(columns=columns, data=[[row[n] for n in names] for row in rows])
        self.run.log({ROLLOUTS_KEY: table}, step=step)

    def _logged(self, step: int) -> bool:
        return self.logged_until is not None and step <= self.logged_until

    def finish(self, *, failed: bool = False) -> None:
        """Close the run; a stage that stopped on an error is marked as failed in W&B."""
        self.run.finish(exit_code=1 if failed else 0)
