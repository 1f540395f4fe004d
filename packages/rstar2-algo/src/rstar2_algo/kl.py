"""Per-token KL estimators (k1, k2, k3) for metrics; rstar2's loss has no KL term."""

from __future__ import annotations

from typing import Literal, get_args

import torch

KLEstimator = Literal["k1", "k2", "k3"]

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to +/- this before exponentiation, so exp never overflows."""


def kl_divergence(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from ``pi``.

    With ``log r = ref_logprobs - logprobs``: ``k1 = -log r`` (unbiased, can be negative),
    ``k2 = (log r)^2 / 2`` (biased, low variance), ``k3 = (r - 1) - log r`` (unbiased,
    non-negative). Reduce with :func:`rstar2_algo.aggregate` over the loss mask.
    """
    if estimator not in get_args(KLEstimator):
        raise ValueError(f"estimator must be one of {get_args(KLEstimator)}, got {estimator!r}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs shape {tuple(ref_logprobs.shape)} must equal logprobs shape "
            f"{tuple(logprobs.shape)}"
        )
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    return torch.expm1(log_ratio) - log_ratio
