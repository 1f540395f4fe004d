"""aggregate and policy_loss ignore what masked positions hold: inf and NaN never leak through."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import LossAggregation, aggregate, policy_loss

MODES: tuple[LossAggregation, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
_NON_FINITE = (math.inf, -math.inf, math.nan)


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("token-mean", (1 + 2 + 3) / 3),
        ("seq-mean-token-mean", (1.5 + 3) / 2),
        ("seq-mean-token-sum-norm", (3 / 3 + 3 / 3) / 2),
    ],
)
def test_non_finite_values_at_masked_positions_do_not_reach_the_loss(
    agg: LossAggregation, expected: float
) -> None:
    values = torch.tensor([[1.0, 2.0, math.inf], [3.0, math.nan, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = aggregate(values, mask, agg)
    assert out.item() == pytest.approx(expected)
    out.backward()
    assert values.grad is not None
    assert torch.isfinite(values.grad).all()
    assert (values.grad[mask == 0] == 0).all()


finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@st.composite
def masked_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A finite batch, its mask, and the same batch with non-finite values where masked."""
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 6))
    values = torch.tensor(draw(st.lists(finite, min_size=rows * cols, max_size=rows * cols)))
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=rows * cols, max_size=rows * cols)))
    junk = torch.tensor(
        draw(st.lists(st.sampled_from(_NON_FINITE), min_size=rows * cols, max_size=rows * cols))
    )
    poisoned = torch.where(mask, values, junk)
    return values.view(rows, cols), mask.view(rows, cols), poisoned.view(rows, cols)


@settings(max_examples=60, deadline=None)
@given(masked_batches(), st.sampled_from(MODES), st.booleans())
def test_aggregate_depends_only_on_masked_in_values(
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], agg: LossAggregation, float_mask: bool
) -> None:
    clean, mask, poisoned = batch
    weights = mask.float() if float_mask else mask
    poisoned = poisoned.clone().requires_grad_(True)
    clean = clean.clone().requires_grad_(True)
    expected = aggregate(clean, weights, agg)
    got = aggregate(poisoned, weights, agg)
    torch.testing.assert_close(got, expected)
    got.backward()
    expected.backward()
    assert poisoned.grad is not None
    assert clean.grad is not None
    torch.testing.assert_close(poisoned.grad, clean.grad * mask)


@settings(max_examples=40, deadline=None)
@given(masked_batches(), st.sampled_from(MODES))
def test_policy_loss_and_its_gradient_ignore_non_finite_masked_log_probs(
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], agg: LossAggregation
) -> None:
    clean, mask, poisoned = batch
    # Log-probs are <= 0; the old ones differ a little so that some ratios clip.
    logprobs = -clean.abs() / 100
    old = logprobs * 0.9
    advantages = torch.linspace(-1, 1, clean.shape[0])
    runs = []
    for new, before in ((logprobs, old), (poisoned, poisoned.flip(-1))):
        leaf = torch.where(mask, logprobs, new).requires_grad_(True)
        out = policy_loss(leaf, torch.where(mask, old, before), advantages, mask, agg=agg)
        out.loss.backward()
        assert leaf.grad is not None
        assert torch.isfinite(leaf.grad).all()
        metrics = out.metrics()
        assert all(math.isfinite(value) for value in metrics.values()), metrics
        runs.append((out.loss.detach(), leaf.grad, metrics))
    (clean_loss, clean_grad, clean_metrics), (loss, grad, metrics) = runs
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad, clean_grad * mask)
    assert metrics == pytest.approx(clean_metrics)
