"""kl_divergence: the three per-token estimators against an exact KL."""

import pytest
import torch

from rstar2_algo import kl_divergence


def test_estimators_match_the_exact_kl_of_two_categoricals() -> None:
    generator = torch.Generator().manual_seed(0)
    policy = torch.softmax(torch.randn(6, generator=generator, dtype=torch.float64), -1)
    reference = torch.softmax(torch.randn(6, generator=generator, dtype=torch.float64), -1)
    exact = (policy * (policy / reference).log()).sum().item()
    samples = torch.multinomial(policy, 200_000, replacement=True, generator=generator)
    logprobs, ref_logprobs = policy.log()[samples], reference.log()[samples]
    for estimator in ("k1", "k3"):  # unbiased
        estimate = kl_divergence(logprobs, ref_logprobs, estimator).mean().item()
        assert estimate == pytest.approx(exact, rel=0.05)
    k3 = kl_divergence(logprobs, ref_logprobs, "k3")
    assert (k3 >= 0).all()
    # k2 is biased, but close for nearby distributions and always non-negative.
    k2 = kl_divergence(logprobs, ref_logprobs, "k2")
    assert (k2 >= 0).all()
    assert k2.mean().item() == pytest.approx(exact, rel=0.5)


def test_identical_policies_have_zero_kl() -> None:
    logprobs = -torch.rand(3, 4)
    for estimator in ("k1", "k2", "k3"):
        assert (kl_divergence(logprobs, logprobs, estimator) == 0).all()  # type: ignore[arg-type]


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="estimator must be one of"):
        kl_divergence(torch.zeros(2), torch.zeros(2), "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ref_logprobs shape \(3,\)"):
        kl_divergence(torch.zeros(2), torch.zeros(3))
