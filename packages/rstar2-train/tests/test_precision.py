"""One mixed-precision policy on every trainer path: float32 master weights and AdamW moments,
bf16 compute, gradients accumulated in float32; the in-process actor and an FSDP2 rank take the
same step, and a checkpoint keeps the masters."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from models import tiny_model
from pydantic import ValidationError

from rstar2_train import TokenSequence, load_config, micro_batches
from rstar2_train.actor import Actor
from rstar2_train.config.loader import ConfigError
from rstar2_train.config.schema import FSDPConfig, MemoryConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port
from rstar2_train.precision import MASTER_STATE, Precision

MIXED = Precision(compute=torch.bfloat16, master=torch.float32)
PURE_BF16 = Precision(compute=torch.bfloat16, master=torch.bfloat16)
OPTIMIZER = OptimizerConfig(lr=1e-2, grad_clip=1.0)


def sequences() -> list[TokenSequence]:
    generator = torch.Generator().manual_seed(5)
    found = []
    for length in (23, 17, 31, 9, 26):
        ids = torch.randint(1, 97, (length,), generator=generator).tolist()
        found.append(TokenSequence(ids=ids, mask=[0] * 4 + [1] * (length - 4)))
    return found


def batches() -> list[Any]:
    # Several micro-batches, so gradients accumulate over them.
    return micro_batches(sequences(), 48, packing=True, pad_id=0, device=torch.device("cpu"))


def loss_fn(total: int) -> Any:
    def loss(index: int, batch: Any, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return -(logprobs * batch.mask).sum() / total, {}

    return loss


def trained_tokens() -> int:
    return sum(b.tokens for b in batches())


def rank(model: torch.nn.Module, precision: Precision) -> TrainerRank:
    trainer = TrainerRank(0, threads=1)
    trainer.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            fsdp=FSDPConfig(),
            optimizer=OPTIMIZER,
            schedule=ScheduleConfig(),
            total_steps=4,
            precision=precision,
            memory=MemoryConfig(plan=False),
        ),
        model,  # type: ignore[arg-type]
    )
    return trainer


@pytest.mark.parametrize("tied", [False, True])
def test_the_in_process_actor_and_a_trainer_rank_take_the_same_mixed_step(tied: bool) -> None:
    model = tiny_model(seed=1, tied=tied)
    actor = Actor(copy.deepcopy(model), OPTIMIZER, ScheduleConfig(), total_steps=4, precision=MIXED)
    trainer = rank(copy.deepcopy(model), MIXED)
    try:
        for _ in range(2):
            ours = actor.update(batches(), loss_fn(trained_tokens()))
            theirs = trainer.update(
                batches(),
                loss_fn(trained_tokens()),
                list(range(len(batches()))),
                len(batches()),
                1.0,
            )
            assert ours.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-5)
        assert actor.masters is not None
        masters = actor.masters.state_dict()
        sharded = trainer.full_weights()
        assert set(masters) <= set(sharded)
        for name, weight in masters.items():
            assert weight.dtype == sharded[name].dtype == torch.float32
            torch.testing.assert_close(weight, sharded[name], rtol=1e-5, atol=1e-6)
        # The weights that compute are the masters rounded to bf16, on both paths.
        for name, weight in actor.model.state_dict().items():
            assert weight.dtype == torch.bfloat16
            if name in masters:
                assert torch.equal(weight, masters[name].to(torch.bfloat16))
    finally:
        trainer.close()


def test_the_compute_weights_are_bf16_and_the_optimizer_updates_float32_masters() -> None:
    actor = Actor(tiny_model(seed=2), OPTIMIZER, ScheduleConfig(), total_steps=4, precision=MIXED)
    assert all(p.dtype == torch.bfloat16 for p in actor.model.parameters())
    actor.update(batches(), loss_fn(trained_tokens()))
    optimized = [p for group in actor.optimizer.param_groups for p in group["params"]]
    assert all(p.dtype == torch.float32 for p in optimized)
    moments = [s["exp_avg_sq"] for s in actor.optimizer.state.values()]
    assert moments
    assert all(m.dtype == torch.float32 for m in moments)
    # Compute-dtype gradients were added to the masters as they arrived, none are kept.
    assert all(p.grad is None for p in actor.model.parameters())


def test_master_weights_keep_the_updates_that_bf16_weights_round_away() -> None:
    small = OptimizerConfig(lr=1e-5, grad_clip=None, weight_decay=0.0)
    model = tiny_model(seed=3)
    mixed = Actor(copy.deepcopy(model), small, ScheduleConfig(), total_steps=4, precision=MIXED)
    pure = Actor(copy.deepcopy(model), small, ScheduleConfig(), total_steps=4, precision=PURE_BF16)
    before = {n: p.detach().clone() for n, p in pure.model.named_parameters()}
    assert mixed.masters is not None
    masters_before = {n: t.clone() for n, t in mixed.masters.state_dict().items()}
    for _ in range(3):
        mixed.update(batches(), loss_fn(trained_tokens()))
        pure.update(batches(), loss_fn(trained_tokens()))

    # An update of lr 1e-5 is below half of bf16's rounding step for any weight larger than
    # about 3e-3 in magnitude: pure bf16 weights keep almost every element (only those near zero
    # move); the masters move nearly everywhere.
    def moved_share(now: dict[str, torch.Tensor], then: dict[str, torch.Tensor]) -> float:
        changed = sum(int((now[n] != then[n]).sum()) for n in now if now[n].dim() >= 2)
        return changed / sum(now[n].numel() for n in now if now[n].dim() >= 2)

    pure_now = {n: p.detach() for n, p in pure.model.named_parameters()}
    assert moved_share(pure_now, before) < 0.2
    assert moved_share(mixed.masters.state_dict(), masters_before) > 0.95


def test_a_checkpoint_keeps_the_masters_and_a_resumed_step_equals_the_uninterrupted_one() -> None:
    model = tiny_model(seed=4)
    running = Actor(model, OPTIMIZER, ScheduleConfig(), total_steps=4, precision=MIXED)
    running.update(batches(), loss_fn(trained_tokens()))
    saved = copy.deepcopy(running.optimizer_state())
    assert set(saved[MASTER_STATE]) == {n for n, _ in running.model.named_parameters()}
    # What a resumed stage loads: the checkpoint's bf16 weights, then the optimizer state.
    exported = copy.deepcopy(running.export_model())
    resumed = Actor(exported, OPTIMIZER, ScheduleConfig(), total_steps=4, precision=MIXED)
    resumed.load_optimizer_state(saved, resume=True)
    assert resumed.masters is not None
    assert running.masters is not None
    for name, weight in running.masters.state_dict().items():
        assert torch.equal(resumed.masters.state_dict()[name], weight)
    running.update(batches(), loss_fn(trained_tokens()))
    resumed.update(batches(), loss_fn(trained_tokens()))
    for name, weight in running.masters.state_dict().items():
        assert torch.equal(resumed.masters.state_dict()[name], weight), name


def test_a_trainer_rank_saves_and_restores_its_masters() -> None:
    model = tiny_model(seed=6)
    first = rank(copy.deepcopy(model), MIXED)
    try:
        first.update(
            batches(), loss_fn(trained_tokens()), list(range(len(batches()))), len(batches()), 1.0
        )
        state = first.optimizer_state()
        weights = first.full_weights()
    finally:
        first.close()
    assert state is not None
    masters = state[MASTER_STATE]
    assert all(t.dtype == torch.float32 for t in masters.values())
    # A fresh rank from bf16-rounded weights gets the float32 masters back.
    second = rank(copy.deepcopy(model).to(torch.bfloat16), MIXED)
    try:
        second.load_optimizer_state(state, resume=True)
        restored = second.full_weights()
    finally:
        second.close()
    for name in masters:
        assert torch.equal(restored[name], weights[name]), name


def test_the_stage_config_sets_one_policy_and_refuses_the_old_fsdp_setting() -> None:
    config = load_config("tiny-sft", ["model.dtype=bfloat16"])
    assert Precision.of(config) == MIXED
    pure = load_config("tiny-sft", ["model.dtype=bfloat16", "model.master_dtype=bfloat16"])
    assert not Precision.of(pure).mixed
    with pytest.raises(ConfigError, match="master_dtype: bfloat16 cannot hold the float32"):
        load_config("tiny-sft", ["model.dtype=float32", "model.master_dtype=bfloat16"])
    with pytest.raises(ValidationError, match=r"param_dtype is no longer an FSDP setting"):
        FSDPConfig.model_validate({"param_dtype": "bfloat16"})


def test_a_rank_gathers_its_weights_in_the_compute_dtype_for_engines_and_checkpoints() -> None:
    trainer = rank(tiny_model(seed=6, tied=True), MIXED)
    try:
        trainer.update(batches(), loss_fn(trained_tokens()), list(range(len(batches()))),
                       len(batches()), 1.0)  # fmt: skip
        masters = trainer.full_weights()
        sent = trainer.full_weights(torch.bfloat16)
    finally:
        trainer.close()
    assert set(sent) == set(masters)
    assert {t.dtype for t in masters.values()} == {torch.float32}
    for name, tensor in sent.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, masters[name].to(torch.bfloat16)), name
    # The tied head and the embedding are one tensor, gathered once.
    assert sent["lm_head.weight"] is sent["model.embed_tokens.weight"]
