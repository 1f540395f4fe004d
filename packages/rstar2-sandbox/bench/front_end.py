"""What bad bodies and big batch results cost the front end: its memory, and other callers'
latency meanwhile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
from processes import memory_mib

BODY_BYTES = 250_000_000
SENDERS = 4

# A client that sends its whole body before it reads the answer, as most HTTP clients do, again
# and again until stopped, at up to ``rate`` bytes/s (0: as fast as it can): argv = host, port,
# path, size, "declared" or "chunked", rate. Mode "spin" sends nothing and only burns CPU: the
# control for what four busy local processes cost other callers on their own.
_SENDER = r"""
import socket, sys, time
host, port, path, size, mode, rate = sys.argv[1:]
port, size, rate = int(port), int(size), float(rate)
while mode == "spin":
    pass
chunk = b"x" * (1 << 20)
began, total = time.monotonic(), 0
while True:
    sock = socket.create_connection((host, port))
    framing = f"Content-Length: {size}" if mode == "declared" else "Transfer-Encoding: chunked"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    sock.sendall(head.encode())
    sent = 0
    try:
        while sent < size:
            piece = chunk[: size - sent]
            sock.sendall(piece if mode == "declared" else b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
            total += len(piece)
            if rate:
                time.sleep(max(0.0, began + total / rate - time.monotonic()))
        sock.recv(4096)
    except OSError:
        pass
    sock.close()
"""


async def one_at_a_time(url: str, calls: int) -> list[float]:
    """Latencies (s) of ``calls`` trivial /v1/run calls, one after another."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(calls):
            began = time.perf_counter()
            async with session.post(url + "/v1/run", json={"code": "print(1 + 1)"}) as response:
                assert (await response.json())["stdout"] == "2\n"
            latencies.append(time.perf_counter() - began)
    return latencies


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99)}


# Four clients sharing a 1 Gb/s link: how bodies arrive from other machines.
LINK_BYTES_PER_S = 125_000_000 / SENDERS
BODY_MODES = {
    "declared, local senders at full speed": ("declared", 0.0),
    "chunked, local senders at full speed": ("chunked", 0.0),
    "declared, senders sharing 1 Gb/s": ("declared", LINK_BYTES_PER_S),
    "control: four local processes spinning, no bodies": ("spin", 0.0),
}


async def measure_bodies(url: str, pid: int, calls: int, mode: str) -> dict[str, object]:
    """Other callers' latency, idle and then while ``SENDERS`` clients on this machine keep
    sending ``BODY_BYTES`` bodies to /v1/run as ``BODY_MODES[mode]`` says (or, for the control,
    only spin), and the front end's peak RSS growth meanwhile."""
    framing, rate = BODY_MODES[mode]
    await one_at_a_time(url, 20)  # warm-up
    idle = _percentiles(await one_at_a_time(url, calls))
    host, port = url.removeprefix("http://").split(":")
    before = memory_mib(pid, "VmHWM")
    command = [sys.executable, "-c", _SENDER, host, port, "/v1/run", str(BODY_BYTES)]
    senders = [
        subprocess.Popen([*command, framing, str(rate)])  # noqa: ASYNC220 (nothing to await)
        for _ in range(SENDERS)
    ]
    try:
        await asyncio.sleep(1.0)
        latencies = await one_at_a_time(url, calls)
    finally:
        for sender in senders:
            sender.kill()
            sender.wait()
    return {
        "idle": idle,
        "under the bodies": _percentiles(latencies),
        "peak_rss_growth_mib": memory_mib(pid, "VmHWM") - before,
    }


async def _native_calls_total(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('rstar2_sandbox_calls_total{api="native"')
    )


async def measure_big_results(url: str, pid: int) -> dict[str, float]:
    """The front end's peak RSS growth over a native batch of 8 runs printing 24 MiB each (each
    capped at 32 MiB per stream), read as it comes, and how long the batch took."""
    mib = 1 << 20
    code = f"import sys\nsys.stdout.write('x' * {24 * mib})"
    big = {"code": code, "output_limit_bytes": 32 * mib}
    before = memory_mib(pid, "VmHWM")
    received = 0
    began = time.perf_counter()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
        session.post(url + "/v1/run/batch", json={"requests": [big] * 8}) as response,
    ):
        async for chunk in response.content.iter_chunked(mib):
            received += len(chunk)
    return {
        "received_mib": received / mib,
        "seconds": time.perf_counter() - began,
        "peak_rss_growth_mib": memory_mib(pid, "VmHWM") - before,
    }


async def measure_stalled_client(url: str, pid: int, stall_s: float = 15.0) -> dict[str, float]:
    """A 300-item batch of 1 MiB results whose client reads nothing for ``stall_s``: how many
    of its calls ran meanwhile, and the front end's peak RSS growth."""
    mib = 1 << 20
    one = {"code": f"import sys\nsys.stdout.write('x' * {mib})"}
    before = memory_mib(pid, "VmHWM")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        ran_before = await _native_calls_total(session, url)
        async with session.post(url + "/v1/run/batch", json={"requests": [one] * 300}) as response:
            await asyncio.sleep(stall_s)
            ran_stalled = await _native_calls_total(session, url) - ran_before
            results = len(json.loads(await response.read())["results"])
    return {
        "items": 300,
        "stalled_s": stall_s,
        "ran_while_not_reading": ran_stalled,
        "results": results,
        "peak_rss_growth_mib": memory_mib(pid, "VmHWM") - before,
    }
