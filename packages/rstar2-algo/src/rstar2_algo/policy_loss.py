"""PPO clipped surrogate with clip-higher and optional dual clip (GRPO-RoC's only loss term)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from rstar2_algo.aggregation import Count, LossAggregation, aggregate
from rstar2_algo.kl import LOG_RATIO_LIMIT, kl_divergence


@dataclass(frozen=True)
class PolicyLoss:
    """The loss to backpropagate and detached 0-d metric tensors (token means over ``mask``).

    Metrics stay on the device so that computing them costs no host sync; call
    :meth:`metrics` when logging.
    """

    loss: torch.Tensor
    clip_fraction_low: torch.Tensor
    """Tokens with A < 0 and ratio < 1 - eps_low: the lower clip is active (no gradient)."""
    clip_fraction_high: torch.Tensor
    """Tokens with A > 0 and ratio > 1 + eps_high: the upper clip is active (no gradient)."""
    dual_clip_fraction: torch.Tensor
    """Tokens with A < 0 whose loss was capped at -A * dual_clip (0 without dual clip)."""
    approx_kl: torch.Tensor
    """k3 estimate of KL(pi_old || pi_theta)."""
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor

    def metrics(self, prefix: str = "actor/") -> dict[str, float]:
        names = [f.name for f in fields(self) if f.name != "loss"]
        # One stacked transfer instead of a host sync per metric.
        values = torch.stack([getattr(self, name).float() for name in names]).tolist()
        return {prefix + name: float(value) for name, value in zip(names, values, strict=True)}


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> torch.Tensor:
    """Validate; return advantages expanded to the token shape."""
    shape = tuple(logprobs.shape)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be 2-D [sequences, tokens], got shape {shape}")
    for name, tensor in (("old_logprobs", old_logprobs), ("mask", mask)):
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal logprobs shape {shape}"
            )
    if tuple(advantages.shape) == shape[:1]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    elif tuple(advantages.shape) != shape:
        raise ValueError(
            f"advantages must have shape {shape[:1]} (per sequence) or {shape} (per token), got "
            f"{tuple(advantages.shape)}"
        )
    if not 0 <= eps_low < 1:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if not eps_high >= 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 (a multiple of -A), got {dual_clip}")
    return advantages


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    agg: LossAggregation = "token-mean",
    token_count: Count | None = None,
    *,
    seq_count: Count | None = None,
    norm_length: int | None = None,
    weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """PPO-clip surrogate with clip-higher, aggregated over loss tokens.

    Per token, with ``r = exp(logprobs - old_logprobs)`` (log-ratio clamped to +/-20):
    ``L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; with ``dual_clip = c`` a token with
    ``A < 0`` has ``L = min(L, -c A)`` (Ye et al., 2020). No KL and no entropy term.

    Shapes: ``logprobs``, ``old_logprobs``, ``mask`` are ``[sequences, tokens]``; ``advantages``
    is ``[sequences]`` or ``[sequences, tokens]``. ``old_logprobs`` and ``advantages`` are treated
    as constants. ``agg``, ``token_count``, ``seq_count`` and ``norm_length`` are as in
    :func:`rstar2_algo.aggregate`.

    ``weights`` (same shape, constants) multiply each token's loss: the behaviour weights of the
    decoupled objective (:func:`rstar2_algo.behaviour_weights`), where ``old_logprobs`` are the
    proximal policy's. With every weight equal to 1 the loss is exactly the unweighted one.
    """
    if weights is not None and tuple(weights.shape) != tuple(logprobs.shape):
        raise ValueError(
            f"weights shape {tuple(weights.shape)} must equal logprobs shape "
            f"{tuple(logprobs.shape)}"
        )
    advantages = _check_inputs(
        logprobs, old_logprobs, advantages, mask, eps_low, eps_high, dual_clip
    ).detach()
    old_logprobs = old_logprobs.detach()
    # Masked positions (padding, tool tokens) may hold inf or NaN log-probs; selecting 0 there
    # before any arithmetic keeps the loss and the gradient of ``logprobs`` finite.
    selected = mask.bool()
    advantages = torch.where(selected, advantages, advantages.new_zeros(()))
    log_ratio = torch.where(selected, logprobs - old_logprobs, logprobs.new_zeros(()))
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    token_loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        capped = torch.minimum(token_loss, -advantages * dual_clip)
        token_loss = torch.where(advantages < 0, capped, token_loss)
    if weights is not None:
        token_loss = token_loss * weights.detach()
    loss = aggregate(
        token_loss, mask, agg, token_count=token_count, seq_count=seq_count, norm_length=norm_length
    )

    with torch.no_grad():
        weights = mask.to(ratio.dtype)

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            return aggregate(values.to(ratio.dtype), weights)

        negative, positive = advantages < 0, advantages > 0
        dual = (
            negative & (-advantages * dual_clip < torch.maximum(unclipped, clipped))
            if dual_clip is not None
            else torch.zeros_like(negative)
        )
        masked_ratio = torch.where(mask.bool(), ratio, torch.zeros_like(ratio))
        return PolicyLoss(
            loss=loss,
            clip_fraction_low=token_mean(negative & (ratio < 1 - eps_low)),
            clip_fraction_high=token_mean(positive & (ratio > 1 + eps_high)),
            dual_clip_fraction=token_mean(dual),
            approx_kl=token_mean(kl_divergence(torch.zeros_like(log_ratio), log_ratio, "k3")),
            ratio_mean=token_mean(ratio),
            ratio_max=masked_ratio.max() if masked_ratio.numel() else masked_ratio.sum(),
        )
