"""Per-step metrics: one JSON line per step, optionally mirrored to TensorBoard and W&B.

A resumed stage first cuts the file back to the checkpoint's step, so steps that are redone are
never logged twice; a line half-written by a kill is dropped with a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import atomic_write_text
from rstar2_train.wandb_run import WandbRun

logger = logging.getLogger(__name__)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics file (a torn last line is skipped with a warning)."""
    if not path.is_file():
        return []
    records: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                logger.warning("%s: dropping a partly written last line", path)
                continue
            raise ValueError(f"{path}, line {number}: not a JSON object") from None
    return records


class MetricsLog:
    """Appends step records to ``metrics.jsonl`` (and TensorBoard and W&B when asked)."""

    def __init__(
        self,
        path: Path,
        *,
        keep_until: int,
        tensorboard: Path | None = None,
        wandb: WandbRun | None = None,
    ) -> None:
        self.path = path
        kept = [record for record in read_metrics(path) if record.get("step", 0) <= keep_until]
        self.wandb = wandb
        atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in kept))
        self.records = kept
        self._writer: Any = None
        if tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as missing:
                raise ImportError(
                    "logging.tensorboard needs TensorBoard: pip install 'rstar2-train[tensorboard]'"
                ) from missing
            self._writer = SummaryWriter(str(tensorboard), purge_step=keep_until + 1)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step; non-finite values are written as null."""
        record: dict[str, Any] = {"step": step}
        for name, value in metrics.items():
            record[name] = value if math.isfinite(value) else None
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.append(record)
        if self._writer is not None:
            for name, value in metrics.items():
                if math.isfinite(value):
                    self._writer.add_scalar(name, value, step)
            self._writer.flush()
        if self.wandb is not None:
            self.wandb.log(step, metrics)

    def close(self, *, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.close()
        if self.wandb is not None:
            self.wandb.finish(failed=failed)
