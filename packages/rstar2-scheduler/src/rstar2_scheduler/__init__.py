"""rstar2-scheduler.

Agent protocol, multi-turn tool rollouts, inference engines and KV-cache-aware load balancing.
"""

from importlib.metadata import version

__version__ = version("rstar2-scheduler")

__all__ = ["__version__"]
