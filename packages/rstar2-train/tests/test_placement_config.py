"""The placement section: validation, and when a stage is placed on Ray at all."""

from __future__ import annotations

import pytest
import torch

from rstar2_train import ConfigError, TokenSequence, load_config, micro_batches
from rstar2_train.config import PlacementConfig
from rstar2_train.placement.distributed import assign
from rstar2_train.placement.stage import stage_placement


def test_without_section_or_ray_address_the_stage_stays_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert stage_placement(load_config("tiny-rl")) is None
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert stage_placement(load_config("tiny-rl")) == PlacementConfig()
    assert stage_placement(load_config("tiny-sft")) is None  # SFT runs in one process


def test_placement_section_is_validated() -> None:
    config = load_config("tiny-rl", ["placement={trainer: {ranks: 2}, engines: {gpus: 1}}"])
    assert config.placement is not None
    assert config.placement.trainer.ranks == 2
    with pytest.raises(ConfigError, match=r"rl\.engines\.count \(1\) must equal"):
        load_config("tiny-rl", ["placement={mode: colocated, trainer: {ranks: 2}}"])
    with pytest.raises(ConfigError, match=r"workers needs placement\.sandbox\.redis_url"):
        load_config("tiny-rl", ["placement={sandbox: {workers: 2}}"])
    with pytest.raises(ConfigError, match="RL stages only"):
        load_config("tiny-sft", ["placement={}"])
    with pytest.raises(ConfigError, match="ranks"):
        load_config("tiny-rl", ["placement={trainer: {ranks: 0}}"])
    checkpointed = "placement={trainer: {fsdp: {activation_checkpointing: true}}}"
    with pytest.raises(ConfigError, match=r"rl\.shared_prefix needs: set rl\.shared_prefix=false"):
        load_config("tiny-rl", [checkpointed])
    assert load_config("tiny-rl", [checkpointed, "rl.shared_prefix=false"]).placement is not None


def test_grader_section_defaults_to_one_actor_and_is_validated() -> None:
    grader = PlacementConfig().grader
    assert (grader.actors, grader.cpus) == (1, 1.0)
    config = load_config("tiny-rl", ["placement={grader: {actors: 3, cpus: 2.5}}"])
    assert config.placement is not None
    assert (config.placement.grader.actors, config.placement.grader.cpus) == (3, 2.5)
    with pytest.raises(ConfigError, match=r"placement\.grader\.actors: .* greater than or equal"):
        load_config("tiny-rl", ["placement={grader: {actors: 0}}"])
    with pytest.raises(ConfigError, match=r"placement\.grader\.cpus: .* greater than 0"):
        load_config("tiny-rl", ["placement={grader: {cpus: 0}}"])
    # The worker count is rl.grader's, shared with the in-process grader.
    with pytest.raises(ConfigError, match=r"placement\.grader\.workers: unknown key"):
        load_config("tiny-rl", ["placement={grader: {workers: 2}}"])


def test_micro_batches_are_spread_evenly_over_ranks() -> None:
    sequences = [TokenSequence(ids=[1] * n, mask=[1] * n) for n in (40, 30, 20, 10, 10, 5)]
    batches = micro_batches(sequences, 40, packing=True, pad_id=0, device=torch.device("cpu"))
    own = assign(batches, 2)
    assert sorted(i for part in own for i in part) == list(range(len(batches)))
    loads = [sum(batches[i].input_ids.numel() for i in part) for part in own]
    sizes = [b.input_ids.numel() for b in batches]
    assert max(loads) <= sum(sizes) / 2 + max(sizes) / 2  # greedy, largest first
    assert assign(batches[:1], 3)[1:] == [[], []]  # idle ranks run padding passes
