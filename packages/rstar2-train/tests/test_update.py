"""The RL update: accumulation over micro-batches, advantage direction, TIS, mini-batches."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from models import reference_logprobs, tiny_model

from rstar2_train import Actor, TokenSequence, load_config
from rstar2_train.actor import MetricSums
from rstar2_train.config import RLConfig
from rstar2_train.rl.update import ENGINE_LOGPROBS, policy_update


def rl_config(*overrides: str) -> RLConfig:
    config = load_config("tiny-rl", list(overrides)).rl
    assert config is not None
    return config


def rollouts(
    model: torch.nn.Module, count: int, *, engine_shift: float = 0.0
) -> list[TokenSequence]:
    """Sequences of a 6-token prompt and a response, with the model's own log-probs as the
    engine's (shifted by ``engine_shift``)."""
    rng = random.Random(0)
    out = []
    for _ in range(count):
        ids = [rng.randrange(1, 97) for _ in range(6 + rng.randrange(4, 12))]
        mask = [0] * 6 + [1] * (len(ids) - 6)
        own = [0.0, *reference_logprobs(model, ids).tolist()]
        engine = [lp + engine_shift if m else 0.0 for lp, m in zip(own, mask, strict=True)]
        out.append(TokenSequence(ids=ids, mask=mask, token_values={ENGINE_LOGPROBS: engine}))
    return out


def actor(seed: int = 0, *, grad_clip: float | None = None, lr: float = 1e-2) -> Actor:
    clip = "null" if grad_clip is None else str(grad_clip)
    config = load_config(
        "tiny-rl",
        [f"optimizer.lr={lr}", f"optimizer.grad_clip={clip}", "schedule.warmup_steps=0"],
    )
    return Actor(tiny_model(seed=seed), config.optimizer, config.schedule, total_steps=10)


def response_logprob(model: torch.nn.Module, sequence: TokenSequence) -> float:
    return float(reference_logprobs(model, sequence.ids)[5:].sum())


def test_micro_batching_does_not_change_the_gradient() -> None:
    grads = []
    for budget in (10_000, 20):  # one micro-batch, or one per sequence
        trainer = actor()
        seqs = rollouts(trainer.model, 6)
        config = rl_config(f"rl.micro_batch_tokens={budget}")
        metrics = policy_update(
            trainer,
            seqs,
            [1.0, -1.0, 0.5, -0.5, 2.0, -2.0],
            config,
            temperature=1.0,
            pad_id=0,
            seed=0,
        )
        assert metrics["actor/mini_batches"] == 1
        # The step leaves the accumulated (unclipped) gradient in place.
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-7)


def test_positive_advantage_raises_the_sequence_and_negative_lowers_it() -> None:
    trainer = actor(lr=1e-3)
    seqs = rollouts(trainer.model, 2)
    before = [response_logprob(trainer.model, s) for s in seqs]
    metrics = policy_update(
        trainer, seqs, [1.0, -1.0], rl_config(), temperature=1.0, pad_id=0, seed=0
    )
    after = [response_logprob(trainer.model, s) for s in seqs]
    assert after[0] > before[0]
    assert after[1] < before[1]
    # On-policy: the engine's log-probs are the trainer's, so the first ratio is exactly 1.
    assert metrics["mismatch/logprob_abs_max"] < 1e-5
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/clip_fraction_high"] == metrics["actor/clip_fraction_low"] == 0.0


def test_truncated_importance_sampling_weights_the_gradient() -> None:
    norms = {}
    for name, shift, cap in (("plain", 1.0, None), ("tis", 1.0, 10.0)):
        trainer = actor()
        # The engine was more confident than the trainer by 1 nat on every token.
        seqs = rollouts(trainer.model, 3, engine_shift=1.0)
        overrides = [] if cap is None else [f"rl.loss.tis_cap={cap}"]
        metrics = policy_update(
            trainer,
            seqs,
            [1.0, -1.0, 0.5],
            rl_config(*overrides),
            temperature=1.0,
            pad_id=0,
            seed=0,
        )
        assert metrics["mismatch/logprob_abs_mean"] == pytest.approx(shift, abs=1e-5)
        norms[name] = metrics["actor/grad_norm"]
    # Every token's weight is min(exp(-1), 10) = e^-1: the gradient shrinks by that factor.
    assert norms["tis"] / norms["plain"] == pytest.approx(math.exp(-1.0), rel=1e-3)


def test_several_mini_batches_take_several_optimizer_steps() -> None:
    trainer = actor()
    seqs = rollouts(trainer.model, 8)
    metrics = policy_update(
        trainer,
        seqs,
        [1.0, -1.0] * 4,
        rl_config("rl.ppo_mini_batches=4"),
        temperature=1.0,
        pad_id=0,
        seed=0,
    )
    assert metrics["actor/mini_batches"] == 4
    assert trainer.schedule.last_epoch == 4
    # Later mini-batches see a policy that already moved: ratios leave 1.
    assert metrics["actor/ratio_max"] > 1.0


def test_on_policy_update_reuses_its_forward_pass_and_matches_a_separate_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One mini-batch without TIS takes the old log-probs from the update's own forward pass:
    no extra pass, and the same gradient and mismatch metrics as with a separate one (TIS with
    a cap no weight reaches forces that pass; the weights are exp(~0) = 1)."""
    grads, mismatch, passes = [], [], []
    for overrides in ([], ["rl.loss.tis_cap=1000.0"]):
        trainer = actor(grad_clip=1e9)
        seqs = rollouts(trainer.model, 6, engine_shift=0.25)
        calls: list[int] = []

        def counted(
            *args: Any, calls: list[int] = calls, inner: Any = trainer.logprobs, **kwargs: Any
        ) -> Any:
            calls.append(1)
            return inner(*args, **kwargs)

        monkeypatch.setattr(trainer, "logprobs", counted)
        config = rl_config("rl.micro_batch_tokens=40", *overrides)
        metrics = policy_update(
            trainer,
            seqs,
            [1.0, -1.0, 0.5, -0.5, 2.0, -2.0],
            config,
            temperature=1.0,
            pad_id=0,
            seed=0,
        )
        passes.append(len(calls))
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
        mismatch.append(
            [metrics[f"mismatch/{name}"] for name in ("logprob_abs_mean", "logprob_abs_max")]
        )
    assert passes == [0, 1]
    # TIS weights exp(-0.25) shrink the separate pass's gradient uniformly.
    assert torch.allclose(grads[0] * math.exp(-0.25), grads[1], atol=1e-6)
    assert mismatch[0] == pytest.approx([0.25, 0.25], abs=1e-5)
    assert mismatch[1] == pytest.approx(mismatch[0], abs=1e-6)


def test_metric_sums_weight_means_by_tokens_and_keep_maxima() -> None:
    rank = MetricSums()
    rank.add({"loss": 1.0, "gap_max": 0.5}, tokens=3)
    rank.add({"loss": 3.0, "gap_max": 0.2}, tokens=1)
    driver = MetricSums()
    driver.add(rank.values)
    driver.add(MetricSums({"loss": 2.0 * 4, "gap_max": 0.7}).values)
    # (1 x 3 + 3 x 1) from the rank, 2 x 4 from another: 14 over 8 tokens.
    assert driver.means(8) == {"loss": pytest.approx(1.75), "gap_max": 0.7}
    assert driver.means(0) == {}
