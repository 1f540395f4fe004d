"""rstar2-data.

Dataset recipes, converters, filters and decontamination for agentic math RL.
"""

from importlib.metadata import version

__version__ = version("rstar2-data")

__all__ = ["__version__"]
