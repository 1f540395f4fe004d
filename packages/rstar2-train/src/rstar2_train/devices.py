"""Where a stage's trainer runs and in what number formats: read by model building
(``modeling``) and by placement (``placement``) alike, so both import it and neither imports
the other."""

from __future__ import annotations

import os

import torch

from rstar2_train.config.schema import PlacementConfig, StageConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def stage_placement(config: StageConfig) -> PlacementConfig | None:
    """The stage's placement: its section, the defaults when only RAY_ADDRESS is set, or None
    (everything in this process)."""
    if config.placement is not None:
        return config.placement
    if config.kind == "rl" and os.environ.get("RAY_ADDRESS"):
        return PlacementConfig()
    return None


def trainer_on_gpu(config: StageConfig) -> bool:
    """Whether the stage trains on GPUs: its Ray trainer ranks have GPUs, or (in this process)
    ``model.device`` resolves to one."""
    placement = stage_placement(config)
    if placement is not None:
        return placement.trainer.gpus > 0
    return resolve_device(config.model.device).type != "cpu"
