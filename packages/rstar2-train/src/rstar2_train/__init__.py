"""rstar2-train.

Trainer for agentic RL of math reasoning models: SFT, GRPO-RoC stages, Ray placement,
checkpoints.
"""

from importlib.metadata import version

__version__ = version("rstar2-train")

__all__ = ["__version__"]
