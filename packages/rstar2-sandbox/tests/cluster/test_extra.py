"""Cluster names are exported lazily; without the 'cluster' extra they fail with a clear error."""

from __future__ import annotations

import subprocess
import sys

import rstar2_sandbox
from rstar2_sandbox.cluster import ClusterWorker, RedisDispatcher


def test_cluster_names_are_package_exports() -> None:
    assert {"ClusterSettings", "ClusterWorker", "RedisDispatcher"} <= set(rstar2_sandbox.__all__)
    assert rstar2_sandbox.RedisDispatcher is RedisDispatcher
    assert rstar2_sandbox.ClusterWorker is ClusterWorker


def test_without_redis_the_error_names_the_extra() -> None:
    # sys.modules["redis"] = None makes "import redis" fail as if it were not installed.
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import rstar2_sandbox\n"
        "assert rstar2_sandbox.__version__\n"  # the core package still imports
        "try:\n"
        "    rstar2_sandbox.RedisDispatcher\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'rstar2-sandbox[cluster]'" in out
