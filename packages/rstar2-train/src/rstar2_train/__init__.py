"""rstar2-train.

Trainer for agentic RL of math reasoning models: stage configs, SFT and GRPO-RoC trainers,
checkpoints and resume, metrics and plots.
"""

from importlib.metadata import version

from rstar2_train.actor import Actor, UpdateStats
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches, token_logprobs
from rstar2_train.checkpoint import TrainerState, list_checkpoints, save_checkpoint
from rstar2_train.config import ConfigError, StageConfig, dump_config, load_config, shipped_configs
from rstar2_train.data import DataOrder, load_rows
from rstar2_train.metrics import MetricsLog, read_metrics
from rstar2_train.progress import LogReporter, Reporter, RichReporter
from rstar2_train.run_dir import RunDir, RunError
from rstar2_train.runner import run_stage

__version__ = version("rstar2-train")

__all__ = [
    "Actor",
    "ConfigError",
    "DataOrder",
    "LogReporter",
    "MetricsLog",
    "MicroBatch",
    "Reporter",
    "RichReporter",
    "RunDir",
    "RunError",
    "StageConfig",
    "TokenSequence",
    "TrainerState",
    "UpdateStats",
    "__version__",
    "dump_config",
    "list_checkpoints",
    "load_config",
    "load_rows",
    "micro_batches",
    "read_metrics",
    "run_stage",
    "save_checkpoint",
    "shipped_configs",
    "token_logprobs",
]
