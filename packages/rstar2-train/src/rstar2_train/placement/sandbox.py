"""The rstar2-sandbox service as Ray-placed processes: one single-node ``serve``, or a cluster
``serve --redis`` front end with ``worker`` processes (on whichever nodes Ray places them)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
import urllib.request

from rstar2_train.placement.ranks import free_port


def _die_with_parent() -> None:
    """The service ends with its actor however the actor ends (``ray.kill`` included)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class SandboxProcess:
    """The body of a Ray actor that runs one ``rstar2-sandbox`` command and ends it with itself."""

    def __init__(self, arguments: list[str]) -> None:
        import ray

        self.host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.arguments = list(arguments)
        self.url: str | None = None
        if arguments[0] == "serve":
            port = free_port()
            self.arguments += ["--host", self.host, "--port", str(port)]
            self.url = f"http://{self.host}:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rstar2_sandbox.cli", *self.arguments],
            preexec_fn=_die_with_parent,
        )

    def ready(self, timeout_s: float = 120.0) -> str | None:
        """Wait for a front end to answer ``/healthz``; returns its URL (None for a worker)."""
        deadline = time.monotonic() + timeout_s
        while self.url is not None:
            if self.process.poll() is not None:
                command = " ".join(self.arguments)
                raise RuntimeError(
                    f"rstar2-sandbox {command} exited with {self.process.returncode}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2):
                    return self.url
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sandbox at {self.url} did not start") from None
                time.sleep(0.2)
        return None

    def stop(self) -> None:
        process: subprocess.Popen[bytes] | None = getattr(self, "process", None)
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def sandbox_commands(servers: int, workers: int, redis_url: str | None) -> list[list[str]]:
    """The front end first, then the workers."""
    fork_servers = ["--servers", str(servers)] if servers else []
    if not workers:
        return [["serve", *fork_servers]]
    assert redis_url is not None
    front = ["serve", "--redis", redis_url]
    return [front, *(["worker", "--redis", redis_url, *fork_servers] for _ in range(workers))]
