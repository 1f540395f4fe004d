"""A reduced RL step through the cluster (the benchmark suite runs 45,000 calls): rStar2-Agent's
template, mixed trivial / numpy / sympy / failing code, one worker killed halfway; every call is
answered exactly once with its own output and the front end's memory stays bounded."""

from __future__ import annotations

import signal

import pytest
from redis.asyncio import Redis

from rstar2_sandbox.bench import memory_mib
from rstar2_sandbox.step import StepReport, run_step, step_calls

from .conftest import free_port
from .helpers import Processes, completions, wait_for_workers

pytestmark = [pytest.mark.asyncio, pytest.mark.cluster, pytest.mark.slow]

CALLS = 1200


async def test_a_step_with_a_worker_killed_halfway_is_answered_exactly_once(
    processes: Processes, redis: Redis
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    front = processes.front_end(port)
    doomed = processes.worker("doomed", preload="numpy,sympy")
    processes.worker("survivor", preload="numpy,sympy")
    await wait_for_workers(url, 2, timeout_s=180)
    idle = memory_mib(front.pid, "VmRSS")

    calls = step_calls(CALLS, seed=1)
    assert {call.kind for call in calls} == {"trivial", "numpy", "sympy", "failing"}
    report: StepReport = await run_step(
        url, calls, batch=32, concurrency=8, halfway=lambda: doomed.send_signal(signal.SIGKILL)
    )

    assert doomed.wait(timeout=30) == -signal.SIGKILL
    assert report.answered_once == CALLS, report
    assert report.missing == report.duplicated == report.wrong == 0
    # Each call the front end accepted was completed once in the cluster; the killed worker's
    # calls by the survivor, on their second delivery.
    done = await completions(redis, processes.prefix)
    if report.resent_batches == 0:
        assert len(done) == CALLS + report.requeued
    assert any(marker["deliveries"] == 2 for marker in done.values()), "nothing was reclaimed"
    # Calls in flight are bounded by the client (256 here), not by the step: the front end
    # holds none of the step's results once they are sent.
    assert memory_mib(front.pid, "VmHWM") - idle < 120
