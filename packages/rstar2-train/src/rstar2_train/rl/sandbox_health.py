"""The stage's watch on its sandbox: one real call before the first step, a count of failed
calls while it trains.

A rollout turns a failed sandbox call into an error shown to the model and carries on, which is
right for one lost call; but a sandbox that is down fails every call, and a stage that kept
training on those rollouts would spend hours learning that tools never work. So the stage checks
the sandbox before its first step, stops once ``max_consecutive_failures`` calls in a row failed
(every later call failing at once, so the step ends in seconds), and warns each step whose share
of failed calls is over ``error_rate_warning``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.protocol import Sandbox
from rstar2_train.config.schema import SandboxConfig

logger = logging.getLogger(__name__)

_CHECK = RunRequest(code="print(6 * 7)", timeout_s=30.0)
_CHECK_OUTPUT = "42"


class SandboxUnavailableError(RuntimeError):
    """The stage's sandbox failed its check, or too many calls in a row while training."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


class GuardedSandbox:
    """``inner`` with its failed calls counted: an exception or an ``internal_error`` result
    (the sandbox's own failure, not the code's). Implements ``Sandbox``."""

    def __init__(self, inner: Sandbox, config: SandboxConfig) -> None:
        self.inner = inner
        self.config = config
        url = config.url or getattr(inner, "url", None)
        embedded = "the embedded sandbox (rl.sandbox.executor)"
        self.where = f"the sandbox at {url}" if url else embedded
        self.consecutive = 0
        self.calls = 0
        self.failures = 0
        self.down: str | None = None
        """Why the sandbox is taken for down (its last failure), once it is."""

    async def check(self) -> None:
        """One real call; raises ``SandboxUnavailableError`` naming the cause unless it prints
        what it should within ``check_timeout_s``."""
        timeout = self.config.check_timeout_s
        try:
            result = await asyncio.wait_for(self.inner.run(_CHECK), timeout)
        except TimeoutError:
            cause = f"no answer in {timeout:g} s (rl.sandbox.check_timeout_s)"
        except Exception as error:  # any failure of the call is the cause to report
            cause = f"{type(error).__name__}: {error}"
        else:
            if result.ok and result.stdout.strip() == _CHECK_OUTPUT:
                logger.info("%s answered its check in %.2f s", self.where, result.wall_time_s)
                return
            cause = f"{result.status.value}: {result.stderr or result.stdout or 'no output'}"
        raise SandboxUnavailableError(
            _one_line(f"{self.where} failed its check before the first step: {cause}")
        )

    def _failed(self, cause: str) -> None:
        self.failures += 1
        self.consecutive += 1
        if self.down is None and self.consecutive >= self.config.max_consecutive_failures:
            self.down = _one_line(cause)
            logger.error(
                "%s failed %d calls in a row (rl.sandbox.max_consecutive_failures); last: %s",
                self.where,
                self.consecutive,
                self.down,
            )

    def _counted(self, result: RunResult) -> RunResult:
        if result.status is RunStatus.INTERNAL_ERROR:
            self._failed(f"internal_error: {result.stderr}")
        else:
            self.consecutive = 0
        return result

    async def run(self, request: RunRequest) -> RunResult:
        self.calls += 1
        if self.down is not None:  # each call would wait out the same failure again
            self.failures += 1
            raise SandboxUnavailableError(f"{self.where} is down: {self.down}")
        try:
            result = await self.inner.run(request)
        except Exception as error:
            self._failed(f"{type(error).__name__}: {error}")
            raise
        return self._counted(result)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        return list(await asyncio.gather(*(self.run(request) for request in requests)))

    async def aclose(self) -> None:
        await self.inner.aclose()

    def step_metrics(self, step: int) -> dict[str, float]:
        """This step's calls and failures (the counts start again for the next step); a
        warning when the share of failed calls is over ``error_rate_warning``."""
        calls, failures = self.calls, self.failures
        self.calls = self.failures = 0
        rate = failures / calls if calls else 0.0
        if rate > self.config.error_rate_warning:
            logger.warning(
                "step %d: %d of %d sandbox calls failed (%.0f%%, over rl.sandbox."
                "error_rate_warning %.0f%%): the rollouts train on tool errors",
                step,
                failures,
                calls,
                100 * rate,
                100 * self.config.error_rate_warning,
            )
        return {"tools/sandbox_calls": float(calls), "tools/sandbox_failure_rate": rate}

    def raise_if_down(self, step: int) -> None:
        """``SandboxUnavailableError`` once the sandbox is taken for down."""
        if self.down is not None:
            raise SandboxUnavailableError(
                f"{self.where} failed {self.config.max_consecutive_failures} calls in a row "
                f"during step {step} (rl.sandbox.max_consecutive_failures); last: {self.down}"
            )
