"""policy_loss: the clip-higher PPO surrogate, its aggregation modes and its metrics."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import aggregate, policy_loss


def log(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).log()


def test_hand_worked_clip_higher_example() -> None:
    # One sequence of five tokens, old log-probs 0 so ratio = exp(logprobs).
    # A=+1: ratio 1.5 -> clipped at 1.28 -> loss -1.28; ratio 0.5 -> unclipped -0.5.
    # A=-1: ratio 0.5 -> clipped at 0.8 -> loss 0.8; ratio 2.0 -> unclipped 2.0.
    # The fifth token is masked out.
    ratios = [1.5, 0.5, 0.5, 2.0, 9.0]
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = policy_loss(log(ratios)[None], torch.zeros(1, 5, dtype=torch.float64), advantages, mask)
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 2.0) / 4)
    assert out.clip_fraction_high.item() == pytest.approx(1 / 4)
    assert out.clip_fraction_low.item() == pytest.approx(1 / 4)
    assert out.ratio_mean.item() == pytest.approx((1.5 + 0.5 + 0.5 + 2.0) / 4)
    assert out.ratio_max.item() == pytest.approx(2.0)
    assert out.dual_clip_fraction.item() == 0.0


def test_dual_clip_caps_negative_advantage_losses() -> None:
    # A=-2, ratio 5: PPO loss 10, dual clip c=3 caps it at 6. A=+2, ratio 5 stays clipped at
    # -2 * 1.28. A=-2, ratio 2: 4 < 6, untouched.
    ratios = [5.0, 5.0, 2.0]
    advantages = torch.tensor([[-2.0, 2.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    old = torch.zeros(1, 3, dtype=torch.float64)
    plain = policy_loss(log(ratios)[None], old, advantages, mask)
    dual = policy_loss(log(ratios)[None], old, advantages, mask, dual_clip=3.0)
    assert plain.loss.item() == pytest.approx((10.0 - 2.56 + 4.0) / 3)
    assert dual.loss.item() == pytest.approx((6.0 - 2.56 + 4.0) / 3)
    assert dual.dual_clip_fraction.item() == pytest.approx(1 / 3)


def test_per_sequence_advantages_broadcast_over_tokens() -> None:
    logprobs = torch.randn(3, 4, dtype=torch.float64)
    old = logprobs + 0.1 * torch.randn(3, 4, dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 0.0], dtype=torch.float64)
    mask = torch.ones(3, 4)
    per_seq = policy_loss(logprobs, old, advantages, mask)
    per_token = policy_loss(logprobs, old, advantages[:, None].expand(3, 4), mask)
    torch.testing.assert_close(per_seq.loss, per_token.loss)


def reference_loss(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> torch.Tensor:
    """Textbook PPO objective written the other way round: -min(r A, clip(r) A)."""
    ratio = torch.exp(logprobs - old)
    objective = torch.min(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)
    if dual_clip is not None:
        objective = torch.where(
            advantages < 0, torch.max(objective, dual_clip * advantages), objective
        )
    return -(objective * mask).sum() / mask.sum()


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 7),
    st.integers(0, 2**31),
    st.sampled_from([None, 2.0, 3.0]),
)
def test_gradients_match_autograd_of_the_textbook_formula(
    sequences: int, tokens: int, seed: int, dual_clip: float | None
) -> None:
    generator = torch.Generator().manual_seed(seed)
    shape = (sequences, tokens)
    logprobs = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    old = logprobs + 0.6 * torch.randn(shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(sequences, generator=generator, dtype=torch.float64)[:, None]
    advantages = advantages.expand(shape).contiguous()
    mask = (torch.rand(shape, generator=generator) < 0.8).to(torch.float64)
    mask[0, 0] = 1.0
    ours = logprobs.clone().requires_grad_()
    theirs = logprobs.clone().requires_grad_()
    loss = policy_loss(ours, old, advantages, mask, 0.2, 0.28, dual_clip).loss
    expected = reference_loss(theirs, old, advantages, mask, 0.2, 0.28, dual_clip)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    assert ours.grad is not None
    assert theirs.grad is not None
    torch.testing.assert_close(ours.grad, theirs.grad)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(1, 9),
    st.integers(0, 2**31),
    st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
)
def test_micro_batches_with_global_counts_equal_the_full_batch(
    sequences: int, tokens: int, seed: int, agg: str
) -> None:
    generator = torch.Generator().manual_seed(seed)
    shape = (sequences, tokens)
    logprobs = -torch.rand(shape, generator=generator, dtype=torch.float64)
    old = logprobs + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(sequences, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape, generator=generator) < 0.7
    mask[:, 0] = True  # every sequence has a loss token, so sequence counts are unambiguous

    full_input = logprobs.clone().requires_grad_()
    full = policy_loss(full_input, old, advantages, mask, agg=agg)  # type: ignore[arg-type]
    full.loss.backward()

    counts: dict[str, object] = (
        {"token_count": int(mask.sum())} if agg == "token-mean" else {"seq_count": sequences}
    )
    if agg == "seq-mean-token-sum-norm":
        counts["norm_length"] = tokens
    micro_input = logprobs.clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    split = sequences // 2
    for rows in (slice(0, split), slice(split, sequences)):
        # Each micro-batch is trimmed to its own longest loss token, as a packer would.
        width = int(mask[rows].nonzero()[:, 1].max()) + 1
        part = policy_loss(
            micro_input[rows, :width],
            old[rows, :width],
            advantages[rows],
            mask[rows, :width],
            agg=agg,
            **counts,  # type: ignore[arg-type]
        )
        part.loss.backward()
        total = total + part.loss.detach()
    torch.testing.assert_close(total, full.loss.detach())
    assert micro_input.grad is not None
    assert full_input.grad is not None
    torch.testing.assert_close(micro_input.grad, full_input.grad)


def test_aggregation_modes_on_a_worked_example() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(values, mask).item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    sum_norm = aggregate(values, mask, "seq-mean-token-sum-norm")
    assert sum_norm.item() == pytest.approx((6 / 4 + 4 / 4) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=8).item() == (
        pytest.approx((6 / 8 + 4 / 8) / 2)
    )
    assert aggregate(values, mask, token_count=20).item() == pytest.approx(0.5)
    assert aggregate(values, mask, token_count=torch.tensor(20.0)).item() == pytest.approx(0.5)


def test_empty_mask_gives_zero_loss_with_a_gradient() -> None:
    logprobs = torch.zeros(2, 3, requires_grad=True)
    out = policy_loss(logprobs, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad == 0).all()


def test_extreme_log_ratios_stay_finite() -> None:
    logprobs = torch.tensor([[0.0, -200.0]], requires_grad=True)
    old = torch.tensor([[-200.0, 0.0]])
    out = policy_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert logprobs.grad is not None
    assert torch.isfinite(logprobs.grad).all()
    assert all(v == v for v in out.metrics().values())  # no NaN metric


def test_metrics_are_detached_floats_with_a_prefix() -> None:
    logprobs = torch.zeros(1, 2, requires_grad=True)
    out = policy_loss(logprobs, torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2))
    assert not out.approx_kl.requires_grad
    metrics = out.metrics()
    assert set(metrics) == {
        "actor/clip_fraction_low",
        "actor/clip_fraction_high",
        "actor/dual_clip_fraction",
        "actor/approx_kl",
        "actor/ratio_mean",
        "actor/ratio_max",
    }
    assert metrics["actor/ratio_mean"] == 1.0
    assert metrics["actor/approx_kl"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"old_logprobs": torch.zeros(2, 4)}, r"old_logprobs shape \(2, 4\)"),
        ({"mask": torch.ones(3)}, "mask shape"),
        ({"advantages": torch.zeros(3)}, r"advantages must have shape \(2,\)"),
        ({"logprobs": torch.zeros(6)}, "must be 2-D"),
        ({"eps_low": 1.0}, "eps_low must be in"),
        ({"eps_high": -0.1}, "eps_high must be"),
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
        ({"agg": "sum"}, "agg must be one of"),
        ({"token_count": 0}, "token_count must be > 0"),
        ({"agg": "seq-mean-token-mean", "token_count": 4}, "takes seq_count"),
        ({"seq_count": 2}, "token-mean takes token_count"),
    ],
)
def test_bad_input_is_rejected(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "logprobs": torch.zeros(2, 3),
        "old_logprobs": torch.zeros(2, 3),
        "advantages": torch.zeros(2),
        "mask": torch.ones(2, 3),
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss(**arguments)  # type: ignore[arg-type]
