"""Cluster mode: front ends and workers sharing a queue in Redis.

Needs the optional extra ``rstar2-sandbox[cluster]``.
"""

from __future__ import annotations

try:
    import redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "rstar2-sandbox cluster mode needs the 'redis' package: "
        "pip install 'rstar2-sandbox[cluster]'"
    ) from exc

from rstar2_sandbox.cluster.dispatcher import RedisDispatcher
from rstar2_sandbox.cluster.messages import Delivery, ResultMessage, TaskMessage, WorkerInfo
from rstar2_sandbox.cluster.queue import ClusterQueue, Completion, QueueStats, connect
from rstar2_sandbox.cluster.settings import ClusterSettings
from rstar2_sandbox.cluster.worker import ClusterWorker, WorkerCounters

__all__ = [
    "ClusterQueue",
    "ClusterSettings",
    "ClusterWorker",
    "Completion",
    "Delivery",
    "QueueStats",
    "RedisDispatcher",
    "ResultMessage",
    "TaskMessage",
    "WorkerCounters",
    "WorkerInfo",
    "connect",
]
