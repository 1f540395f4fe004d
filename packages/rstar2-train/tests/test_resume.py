"""Kill a running stage mid-step with SIGKILL; --resume must reach the uninterrupted weights."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_runs import DemoData, rl_config, sft_config
from transformers import AutoModelForCausalLM

from rstar2_train import StageConfig, dump_config, read_metrics, run_stage

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


def assert_same(resumed: Path, uninterrupted: Path) -> None:
    a, b = final_weights(resumed), final_weights(uninterrupted)
    assert a.keys() == b.keys()
    for name in a:
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
    assert_same(tmp_path / "killed", tmp_path / "whole")
    records = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert sum(r["actor/trained_tokens"] > 0 for r in records) >= 2  # real updates happened


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
