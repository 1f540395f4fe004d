"""rstar2-train.

Trainer for agentic RL of math reasoning models: stage configs, SFT and GRPO-RoC trainers,
checkpoints and resume, metrics and plots.

Names are loaded on first use: the trainers pull in torch, transformers and the other rstar2
packages' engines, which the command line's help never needs.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2_train.actor import Actor as Actor
    from rstar2_train.actor import UpdateStats as UpdateStats
    from rstar2_train.batching import MicroBatch as MicroBatch
    from rstar2_train.batching import TokenSequence as TokenSequence
    from rstar2_train.batching import micro_batches as micro_batches
    from rstar2_train.batching import token_logprobs as token_logprobs
    from rstar2_train.checkpoint import TrainerState as TrainerState
    from rstar2_train.checkpoint import list_checkpoints as list_checkpoints
    from rstar2_train.checkpoint import save_checkpoint as save_checkpoint
    from rstar2_train.config import ConfigError as ConfigError
    from rstar2_train.config import StageConfig as StageConfig
    from rstar2_train.config import dump_config as dump_config
    from rstar2_train.config import load_config as load_config
    from rstar2_train.config import shipped_configs as shipped_configs
    from rstar2_train.data import DataOrder as DataOrder
    from rstar2_train.data import load_rows as load_rows
    from rstar2_train.metrics import MetricsLog as MetricsLog
    from rstar2_train.metrics import read_metrics as read_metrics
    from rstar2_train.precision import MasterWeights as MasterWeights
    from rstar2_train.precision import Precision as Precision
    from rstar2_train.progress import LogReporter as LogReporter
    from rstar2_train.progress import Reporter as Reporter
    from rstar2_train.progress import RichReporter as RichReporter
    from rstar2_train.run_dir import RunDir as RunDir
    from rstar2_train.run_dir import RunError as RunError
    from rstar2_train.runner import run_stage as run_stage

    __version__: str

_EXPORTS = {
    "Actor": "rstar2_train.actor",
    "UpdateStats": "rstar2_train.actor",
    "MicroBatch": "rstar2_train.batching",
    "TokenSequence": "rstar2_train.batching",
    "micro_batches": "rstar2_train.batching",
    "token_logprobs": "rstar2_train.batching",
    "TrainerState": "rstar2_train.checkpoint",
    "list_checkpoints": "rstar2_train.checkpoint",
    "save_checkpoint": "rstar2_train.checkpoint",
    "ConfigError": "rstar2_train.config",
    "StageConfig": "rstar2_train.config",
    "dump_config": "rstar2_train.config",
    "load_config": "rstar2_train.config",
    "shipped_configs": "rstar2_train.config",
    "DataOrder": "rstar2_train.data",
    "load_rows": "rstar2_train.data",
    "MetricsLog": "rstar2_train.metrics",
    "MasterWeights": "rstar2_train.precision",
    "Precision": "rstar2_train.precision",
    "read_metrics": "rstar2_train.metrics",
    "LogReporter": "rstar2_train.progress",
    "Reporter": "rstar2_train.progress",
    "RichReporter": "rstar2_train.progress",
    "RunDir": "rstar2_train.run_dir",
    "RunError": "rstar2_train.run_dir",
    "run_stage": "rstar2_train.runner",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("rstar2-train")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_train' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
