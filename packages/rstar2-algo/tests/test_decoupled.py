"""The decoupled objective: behaviour weights, their truncation and band, ESS, and the loss."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import behaviour_weights, ess_fraction, policy_loss


def batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(4, 7, generator=generator, dtype=torch.float64) * 3
    prox = logprobs + 0.3 * torch.randn(4, 7, generator=generator, dtype=torch.float64)
    advantages = torch.randn(4, generator=generator, dtype=torch.float64)
    mask = torch.rand(4, 7, generator=generator) > 0.3
    return logprobs.requires_grad_(), prox, advantages, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_unit_weights_give_exactly_the_unweighted_loss_and_gradient(
    agg: str, dual_clip: float | None
) -> None:
    logprobs, prox, advantages, mask = batch()
    plain = policy_loss(logprobs, prox, advantages, mask, agg=agg, dual_clip=dual_clip)  # type: ignore[arg-type]
    (plain_grad,) = torch.autograd.grad(plain.loss, logprobs)
    ones = torch.ones_like(prox)
    weighted = policy_loss(
        logprobs,
        prox,
        advantages,
        mask,
        agg=agg,  # type: ignore[arg-type]
        dual_clip=dual_clip,
        weights=ones,
    )
    (weighted_grad,) = torch.autograd.grad(weighted.loss, logprobs)
    assert torch.equal(plain.loss, weighted.loss)
    assert torch.equal(plain_grad, weighted_grad)
    assert plain.metrics() == weighted.metrics()


def test_on_policy_behaviour_weights_are_one_and_leave_the_loss_unchanged() -> None:
    logprobs, prox, advantages, mask = batch(1)
    weights = behaviour_weights(prox, prox.clone(), mask)
    assert torch.equal(weights.weights, torch.ones_like(prox))
    metrics = weights.stats.metrics()
    assert metrics == {
        "behaviour/weight_mean": 1.0,
        "behaviour/weight_max": 1.0,
        "behaviour/truncated_fraction": 0.0,
        "behaviour/masked_fraction": 0.0,
        "behaviour/ess": 1.0,
    }
    weighted = policy_loss(logprobs, prox, advantages, mask, weights=weights.weights)
    assert torch.equal(weighted.loss, policy_loss(logprobs, prox, advantages, mask).loss)


def test_hand_worked_truncation_band_and_ess() -> None:
    # pi_prox / pi_behav = 0.5, 1.5, 3.0, 0.05 on trained tokens; the last token is not trained.
    raw = [0.5, 1.5, 3.0, 0.05, 9.0]
    prox = torch.zeros(1, 5, dtype=torch.float64)
    behaviour = -torch.tensor([raw], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    capped = behaviour_weights(prox, behaviour, mask, cap=2.0)
    torch.testing.assert_close(
        capped.weights, torch.tensor([[0.5, 1.5, 2.0, 0.05, 1.0]], dtype=torch.float64)
    )
    metrics = capped.stats.metrics()
    assert metrics["behaviour/weight_mean"] == pytest.approx((0.5 + 1.5 + 3.0 + 0.05) / 4)
    assert metrics["behaviour/weight_max"] == pytest.approx(3.0)
    assert metrics["behaviour/truncated_fraction"] == pytest.approx(1 / 4)
    applied = [0.5, 1.5, 2.0, 0.05]
    ess = sum(applied) ** 2 / sum(w * w for w in applied) / 4
    assert metrics["behaviour/ess"] == pytest.approx(ess)
    banded = behaviour_weights(prox, behaviour, mask, cap=2.0, band=(0.1, 2.5))
    # 3.0 and 0.05 fall outside the band: weight 0, counted as masked, not truncated.
    torch.testing.assert_close(
        banded.weights, torch.tensor([[0.5, 1.5, 0.0, 0.0, 1.0]], dtype=torch.float64)
    )
    metrics = banded.stats.metrics()
    assert metrics["behaviour/masked_fraction"] == pytest.approx(2 / 4)
    assert metrics["behaviour/truncated_fraction"] == 0.0
    assert metrics["behaviour/ess"] == pytest.approx(2.0**2 / (0.25 + 2.25) / 4)


def test_weights_scale_each_tokens_loss() -> None:
    logprobs, prox, advantages, mask = batch(2)
    weights = torch.rand(prox.shape, dtype=torch.float64) * 2
    token = policy_loss(logprobs, prox, advantages, mask, agg="token-mean", token_count=1.0)
    # Token by token: the weighted loss is the sum of weight x unweighted loss.
    parts = []
    for i in range(prox.shape[0]):
        for j in range(prox.shape[1]):
            single = torch.zeros_like(mask)
            single[i, j] = mask[i, j]
            if single.any():
                one = policy_loss(logprobs, prox, advantages, single, token_count=1.0)
                parts.append(weights[i, j] * one.loss)
    weighted = policy_loss(logprobs, prox, advantages, mask, token_count=1.0, weights=weights)
    torch.testing.assert_close(weighted.loss, torch.stack(parts).sum())
    assert not torch.equal(weighted.loss, token.loss)


def test_stats_add_over_micro_batches_to_the_whole_batch() -> None:
    _, prox, _, mask = batch(3)
    behaviour = prox + 0.8 * torch.randn(prox.shape, dtype=torch.float64)
    whole = behaviour_weights(prox, behaviour, mask, cap=1.5, band=(0.05, 20.0)).stats.metrics()
    halves = [
        behaviour_weights(prox[rows], behaviour[rows], mask[rows], cap=1.5, band=(0.05, 20.0))
        for rows in (slice(0, 2), slice(2, 4))
    ]
    summed = (halves[0].stats + halves[1].stats).metrics()
    assert summed.keys() == whole.keys()
    for name, value in whole.items():
        assert summed[name] == pytest.approx(value), name


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=40),
    st.floats(min_value=0.5, max_value=5.0),
)
def test_weights_never_exceed_the_cap_and_ess_is_a_fraction(raw: list[float], cap: float) -> None:
    prox = torch.zeros(1, len(raw), dtype=torch.float64)
    behaviour = -torch.tensor([raw], dtype=torch.float64).log()
    result = behaviour_weights(prox, behaviour, torch.ones(1, len(raw)), cap=cap)
    assert float(result.weights.max()) <= cap + 1e-12
    ess = result.stats.metrics()["behaviour/ess"]
    assert 1 / len(raw) - 1e-9 <= ess <= 1 + 1e-9


def test_ess_fraction_edges() -> None:
    assert ess_fraction(4.0, 4.0, 4) == 1.0  # four weights of 1
    assert ess_fraction(1.0, 1.0, 4) == 0.25  # one weight of 1, three of 0
    assert ess_fraction(0.0, 0.0, 4) == 0.0
    assert math.isclose(ess_fraction(3.0, 5.0, 2), 0.9)  # weights 1 and 2


def test_bad_inputs_name_what_is_wrong() -> None:
    prox = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="behaviour_logprobs shape"):
        behaviour_weights(prox, torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="cap must be > 0"):
        behaviour_weights(prox, prox, torch.ones(2, 3), cap=0)
    with pytest.raises(ValueError, match="band must be"):
        behaviour_weights(prox, prox, torch.ones(2, 3), band=(2.0, 1.0))
    with pytest.raises(ValueError, match="weights shape"):
        policy_loss(prox, prox, torch.zeros(2), torch.ones(2, 3), weights=torch.ones(3))
