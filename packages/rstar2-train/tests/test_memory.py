"""The memory plan: its estimates against the peaks and OOMs measured on GPUs, and its
decisions on devices of given sizes (no GPU needed: the device's memory is an input)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from models import tiny_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_train import TokenSequence, load_config, memory, micro_batches
from rstar2_train.config.schema import FSDPConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.memory import (
    GIB,
    MemoryPlanError,
    MemorySettings,
    ModelShape,
    estimate_peak,
    fsdp_settings,
    plan_memory,
    plan_stage_memory,
)
from rstar2_train.placement import ranks as ranks_module
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port

BENCH = Path(__file__).parents[1] / "bench"
H200 = 139 * GIB  # what torch reports free on an idle 141 GB H200
H100 = 79 * GIB


def bench_shapes() -> dict[str, dict[str, Any]]:
    """The Qwen3 shapes the GPU benchmark measures."""
    sys.path.insert(0, str(BENCH))
    from gpu_rows import SHAPES

    return SHAPES


def shape(name: str) -> ModelShape:
    with torch.device("meta"):
        return ModelShape.of(Qwen3ForCausalLM(Qwen3Config(**bench_shapes()[name])))


def ranks(tokens: int, checkpointing: bool = False) -> MemorySettings:
    """One FSDP2 rank with bf16 mixed precision (float32 master weights): the bench's rstar2."""
    fsdp = FSDPConfig(param_dtype="bfloat16")
    return fsdp_settings(fsdp, torch.bfloat16, ranks=1, tokens=tokens, checkpointing=checkpointing)


def plan(name: str, device: int, *, can_shrink: bool, can_checkpoint: bool = True) -> Any:
    return plan_memory(
        shape(name),
        ranks(16384),
        budget=int(device * 0.9),
        min_micro_batch_tokens=4096,
        can_shrink=can_shrink,
        can_checkpoint=can_checkpoint,
        settings_to_change="rl.micro_batch_tokens",
    )


def test_shapes_count_the_qwen3_parameters() -> None:
    small, large = shape("0.6b"), shape("4b")
    assert round(small.parameters / 1e6) == 596  # Qwen3-0.6B, tied head counted once
    assert round(large.parameters / 1e9, 2) == 4.02
    assert large.layers == 36
    assert large.root_parameters == 151936 * 2560 + 2560  # embeddings and the final norm


def test_the_estimate_predicts_the_oom_and_the_fit_measured_on_an_h200() -> None:
    # Measured on one H200 (2e64bca): the 4B shape in 16,384-token micro-batches without
    # checkpointing ran out of memory with 134 GiB in use; the 0.6B shape fit (47.5 GiB then,
    # with full logits, which the fused head no longer materialises).
    assert estimate_peak(shape("4b"), ranks(16384)).total > H200
    small = estimate_peak(shape("0.6b"), ranks(16384)).total
    assert 30 * GIB < small < 60 * GIB
    checkpointed = estimate_peak(shape("4b"), ranks(16384, checkpointing=True))
    assert checkpointed.activations < estimate_peak(shape("4b"), ranks(16384)).activations / 10


def test_the_4b_shape_plans_to_fit_a_141_gb_gpu() -> None:
    # In a stage's own process micro-batches can still shrink: halving them is cheaper than
    # recomputing every layer, so that comes first.
    shrunk = plan("4b", H200, can_shrink=True)
    assert shrunk.settings.micro_batch_tokens == 8192
    assert not shrunk.settings.checkpointing
    assert shrunk.estimate.total <= shrunk.budget
    assert shrunk.changes[0].startswith("micro-batch tokens 16384 -> 8192")
    # Trainer ranks get their micro-batches built: checkpointing is their lever.
    checkpointed = plan("4b", H200, can_shrink=False)
    assert checkpointed.settings.micro_batch_tokens == 16384
    assert checkpointed.settings.checkpointing
    assert "activation checkpointing on" in checkpointed.describe()


def test_what_fits_as_configured_is_left_alone() -> None:
    for device in (H200, H100):
        kept = plan("0.6b", device, can_shrink=True)
        assert kept.changes == ()
        assert kept.settings == ranks(16384)
        assert "settings as configured" in kept.describe()


def test_the_micro_batch_floor_and_the_longest_sequence_bound_the_shrinking() -> None:
    # On an 80 GB GPU the 4B shape does not fit without checkpointing above 4,096 tokens (the
    # floor): the plan checkpoints instead, at the largest size that fits.
    tight = plan("4b", H100, can_shrink=True)
    assert tight.settings.checkpointing
    assert tight.settings.micro_batch_tokens >= 4096
    long = MemorySettings(
        weight_bytes=4, compute_bytes=2, micro_batch_tokens=16384, longest_sequence=12000
    )
    found = plan_memory(
        shape("4b"),
        long,
        budget=int(H200 * 0.9),
        min_micro_batch_tokens=1024,
        can_shrink=True,
        can_checkpoint=True,
        settings_to_change="x",
    )
    # 8,192-token micro-batches would still hold the 12,000-token sequence: no halving.
    assert found.settings.micro_batch_tokens == 16384
    assert found.settings.checkpointing


def test_nothing_fits_fails_in_one_line_naming_the_settings() -> None:
    with pytest.raises(MemoryPlanError) as failure:
        plan_memory(
            shape("4b"),
            ranks(16384),
            budget=40 * GIB,
            min_micro_batch_tokens=4096,
            can_shrink=True,
            can_checkpoint=False,
            settings_to_change="rl.micro_batch_tokens, rl.shared_prefix=false",
        )
    message = str(failure.value)
    assert "\n" not in message
    assert "40.0 GiB are usable" in message
    assert message.endswith("change rl.micro_batch_tokens, rl.shared_prefix=false")


def test_sharding_over_ranks_divides_weights_and_optimizer_state() -> None:
    one = estimate_peak(shape("4b"), ranks(8192))
    fsdp = FSDPConfig(param_dtype="bfloat16")
    eight = estimate_peak(
        shape("4b"),
        fsdp_settings(fsdp, torch.bfloat16, ranks=8, tokens=8192, checkpointing=False),
    )
    assert eight.optimizer == pytest.approx(one.optimizer / 8, rel=1e-6)
    assert eight.activations == one.activations


def _on_a_gpu(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(memory, "device_memory", lambda device, fraction: (int(free * 0.9), free))


def test_a_stage_in_this_process_applies_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    init = json.dumps({**bench_shapes()["4b"], "vocab_size": 151936})
    overrides = ["model.device=cuda", "model.dtype=bfloat16", "sft.micro_batch_tokens=16384"]
    config = load_config("tiny-sft", [*overrides, f"model.init.config={init}"])
    # bf16 weights and AdamW moments in this process: about 120 GiB at 16,384 tokens
    _on_a_gpu(monkeypatch, 100 * GIB)
    planned, found = plan_stage_memory(config)
    assert found is not None
    assert found.estimate.total <= found.budget == 90 * GIB
    assert planned.sft is not None
    assert planned.sft.micro_batch_tokens == 8192
    assert not planned.model.gradient_checkpointing
    assert config.sft is not None
    assert config.sft.micro_batch_tokens == 16384  # the given config is not changed
    _on_a_gpu(monkeypatch, H200)
    assert plan_stage_memory(config)[0] == config  # fits as configured
    _on_a_gpu(monkeypatch, 20 * GIB)
    with pytest.raises(MemoryPlanError, match=r"change sft\.micro_batch_tokens"):
        plan_stage_memory(config)


def test_an_rl_stage_sharing_prompts_cannot_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    init = json.dumps({**bench_shapes()["4b"], "vocab_size": 151936})
    overrides = [
        "model.path=null",
        f"model.init={{config: {init}}}",
        "tokenizer.path=a-tokenizer",
        "model.device=cuda",
        "model.dtype=bfloat16",
        "rl.micro_batch_tokens=16384",
    ]
    config = load_config("tiny-rl", overrides)
    assert config.rl is not None
    assert config.rl.shared_prefix
    _on_a_gpu(monkeypatch, 50 * GIB)
    with pytest.raises(MemoryPlanError, match=r"\(with rl\.shared_prefix=false\)"):
        plan_stage_memory(config)
    unshared = load_config("tiny-rl", [*overrides, "rl.shared_prefix=false"])
    planned, found = plan_stage_memory(unshared)
    assert found is not None
    assert planned.model.gradient_checkpointing


def test_stages_off_cuda_or_with_planning_off_are_left_alone() -> None:
    config = load_config("tiny-sft")
    assert plan_stage_memory(config) == (config, None)  # on the CPU
    off = load_config("tiny-sft", ["model.device=cuda", "memory.plan=false"])
    assert plan_stage_memory(off) == (off, None)


def test_a_trainer_rank_turns_checkpointing_on_when_its_micro_batches_need_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model(seed=3)
    seqs = [TokenSequence(ids=list(range(1, 41)), mask=[0] * 5 + [1] * 35) for _ in range(4)]
    batches = micro_batches(seqs, 160, packing=True, pad_id=0, device=torch.device("cpu"))
    tiny = ModelShape.of(model)
    budget = estimate_peak(
        tiny,
        MemorySettings(weight_bytes=4, compute_bytes=4, micro_batch_tokens=160, shards=1,
                       gathered=True, checkpointing=True),
    ).total  # fmt: skip
    monkeypatch.setattr(ranks_module, "device_memory", lambda device, fraction: (budget, budget))
    rank = TrainerRank(0, threads=1)
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            fsdp=FSDPConfig(),
            optimizer=OptimizerConfig(lr=1e-3),
            schedule=ScheduleConfig(),
            total_steps=2,
        ),
        model,
    )
    try:
        assert not rank._model().is_gradient_checkpointing

        def loss(index: int, batch: Any, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
            return -(logprobs * batch.mask).sum(), {}

        update = rank.update(batches, loss, [0], 1, 1.0)
        assert rank._model().is_gradient_checkpointing
        assert update.startup["startup/first_step_s"] >= update.startup["startup/model_build_s"]
        assert rank.update(batches, loss, [0], 1, 1.0).startup == {}  # the first update only
        monkeypatch.setattr(ranks_module, "device_memory", lambda device, fraction: (1, 1))
        bigger = micro_batches(seqs * 2, 400, packing=True, pad_id=0, device=torch.device("cpu"))
        with pytest.raises(MemoryPlanError, match=r"placement\.trainer\.ranks"):
            rank.update(bigger, loss, [0], 1, 1.0)
    finally:
        rank.close()
