"""A paper-scale RL step through the cluster mode on this machine (``rstar2_sandbox.step``), with
the memory of every process and the cluster's own accounting of the calls."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter

import redis
from processes import LocalCluster, local_cluster, memory_mib, wait_healthy
from rich.console import Console
from rich.progress import Progress

from rstar2_sandbox.step import StepReport, run_step, step_calls


class MemoryWatch:
    """Peak RSS of the front end and the worker processes, and Redis's peak memory, sampled."""

    def __init__(self, cluster: LocalCluster, client: redis.Redis) -> None:
        self.cluster = cluster
        self.client = client
        self.front_start = memory_mib(cluster.front.pid, "VmRSS")
        self.front_peak = self.worker_peak = self.redis_peak = 0.0

    def sample(self) -> None:
        self.front_peak = max(self.front_peak, memory_mib(self.cluster.front.pid, "VmRSS"))
        for worker in self.cluster.workers:
            if worker.poll() is None:
                rss = memory_mib(worker.pid, "VmRSS")
                self.worker_peak = max(self.worker_peak, rss)
        info = self.client.info("memory")
        self.redis_peak = max(self.redis_peak, int(info["used_memory"]) / (1 << 20))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            await asyncio.sleep(0.5)

    def report(self) -> dict[str, float]:
        return {
            "front_end_rss_start_mib": self.front_start,
            "front_end_rss_peak_mib": self.front_peak,
            "worker_rss_peak_mib": self.worker_peak,
            "redis_used_memory_peak_mib": self.redis_peak,
        }


def _accounting(client: redis.Redis, prefix: str) -> dict[str, object]:
    """The cluster's own record: one completion marker per call it accepted (with how many times
    it was handed out), and what is left in the queue."""
    deliveries: Counter[int] = Counter()
    keys = list(client.scan_iter(f"{prefix}:done:*", count=5000))
    for offset in range(0, len(keys), 5000):
        for value in client.mget(keys[offset : offset + 5000]):
            if value:
                deliveries[int(json.loads(value)["deliveries"])] += 1
    pending = client.xpending(f"{prefix}:tasks", "workers")["pending"]
    return {
        "completions": sum(deliveries.values()),
        "completions_by_deliveries": dict(sorted(deliveries.items())),
        "left_in_queue": client.xlen(f"{prefix}:tasks"),
        "left_pending": pending,
    }


async def cluster_step(
    calls: int, workers: int, *, kill_one: bool, pythonpath: str | None, console: Console
) -> dict[str, object]:
    """One step on a fresh local cluster; with ``kill_one``, SIGKILL a worker halfway."""
    with local_cluster(workers, pythonpath) as cluster:
        await wait_healthy(cluster.url, 300, workers=workers)
        client = redis.Redis.from_url(cluster.redis_url)
        watch = MemoryWatch(cluster, client)
        stop = asyncio.Event()
        sampler = asyncio.create_task(watch.run(stop))
        killed: list[int] = []

        def kill() -> None:
            # Its fork-servers and their runs die with it (parent-death signals).
            victim = cluster.workers[0]
            victim.send_signal(signal.SIGKILL)
            killed.append(victim.pid)

        load_before = os.getloadavg()[0]
        with Progress(console=console, transient=True) as progress:
            report: StepReport = await run_step(
                cluster.url,
                step_calls(calls),
                halfway=kill if kill_one else None,
                progress=progress,
            )
        load_after = os.getloadavg()[0]
        stop.set()
        await sampler
        accounting = await asyncio.to_thread(_accounting, client, cluster.prefix)
        client.close()
    return {
        "workers": workers,
        "killed_worker": bool(killed),
        "load": [load_before, load_after],
        "report": report.model_dump(),
        "memory": watch.report(),
        "cluster": accounting,
    }
