"""A worker node's process: fork-servers plus a cluster worker, stopped cleanly by SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from rstar2_sandbox.cluster.messages import WorkerInfo
from rstar2_sandbox.cluster.queue import ClusterQueue, connect
from rstar2_sandbox.cluster.settings import ClusterSettings
from rstar2_sandbox.cluster.worker import DEFAULT_BATCH_SIZE, ClusterWorker
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.local import LocalSandbox

logger = logging.getLogger(__name__)


async def run_worker_node(
    url: str,
    settings: ClusterSettings,
    executor: ExecutorSettings,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    drain_timeout_s: float = 30.0,
) -> None:
    """Serve calls from the cluster at ``url`` until SIGTERM or SIGINT.

    On the signal the worker takes no more calls, lets running ones finish within
    ``drain_timeout_s`` and hands the rest back to the queue before the fork-servers stop.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    redis = connect(url, max_connections=2 * executor.total_slots + 8)
    sandbox = LocalSandbox(executor)
    try:
        await sandbox.start()
        logger.info("isolation: %s", sandbox.isolation)
        worker = ClusterWorker(
            ClusterQueue(redis, settings),
            sandbox,
            slots=executor.total_slots,
            batch_size=batch_size,
            drain_timeout_s=drain_timeout_s,
            info=WorkerInfo(
                slots=executor.total_slots,
                preloaded=sandbox.pool.preloaded,
                isolation=sandbox.isolation,
            ),
        )
        await worker.run(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await sandbox.aclose()
        await redis.aclose()  # type: ignore[attr-defined]  # stubs predate aclose
