"""The run directory of one stage: what is written where, and whether a run may start or resume.

```
<output_dir>/
  config.yaml            the resolved config (every default spelled out)
  metrics.jsonl          one line per step
  checkpoints/step-N/    Hugging Face model + tokenizer, optimizer.pt, rng.pt, trainer_state.json
  final/                 the stage's last weights, the next stage's model.path
  plots/*.png            metrics over steps
  samples/step-N.md      RL: a few rollouts per step as readable conversations
  validation/step-N/     RL: rstar2-eval outputs of periodic validation
  tensorboard/           TensorBoard events (logging.tensorboard)
  wandb/                 the W&B run's id and, offline, the run itself (logging.wandb)
  data/<recipe>/         recipes built for this run
```
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rstar2_data.jsonl import atomic_write_text
from rstar2_train.config.loader import dump_config
from rstar2_train.config.schema import StageConfig


class RunError(RuntimeError):
    """The run directory does not allow what was asked (start over a run, resume nothing)."""


class RunDir:
    """Paths of one stage's run directory."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.config = self.root / "config.yaml"
        self.metrics = self.root / "metrics.jsonl"
        self.checkpoints = self.root / "checkpoints"
        self.final = self.root / "final"
        self.plots = self.root / "plots"
        self.samples = self.root / "samples"
        self.validation = self.root / "validation"
        self.tensorboard = self.root / "tensorboard"
        self.wandb = self.root / "wandb"
        self.data = self.root / "data"

    def has_run(self) -> bool:
        """Whether a stage already wrote checkpoints or its final weights here."""
        return self.final.exists() or any(self.checkpoints.glob("step-*"))

    def prepare(self, config: StageConfig, *, resume: bool, allow_changes: bool = False) -> None:
        """Check that the stage may start (or resume) here, then write its resolved config.

        A new run refuses a directory that holds one. Resuming needs the same resolved config
        as the run being resumed (``allow_changes`` accepts a different one, e.g. more steps).
        """
        text = dump_config(config)
        if resume:
            if not self.config.is_file():
                raise RunError(f"nothing to resume: {self.config} does not exist")
            changed = _differences(yaml.safe_load(self.config.read_text()), yaml.safe_load(text))
            if changed and not allow_changes:
                raise RunError(
                    "the config differs from the run being resumed at "
                    + ", ".join(changed)
                    + f" (see {self.config}); resume with the same config, or allow the change"
                )
        elif self.has_run():
            raise RunError(
                f"{self.root} already holds a run (checkpoints or final weights): resume it, or "
                "choose another output directory"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config, text)


def _differences(old: object, new: object, path: str = "") -> list[str]:
    """Dotted key paths where two parsed configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += _differences(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if old == new else [path or "(top level)"]
