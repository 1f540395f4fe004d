"""rstar2-eval.

Evaluator for math reasoning checkpoints: grading, metrics, benchmark registry, tool-loop
evaluation.
"""

from importlib.metadata import version

__version__ = version("rstar2-eval")

__all__ = ["__version__"]
