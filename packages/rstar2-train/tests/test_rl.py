"""The RL stage end to end: real tool calls, real grading, updates, weight sync, outputs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_runs import DemoData, rl_config
from transformers import AutoModelForCausalLM
from wandb_records import offline_run, read_records

from rstar2_train import read_metrics, run_stage
from rstar2_train.checkpoint import read_state

# What every step logs (issue: per step, in metrics JSONL and on the console).
REQUIRED = {
    "reward/mean",
    "reward/accuracy",
    "groups/kept",
    "groups/dropped_all_correct",
    "groups/dropped_all_incorrect",
    "tools/calls_per_rollout",
    "tools/error_ratio_kept_positives",
    "tools/error_ratio_all_positives",
    "format/penalized_positives_ratio",
    "response/length_mean",
    "response/length_max",
    "response/truncation_rate",
    "actor/clip_fraction_low",
    "actor/clip_fraction_high",
    "actor/ratio_mean",
    "actor/ratio_max",
    "actor/grad_norm",
    "actor/lr",
    "mismatch/logprob_abs_mean",
    "mismatch/logprob_abs_max",
    "throughput/model_tokens_per_s",
    "time/rollout_s",
    "time/reward_s",
    "time/update_s",
    "time/sync_s",
}


@pytest.fixture(scope="module")
def rl_run(
    sft_run: Path,
    demo_data: DemoData,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch_module: pytest.MonkeyPatch,
) -> Path:
    output = tmp_path_factory.mktemp("runs") / "rl"
    validation = (
        f"rl.validation={{benchmarks: [demo={demo_data.problems}], at_start: true, "
        "every_steps: 1, samples: 1, temperature: 0}"
    )
    # Offline W&B must need nothing from outside: no login, no network, no settings of ours.
    monkeypatch_module.setenv("WANDB_API_KEY", "")
    monkeypatch_module.setenv("WANDB_CONFIG_DIR", str(output.parent / "wandb-config"))
    wandb = "logging.wandb={mode: offline, project: rstar2-tests, tags: [test]}"
    run_stage(
        rl_config(
            demo_data, sft_run / "final", output, "schedule.warmup_steps=0", validation, wandb
        )
    )
    return output


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_step_logs_what_the_issue_asks(rl_run: Path) -> None:
    records = read_metrics(rl_run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: validation before the first step
    for record in records[1:]:
        assert set(record) >= REQUIRED, sorted(REQUIRED - set(record))
        assert record["rollouts/total"] == 18
        assert record["rollouts/failed"] == 0
        assert record["tools/calls_per_rollout"] > 0.5  # the SFT'd policy uses the tool


def test_steps_update_the_policy_and_the_engines_follow(rl_run: Path, sft_run: Path) -> None:
    records = read_metrics(rl_run / "metrics.jsonl")[1:]
    # Mixed groups were kept and trained on with a non-zero learning rate...
    assert records[0]["groups/kept"] >= 1
    assert records[0]["actor/trained_tokens"] > 0
    assert records[0]["actor/lr"] > 0
    before = AutoModelForCausalLM.from_pretrained(sft_run / "final").state_dict()
    after = AutoModelForCausalLM.from_pretrained(
        rl_run / "checkpoints" / "step-000001"
    ).state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    # ...and step 2's rollouts were sampled with step 1's weights: the engine's log-probs
    # equal the trainer's recomputation (stale weights would differ by far more).
    assert records[1]["mismatch/logprob_abs_max"] < 1e-3


def test_run_directory_holds_everything(rl_run: Path) -> None:
    assert [p.name for p in sorted((rl_run / "checkpoints").iterdir())] == [
        "step-000001",
        "step-000002",
    ]
    assert read_state(rl_run / "final").finished
    sample = (rl_run / "samples" / "step-000001.md").read_text()
    assert "**Tool response** (success)" in sample
    assert "<tool_call>" in sample
    assert {p.name for p in (rl_run / "plots").iterdir()} >= {
        "reward.png",
        "accuracy.png",
        "response_length.png",
        "tool_errors.png",
    }


def test_wandb_offline_run_holds_config_metrics_and_rollouts(rl_run: Path) -> None:
    records = read_records(offline_run(rl_run))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "rstar2-tests"
    assert run.display_name == "tiny-rl"
    assert list(run.tags) == ["test"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["rl"]["steps"] == 2
    assert config["output_dir"] == str(rl_run)
    # Every step's metrics, as metrics.jsonl has them (validation before the first step: 0).
    history: dict[int, dict[str, object]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                "/".join(i.nested_key) or i.key: json.loads(i.value_json)
                for i in record.history.item
            }
            history.setdefault(int(items["_step"]), {}).update(items)
    for logged in read_metrics(rl_run / "metrics.jsonl"):
        step = history[logged["step"]]
        for name, value in logged.items():
            if name != "step" and value is not None:
                assert step[name] == pytest.approx(value), name
    # Each RL step's sample rollouts, as a table whose rows hold the whole conversation.
    for number in (1, 2):
        assert history[number]["samples/rollouts/_type"] == "table-file"
        table = offline_run(rl_run).parent / "files" / str(history[number]["samples/rollouts/path"])
        rows = json.loads(table.read_text())
        conversation = rows["columns"].index("conversation")
        assert len(rows["data"]) == 4  # logging.sample_rollouts
        assert all("**Turn 1**" in row[conversation] for row in rows["data"])
    assert (rl_run / "wandb" / "run-id").read_text().strip() == run.run_id


def test_validation_runs_on_the_trainers_engines(rl_run: Path) -> None:
    records = read_metrics(rl_run / "metrics.jsonl")
    # Before training, the SFT policy answers its three memorised problems greedily, calling
    # the tool; every validation is logged with its step and kept in its own run directory.
    assert records[0]["val/demo/avg@1"] == 1.0
    assert records[0]["val/demo/tool_calls_per_rollout"] >= 1
    for record in records:
        assert 0 <= record["val/demo/avg@1"] <= 1
        folder = rl_run / "validation" / f"step-{record['step']:06d}"
        assert len((folder / "generations.jsonl").read_text().splitlines()) == 3
        assert (folder / "run.json").is_file()


def test_unknown_validation_benchmark_stops_before_training(
    sft_run: Path, demo_data: DemoData, tmp_path: Path
) -> None:
    config = rl_config(
        demo_data, sft_run / "final", tmp_path / "rl", "rl.validation={benchmarks: [aime42]}"
    )
    with pytest.raises(ValueError, match=r"rl\.validation\.benchmarks: unknown benchmark 'aime42'"):
        run_stage(config)
    assert read_metrics(tmp_path / "rl" / "metrics.jsonl") == []
    assert not (tmp_path / "rl" / "checkpoints").exists()
