"""rstar2-algo.

GRPO-RoC math on torch tensors: group advantages, Resample-on-Correct, clip-higher policy loss,
chunked log-probs.
"""

from importlib.metadata import version

__version__ = version("rstar2-algo")

__all__ = ["__version__"]
