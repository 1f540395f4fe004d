"""rstar2-sandbox.

Isolated, high-throughput execution service for untrusted Python (fork-servers, HTTP API, Redis
cluster).

Names are loaded on first use: the fork-server imports this package, and everything it imports
makes each of its forks slower, so ``import rstar2_sandbox`` alone pulls in nothing heavy.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2_sandbox.app import create_app as create_app
    from rstar2_sandbox.client import SandboxClient as SandboxClient
    from rstar2_sandbox.client import SandboxClientError as SandboxClientError
    from rstar2_sandbox.client import SandboxUnavailableError as SandboxUnavailableError
    from rstar2_sandbox.client import SyncSandboxClient as SyncSandboxClient
    from rstar2_sandbox.cluster import ClusterSettings as ClusterSettings
    from rstar2_sandbox.cluster import ClusterWorker as ClusterWorker
    from rstar2_sandbox.cluster import RedisDispatcher as RedisDispatcher
    from rstar2_sandbox.dispatch import Dispatcher as Dispatcher
    from rstar2_sandbox.dispatch import DispatcherStats as DispatcherStats
    from rstar2_sandbox.dispatch import LocalDispatcher as LocalDispatcher
    from rstar2_sandbox.dispatch import QueueFullError as QueueFullError
    from rstar2_sandbox.executor.pool import ExecutorPool as ExecutorPool
    from rstar2_sandbox.executor.pool import SandboxStartError as SandboxStartError
    from rstar2_sandbox.executor.settings import ExecutorSettings as ExecutorSettings
    from rstar2_sandbox.isolation import IsolationFeature as IsolationFeature
    from rstar2_sandbox.isolation import IsolationReport as IsolationReport
    from rstar2_sandbox.local import LocalSandbox as LocalSandbox
    from rstar2_sandbox.malloc import fix_mmap_threshold as fix_mmap_threshold
    from rstar2_sandbox.models import BatchRequest as BatchRequest
    from rstar2_sandbox.models import BatchResponse as BatchResponse
    from rstar2_sandbox.models import RunRequest as RunRequest
    from rstar2_sandbox.models import RunResult as RunResult
    from rstar2_sandbox.models import RunStatus as RunStatus
    from rstar2_sandbox.protocol import Sandbox as Sandbox
    from rstar2_sandbox.settings import ServerSettings as ServerSettings

    __version__: str

_EXPORTS = {
    "create_app": "rstar2_sandbox.app",
    "SandboxClient": "rstar2_sandbox.client",
    # Cluster mode: importing these needs the 'cluster' extra (redis); the error says so.
    "ClusterSettings": "rstar2_sandbox.cluster",
    "ClusterWorker": "rstar2_sandbox.cluster",
    "RedisDispatcher": "rstar2_sandbox.cluster",
    "SandboxClientError": "rstar2_sandbox.client",
    "SandboxUnavailableError": "rstar2_sandbox.client",
    "SyncSandboxClient": "rstar2_sandbox.client",
    "BatchRequest": "rstar2_sandbox.models",
    "BatchResponse": "rstar2_sandbox.models",
    "ServerSettings": "rstar2_sandbox.settings",
    "Dispatcher": "rstar2_sandbox.dispatch",
    "DispatcherStats": "rstar2_sandbox.dispatch",
    "LocalDispatcher": "rstar2_sandbox.dispatch",
    "QueueFullError": "rstar2_sandbox.dispatch",
    "ExecutorPool": "rstar2_sandbox.executor.pool",
    "SandboxStartError": "rstar2_sandbox.executor.pool",
    "ExecutorSettings": "rstar2_sandbox.executor.settings",
    "IsolationFeature": "rstar2_sandbox.isolation",
    "IsolationReport": "rstar2_sandbox.isolation",
    "LocalSandbox": "rstar2_sandbox.local",
    "fix_mmap_threshold": "rstar2_sandbox.malloc",
    "RunRequest": "rstar2_sandbox.models",
    "RunResult": "rstar2_sandbox.models",
    "RunStatus": "rstar2_sandbox.models",
    "Sandbox": "rstar2_sandbox.protocol",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("rstar2-sandbox")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_sandbox' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
