"""A dead sandbox stops an RL stage: before its first step, or once calls fail in a row."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from tiny_runs import DemoData, rl_config
from typer.testing import CliRunner

from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_train import dump_config, read_metrics, run_stage
from rstar2_train.checkpoint import list_checkpoints
from rstar2_train.cli import app
from rstar2_train.config.schema import SandboxConfig
from rstar2_train.rl.sandbox_health import GuardedSandbox, SandboxUnavailableError
from rstar2_train.stage import StageRun

# As rstar2-sandbox's own start tests do: imported at start by the fork-servers, it makes their
# working directory fail as a read-only /tmp would.
READ_ONLY_TMP = """
import errno, tempfile

def mkdtemp(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system", "/tmp/rstar2-sandbox-x")

tempfile.mkdtemp = mkdtemp
"""


class FlakySandbox:
    """Answers every call until ``failing``, then raises as an unreachable service does."""

    def __init__(self) -> None:
        self.failing = False
        self.calls = 0

    async def run(self, request: RunRequest) -> RunResult:
        self.calls += 1
        if self.failing:
            raise ConnectionError("connection refused")
        return RunResult(status=RunStatus.SUCCESS, stdout="42\n", exit_code=0)

    async def run_many(self, requests: Sequence[RunRequest]) -> list[RunResult]:
        return [await self.run(request) for request in requests]

    async def aclose(self) -> None:
        pass


def test_a_sandbox_url_that_answers_nothing_stops_the_stage_in_one_line(
    sft_run: Path, demo_data: DemoData, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    config = rl_config(
        demo_data,
        sft_run / "final",
        output,
        "rl.sandbox.url=http://127.0.0.1:9",  # the discard port: nothing listens
        "rl.sandbox.check_timeout_s=2",
    )
    (tmp_path / "config.yaml").write_text(dump_config(config))
    result = CliRunner().invoke(app, ["stage", str(tmp_path / "config.yaml"), "--no-progress"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert line == (
        "error: the sandbox at http://127.0.0.1:9 failed its check before the first step: "
        "no answer in 2 s (rl.sandbox.check_timeout_s)"
    )
    assert read_metrics(output / "metrics.jsonl") == []  # no step ran


def test_an_embedded_sandbox_that_cannot_start_stops_the_stage_naming_why(
    sft_run: Path, demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sitecustomize.py").write_text(READ_ONLY_TMP)
    monkeypatch.syspath_prepend(str(tmp_path))
    output = tmp_path / "run"
    with pytest.raises(SandboxUnavailableError) as raised:
        run_stage(rl_config(demo_data, sft_run / "final", output))
    message = str(raised.value)
    assert message.startswith(
        "the embedded sandbox (rl.sandbox.executor) failed its check before the first step: "
    )
    assert "fork-server 0 could not start" in message
    assert "/tmp/rstar2-sandbox-x" in message
    assert "\n" not in message
    assert read_metrics(output / "metrics.jsonl") == []


def test_a_sandbox_that_dies_mid_stage_stops_it_after_a_checkpoint(
    sft_run: Path, demo_data: DemoData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = FlakySandbox()
    monkeypatch.setattr("rstar2_train.rl.resources.make_sandbox", lambda config: sandbox)
    after_step = StageRun.after_step

    def then_fail(run: StageRun, step: int, total: int, metrics: dict[str, float]) -> None:
        after_step(run, step, total, metrics)
        sandbox.failing = True  # from step 2 on

    monkeypatch.setattr(StageRun, "after_step", then_fail)
    output = tmp_path / "run"
    config = rl_config(
        demo_data,
        sft_run / "final",
        output,
        "rl.steps=3",
        "checkpoint.every_steps=null",  # step 1's checkpoint is the stop's own
        "rl.sandbox.max_consecutive_failures=2",
    )
    with pytest.raises(SandboxUnavailableError, match="failed 2 calls in a row during step 2"):
        run_stage(config)
    assert [path.name for path in list_checkpoints(output / "checkpoints")] == ["step-000001"]
    assert not (output / "final").exists()
    assert [r["step"] for r in read_metrics(output / "metrics.jsonl")] == [1]
    (record,) = read_metrics(output / "metrics.jsonl")
    assert record["tools/sandbox_calls"] > 0
    assert record["tools/sandbox_failure_rate"] == 0.0


def test_failures_in_a_row_take_the_sandbox_down_and_a_high_error_rate_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = FlakySandbox()
    guard = GuardedSandbox(
        inner, SandboxConfig(max_consecutive_failures=3, error_rate_warning=0.25)
    )
    request = RunRequest(code="print(6 * 7)")

    async def calls(count: int) -> None:
        for _ in range(count):
            with contextlib.suppress(ConnectionError, SandboxUnavailableError):
                await guard.run(request)

    asyncio.run(calls(3))
    inner.failing = True
    asyncio.run(calls(2))
    inner.failing = False
    asyncio.run(calls(1))  # a success between failures: the count starts again
    with caplog.at_level(logging.WARNING):
        metrics = guard.step_metrics(1)
    assert metrics == {"tools/sandbox_calls": 6.0, "tools/sandbox_failure_rate": 2 / 6}
    assert "step 1: 2 of 6 sandbox calls failed" in caplog.text
    guard.raise_if_down(1)  # not down: two in a row only
    inner.failing = True
    asyncio.run(calls(3))
    assert guard.down == "ConnectionError: connection refused"
    reached = inner.calls
    asyncio.run(calls(4))
    assert inner.calls == reached  # down: no call reaches it any more
    with pytest.raises(SandboxUnavailableError, match="failed 3 calls in a row during step 2"):
        guard.raise_if_down(2)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert guard.step_metrics(2)["tools/sandbox_failure_rate"] == 1.0
        assert guard.step_metrics(3) == {
            "tools/sandbox_calls": 0.0,
            "tools/sandbox_failure_rate": 0.0,
        }
    assert caplog.text.count("sandbox calls failed") == 1
