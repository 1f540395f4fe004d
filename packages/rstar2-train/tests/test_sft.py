"""The SFT stage end to end: outputs, a model that learned the protocol, and its guards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tiny_runs import DemoData, sft_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from rstar2_data.rows import read_rows
from rstar2_eval import Grader, GraderConfig
from rstar2_sandbox.local import LocalSandbox
from rstar2_scheduler import (
    RolloutConfig,
    RolloutRunner,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_train import RunError, load_config, read_metrics, run_stage
from rstar2_train.checkpoint import read_state
from rstar2_train.rl.rollouts import model_text


def test_run_directory_holds_everything(sft_run: Path) -> None:
    config = load_config(str(sft_run / "config.yaml"))
    assert config.kind == "sft"
    records = read_metrics(sft_run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 121))
    assert records[-1]["train/loss"] < records[0]["train/loss"] / 20
    assert {"actor/grad_norm", "actor/lr", "time/tokens_per_s", "data/epoch"} <= set(records[-1])
    assert [p.name for p in sorted((sft_run / "checkpoints").iterdir())] == [
        "step-000060",
        "step-000120",
    ]
    final = read_state(sft_run / "final")
    assert (final.step, final.finished) == (120, True)
    assert (sft_run / "final" / "optimizer.pt").is_file()  # the next stage may continue it
    assert {p.name for p in (sft_run / "plots").iterdir()} >= {"loss.png", "learning_rate.png"}


@pytest.mark.asyncio
async def test_the_model_learned_the_protocol(sft_run: Path, demo_data: DemoData) -> None:
    """Greedy rollouts of the trained problems call the tool, read its output and answer."""
    model = AutoModelForCausalLM.from_pretrained(sft_run / "final")
    tokenizer = AutoTokenizer.from_pretrained(sft_run / "final")
    problems = read_rows(demo_data.problems, kind="math")
    config = RolloutConfig(max_turns=4, max_response_tokens=512, temperature=0.0)
    engine = TransformersEngine(model, TransformersEngineConfig(kv_budget_tokens=8192))
    async with LocalSandbox() as sandbox, engine:
        runner = RolloutRunner(tokenizer, sandbox, config)
        trajectories = await asyncio.gather(*(runner.rollout(p, engine) for p in problems))
    with Grader(GraderConfig(workers=1)) as grader:
        grades = grader.grade_many(
            [model_text(t) for t in trajectories], [p.answer for p in problems]
        )
    for trajectory, grade in zip(trajectories, grades, strict=True):
        assert trajectory.quality.tool_calls >= 1
        assert trajectory.turns[0].sandbox_status == "success"
        assert grade.correct, trajectory.response_text


def test_a_second_run_does_not_overwrite_the_first(sft_run: Path, demo_data: DemoData) -> None:
    with pytest.raises(RunError, match="already holds a run"):
        run_stage(sft_config(demo_data, sft_run))


def test_validation_loss_and_tensorboard(demo_data: DemoData, tmp_path: Path) -> None:
    config = sft_config(
        demo_data,
        tmp_path / "run",
        "sft.max_steps=4",
        "sft.validation_every=2",
        f"data.validation.file={demo_data.transcripts}",
        "logging.tensorboard=true",
    )
    run_stage(config)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert ["val/loss" in r for r in records] == [False, True, False, True]
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def test_bad_transcripts_are_reported_by_id(demo_data: DemoData, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    lines = demo_data.transcripts.read_text().splitlines()
    # Drop the final assistant message of the first transcript: it ends with a tool message.
    first = json.loads(lines[0])
    first["messages"] = first["messages"][:-1]
    broken.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="example 't0': the transcript must end with an assistant"):
        run_stage(sft_config(demo_data, tmp_path / "a", f"data.train.file={broken}"))
    config = sft_config(
        demo_data,
        tmp_path / "b",
        f"data.train.file={broken}",
        "sft.on_bad_example=skip",
        "sft.max_steps=1",
    )
    run_stage(config)
    assert (tmp_path / "b" / "final").is_dir()
