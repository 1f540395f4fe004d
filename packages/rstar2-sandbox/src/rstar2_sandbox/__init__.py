"""rstar2-sandbox.

Isolated, high-throughput execution service for untrusted Python (fork-servers, HTTP API, Redis
cluster).
"""

from importlib.metadata import version

__version__ = version("rstar2-sandbox")

__all__ = ["__version__"]
