"""The interface shared by every way of running code: in-process, over HTTP, through a cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rstar2_sandbox.models import RunRequest, RunResult


@runtime_checkable
class Sandbox(Protocol):
    """Runs code and returns results; ``LocalSandbox`` and ``SandboxClient`` both implement it."""

    async def run(self, request: RunRequest) -> RunResult:
        """Run one request."""
        ...

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        """Run many requests concurrently; results come back in request order."""
        ...

    async def aclose(self) -> None:
        """Release processes and connections."""
        ...
