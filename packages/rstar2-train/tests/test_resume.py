"""Kill a running stage mid-step with SIGKILL; --resume must reach the uninterrupted weights."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_runs import DemoData, rl_config, sft_config
from transformers import AutoModelForCausalLM

from rstar2_train import StageConfig, dump_config, read_metrics, run_stage
from rstar2_train.checkpoint import list_checkpoints
from rstar2_train.rl.asynchronous import LEDGER

pytestmark = pytest.mark.slow


def run_and_kill(config: StageConfig, tmp_path: Path, *, after_step: int) -> None:
    """Start the stage as a real process and SIGKILL it while step ``after_step + 1`` runs."""
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    command = [sys.executable, "-m", "rstar2_train", "stage", str(path), "--no-progress"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    metrics = Path(config.output_dir) / "metrics.jsonl"
    checkpoint = Path(config.output_dir) / "checkpoints" / f"step-{after_step:06d}"
    deadline = time.monotonic() + 240
    try:
        while not (checkpoint.is_dir() and len(read_metrics(metrics)) >= after_step):
            if process.poll() is not None:
                raise AssertionError(f"the stage ended early: {process.stderr.read().decode()}")
            assert time.monotonic() < deadline, "the stage did not reach its checkpoint"
            time.sleep(0.05)
        time.sleep(0.3)  # into the next step
        assert process.poll() is None, "the stage finished before it could be killed"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert not (Path(config.output_dir) / "final").exists()


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(output / "final").state_dict()


def assert_same(resumed: Path, uninterrupted: Path, *, exact: bool = False) -> None:
    a, b = final_weights(resumed), final_weights(uninterrupted)
    assert a.keys() == b.keys()
    for name in a:
        if exact:
            assert torch.equal(a[name], b[name]), name
        else:
            assert torch.allclose(a[name], b[name], atol=1e-6), name
    steps = [r["step"] for r in read_metrics(resumed / "metrics.jsonl")]
    assert steps == sorted(set(steps)) == list(range(1, steps[-1] + 1))  # no step lost or twice


def test_rl_stage_resumes_to_the_same_weights(
    sft_run: Path, demo_data: DemoData, tmp_path: Path
) -> None:
    def config(name: str) -> StageConfig:
        return rl_config(
            demo_data, sft_run / "final", tmp_path / name, "rl.steps=4", "schedule.warmup_steps=0"
        )

    run_and_kill(config("killed"), tmp_path, after_step=2)
    run_stage(config("killed"), resume=True)
    run_stage(config("whole"))
    # rl.max_staleness 0 (the default): the synchronous loop resumes bit for bit.
    assert_same(tmp_path / "killed", tmp_path / "whole", exact=True)
    records = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert sum(r["actor/trained_tokens"] > 0 for r in records) >= 2  # real updates happened


def ledger(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / LEDGER).read_text().splitlines()]


def test_async_stage_resumes_regenerating_the_groups_in_flight(
    sft_run: Path, demo_data: DemoData, tmp_path: Path
) -> None:
    """Killed after step 2's checkpoint while steps 3 and 4 were generating (max_staleness 1):
    the resumed stage generates them again from the checkpoint's weights and trains on every
    step's problems once, in the uninterrupted run's order."""

    def config(name: str) -> StageConfig:
        return rl_config(
            demo_data,
            sft_run / "final",
            tmp_path / name,
            "rl.steps=4",
            "schedule.warmup_steps=0",
            "rl.max_staleness=1",
        )

    run_and_kill(config("killed"), tmp_path, after_step=2)
    start = int(list_checkpoints(tmp_path / "killed" / "checkpoints")[-1].name.split("-")[-1])
    assert start < 4
    run_stage(config("killed"), resume=True)
    run_stage(config("whole"))
    killed, whole = ledger(tmp_path / "killed"), ledger(tmp_path / "whole")
    assert [r["step"] for r in killed] == [r["step"] for r in whole] == [1, 2, 3, 4]
    assert [r["problems"] for r in killed] == [r["problems"] for r in whole]
    assert [r["admitted_version"] for r in whole] == [0, 0, 1, 2]  # step s: version s - 2
    # The steps after the checkpoint were in flight at the kill (or not yet admitted): the
    # resumed stage generated them from the checkpoint's weights (or later ones).
    admitted = [r["admitted_version"] for r in killed]
    assert admitted[:start] == [0, 0, 1, 2][:start]
    assert admitted[start:] == [max(start, step - 2) for step in range(start + 1, 5)]
    steps = [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]
    assert all(
        r["staleness/lag_max"] <= 1 for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")
    )


def test_sft_stage_resumes_to_the_same_weights(demo_data: DemoData, tmp_path: Path) -> None:
    def config(name: str) -> StageConfig:
        return sft_config(
            demo_data, tmp_path / name, "sft.max_steps=40", "checkpoint.every_steps=10"
        )

    run_and_kill(config("killed"), tmp_path, after_step=20)
    # Resumed from the command line, its output redirected as to files: the result (where the
    # final weights are) on stdout; logs and progress lines on stderr, each line whole.
    command = [sys.executable, "-m", "rstar2_train", "stage", str(tmp_path / "config.yaml")]
    done = subprocess.run(
        [*command, "--resume", "--log-every", "10"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"done: final weights in {tmp_path / 'killed' / 'final'}"]
    progress = re.findall(r"^\S+ \S+ INFO sft \S+: (\d+/40) steps \(.*, eta ", done.stderr, re.M)
    assert progress == ["30/40", "40/40"], done.stderr
    run_stage(config("whole"))
    assert_same(tmp_path / "killed", tmp_path / "whole")


def run_and_signal(config: StageConfig, tmp_path: Path, signum: int, *, after_step: int) -> str:
    """Start the stage from the command line, send it ``signum`` once step ``after_step`` is
    logged, and return the last line it wrote on stderr; it must exit as the signal says."""
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    command = [sys.executable, "-m", "rstar2_train", "stage", str(path), "--no-progress"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics = Path(config.output_dir) / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while len(read_metrics(metrics)) < after_step:
            assert process.poll() is None, "the stage ended before the signal"
            assert time.monotonic() < deadline, "the stage did not reach the step"
            time.sleep(0.05)
        process.send_signal(signum)
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 128 + signum, err
    assert out == ""
    assert "Traceback" not in err
    return err.splitlines()[-1]


@pytest.mark.parametrize(
    ("kind", "signum"), [("sft", signal.SIGINT), ("rl", signal.SIGTERM)], ids=["sft", "rl"]
)
def test_a_signal_saves_the_step_and_the_resumed_stage_reaches_the_same_weights(
    kind: str, signum: int, sft_run: Path, demo_data: DemoData, tmp_path: Path
) -> None:
    def config(name: str) -> StageConfig:
        never = "checkpoint.every_steps=null"  # only the stop saves before the end
        if kind == "sft":
            return sft_config(demo_data, tmp_path / name, "sft.max_steps=40", never)
        return rl_config(
            demo_data,
            sft_run / "final",
            tmp_path / name,
            "rl.steps=4",
            never,
            "schedule.warmup_steps=0",
        )

    total = 40 if kind == "sft" else 4
    line = run_and_signal(config("stopped"), tmp_path, signum, after_step=1 if kind == "rl" else 5)
    found = re.fullmatch(
        r"interrupted at step (\d+); run the same command again with --resume to resume", line
    )
    assert found is not None, line
    step = int(found[1])
    assert step < total
    checkpoints = list_checkpoints(tmp_path / "stopped" / "checkpoints")
    assert [path.name for path in checkpoints] == [f"step-{step:06d}"]
    assert not (tmp_path / "stopped" / "final").exists()
    run_stage(config("stopped"), resume=True)
    run_stage(config("whole"))
    assert_same(tmp_path / "stopped", tmp_path / "whole", exact=True)
