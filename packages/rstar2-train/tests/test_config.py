"""Stage configs: every shipped config validates; extends, --set and null; precise errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rstar2_train import ConfigError, dump_config, load_config, shipped_configs


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_every_shipped_config_validates_and_round_trips(name: str, tmp_path: Path) -> None:
    config = load_config(name)
    assert config.name == name
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(dump_config(config))
    assert load_config(str(resolved)) == config


def test_paper_recipe_is_what_the_paper_says() -> None:
    sft = load_config("qwen3-14b-sft")
    assert sft.sft is not None
    assert (sft.sft.epochs, sft.optimizer.lr, sft.schedule.kind) == (3, 5e-6, "cosine")
    assert (sft.schedule.warmup_ratio, sft.sft.batch_size) == (0.04, 128)
    stage1, stage2, stage3 = (load_config(f"qwen3-14b-rl-stage{i}") for i in (1, 2, 3))
    for stage in (stage1, stage2, stage3):
        assert stage.rl is not None
        assert (stage.rl.prompts_per_step, stage.rl.rollouts_per_prompt) == (512, 32)
        assert (stage.rl.roc.keep, stage.rl.roc.strategy) == (16, "sample")
        assert (stage.rl.loss.eps_low, stage.rl.loss.eps_high) == (0.2, 0.28)
        assert stage.optimizer.lr == 1e-6
        assert stage.rl.rollout.temperature == 1.0
    assert stage1.rl is not None
    assert stage2.rl is not None
    assert stage3.rl is not None
    rls = (stage1.rl, stage2.rl, stage3.rl)
    assert [rl.steps for rl in rls] == [300, 85, 125]
    assert [rl.rollout.max_response_tokens for rl in rls] == [
        8192,
        12288,
        12288,
    ]
    assert [rl.rollout.max_turns for rl in rls] == [10, 10, 15]
    assert stage1.schedule.warmup_steps == 20
    # Stage 2 continues stage 1's optimizer; stage 3 resets it.
    assert (stage2.optimizer.load_state, stage3.optimizer.load_state) == (True, False)
    assert stage2.model.path == "runs/qwen3-14b-rl-stage1/final"
    assert stage3.data.train.build is not None
    assert stage3.data.train.recipe is None


def test_extends_merges_and_set_overrides_last(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    child = tmp_path / "nested" / "child.yaml"
    child.parent.mkdir()
    base.write_text(yaml.safe_dump({"extends": "tiny-rl", "rl": {"steps": 7}, "seed": 3}))
    child.write_text(yaml.safe_dump({"extends": "../base.yaml", "rl": {"roc": {"keep": 2}}}))
    config = load_config(str(child), ["rl.rollout.max_turns=3", "seed=11"])
    assert config.rl is not None
    assert config.rl.steps == 7  # from base
    assert config.rl.roc.keep == 2  # from child
    assert config.rl.rollouts_per_prompt == 8  # from tiny-rl
    assert config.rl.rollout.max_turns == 3  # --set
    assert config.seed == 11  # --set wins over the file


def test_null_clears_an_inherited_value(tmp_path: Path) -> None:
    config = load_config(
        "tiny-rl", ["data.train.recipe=null", f"data.train.file={tmp_path / 'x.jsonl'}"]
    )
    assert config.data.train.recipe is None
    assert config.data.train.file == str(tmp_path / "x.jsonl")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["rl.roc.kep=3"], "rl.roc.kep: unknown key; did you mean 'keep'?"),
        (["rl.steps=-1"], "rl.steps: Input should be greater than 0 (got -1)"),
        (["rl.roc.keep=9"], "roc.keep (9) cannot exceed rollouts_per_prompt (8)"),
        (["optimizer.lr=fast"], "optimizer.lr: Input should be a valid number"),
        (["model.init.config.hidden_size=8"], "model: set exactly one of path, init"),
        (["rl.rollout.chat.system_prompt=x"], "rl.rollout.chat: set the top-level chat section"),
        (["kind=sft"], "rl.steps, rl.prompts_per_step, rl.rollouts_per_prompt, rl.roc.strategy"),
        (["kind=sft"], "not settings of an SFT stage (kind: sft); rl.* settings belong to kind rl"),
        (["rl.roc.strategy=best"], "rl.roc.strategy: Input should be 'sample', 'topk' or 'none'"),
        (["rl.max_staleness=-1"], "rl.max_staleness: Input should be greater than or equal to 0"),
        (
            ["rl.max_staleness=1", "rl.loss.tis_cap=2"],
            "loss.tis_cap is the synchronous loop's correction",
        ),
        (["rl.loss.behaviour_band=[2, 1]"], "behaviour_band must be [low, high]"),
        (["rl.engines.cpus=[1]"], "cpus: pins engine processes; set process: true"),
        (
            [
                "rl.engines.kind=vllm",
                "rl.rollout={top_k: 20, return_support: true}",
                "rl.validation={benchmarks: [aime24]}",
            ],
            "rl.validation's requests would be refused",
        ),
        (
            ["rl.engines.process=true", "placement={trainer: {ranks: 1}}"],
            "with placement each engine is a Ray actor already",
        ),
    ],
)
def test_bad_values_name_the_key_and_what_was_expected(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config("tiny-rl", overrides)
    assert expected in str(error.value)


@pytest.mark.parametrize(
    ("config", "overrides", "keys"),
    [
        ("tiny-sft", ["rl.steps=abc"], "rl.steps"),
        ("tiny-sft", ["rl.steps=3", "rl.roc.keep=2"], "rl.steps, rl.roc.keep"),
        ("tiny-rl", ["sft.max_steps=3"], "sft.max_steps"),
    ],
)
def test_settings_of_the_other_kind_are_named_key_by_key(
    config: str, overrides: list[str], keys: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(config, overrides)
    kind = "SFT" if config == "tiny-sft" else "RL"
    assert str(error.value).startswith(f"{config}: {keys}: not settings of an {kind} stage")
    assert "Field required" not in str(error.value)


def test_bad_files_and_overrides_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a config file nor a shipped config"):
        load_config("no-such-config")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "missing.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("rl: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match=r"expected KEY\.PATH=VALUE"):
        load_config("tiny-rl", ["rl.steps"])
    loop = tmp_path / "loop.yaml"
    loop.write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends chain loops"):
        load_config(str(loop))
