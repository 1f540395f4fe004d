"""The behaviour weight of the decoupled PPO objective (asynchronous RL with stale rollouts).

When rollouts are sampled by an older policy (the behaviour policy, ``pi_behav``) than the one
being updated, the clipped ratio is taken against the proximal policy ``pi_prox`` (the trainer's
log-probs recomputed at the start of the update) and each token's loss is multiplied by the
behaviour weight ``w = pi_prox / pi_behav``, truncated at a cap (Hilton et al., 2022, "Batch
size-invariance for policy optimization"; AReaL, Fu et al., 2025). An untruncated weight lets a
few tokens the old policy found unlikely dominate the update; the cap bounds that, as in
truncated importance sampling. Tokens whose raw weight falls outside an optional band can be
masked out of the loss altogether.

``policy_loss(..., weights=w)`` applies the weights; with every weight equal to 1 it returns
exactly the loss of ``policy_loss`` without weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rstar2_algo.kl import LOG_RATIO_LIMIT


@dataclass(frozen=True)
class WeightStats:
    """Sums over trained tokens that add up across micro-batches (call :meth:`metrics` once).

    Tensors stay on the device so that accumulating them costs no host sync.
    """

    tokens: torch.Tensor
    """Trained tokens (mask set)."""
    raw_sum: torch.Tensor
    """Sum of the untruncated weights pi_prox / pi_behav."""
    raw_max: torch.Tensor
    truncated: torch.Tensor
    """Tokens whose weight was cut to the cap."""
    masked: torch.Tensor
    """Tokens outside the band (weight 0)."""
    weight_sum: torch.Tensor
    """Sum of the applied weights (truncated, 0 where masked)."""
    weight_square_sum: torch.Tensor

    def __add__(self, other: WeightStats) -> WeightStats:
        return WeightStats(
            tokens=self.tokens + other.tokens,
            raw_sum=self.raw_sum + other.raw_sum,
            raw_max=torch.maximum(self.raw_max, other.raw_max),
            truncated=self.truncated + other.truncated,
            masked=self.masked + other.masked,
            weight_sum=self.weight_sum + other.weight_sum,
            weight_square_sum=self.weight_square_sum + other.weight_square_sum,
        )

    def metrics(self, prefix: str = "behaviour/") -> dict[str, float]:
        """Weight mean and max (untruncated), fractions truncated and masked, and the effective
        sample size of the applied weights as a fraction of the trained tokens."""
        values = torch.stack(
            [
                self.tokens,
                self.raw_sum,
                self.raw_max,
                self.truncated,
                self.masked,
                self.weight_sum,
                self.weight_square_sum,
            ]
        ).tolist()
        tokens, raw_sum, raw_max, truncated, masked, weight_sum, square_sum = values
        if tokens == 0:
            return {}
        return {
            prefix + "weight_mean": raw_sum / tokens,
            prefix + "weight_max": raw_max,
            prefix + "truncated_fraction": truncated / tokens,
            prefix + "masked_fraction": masked / tokens,
            prefix + "ess": ess_fraction(weight_sum, square_sum, tokens),
        }


def ess_fraction(weight_sum: float, square_sum: float, count: float) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` divided by ``count``: 1 when every
    weight is equal, down to ``1 / count`` when one token carries all the weight (0 when every
    weight is 0)."""
    if count <= 0 or square_sum <= 0:
        return 0.0
    return weight_sum * weight_sum / square_sum / count


@dataclass(frozen=True)
class BehaviourWeights:
    """Per-token weights for ``policy_loss(weights=...)`` and their statistics."""

    weights: torch.Tensor
    """``min(pi_prox / pi_behav, cap)`` on trained tokens inside the band; 0 outside the band;
    1 where the mask is not set (those tokens never reach the loss)."""
    stats: WeightStats


def behaviour_weights(
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
    band: tuple[float, float] | None = None,
) -> BehaviourWeights:
    """The truncated behaviour weight ``min(exp(prox - behav), cap)`` of every token.

    ``prox_logprobs`` are the trainer's log-probs of the sampled tokens at the start of the
    update, ``behaviour_logprobs`` the sampling log-probs the engine recorded, ``mask`` the
    trained tokens; all of one shape. With ``band = (low, high)`` a token whose untruncated
    weight lies outside ``[low, high]`` gets weight 0 (masked out of the loss). Both inputs are
    treated as constants.
    """
    shape = tuple(prox_logprobs.shape)
    for name, tensor in (("behaviour_logprobs", behaviour_logprobs), ("mask", mask)):
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"{name} shape {tuple(tensor.shape)} must equal prox_logprobs shape {shape}"
            )
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if band is not None and not 0 <= band[0] < band[1]:
        raise ValueError(f"band must be (low, high) with 0 <= low < high, got {band}")
    selected = mask.bool()
    log_weight = torch.where(
        selected, prox_logprobs.detach() - behaviour_logprobs.detach(), prox_logprobs.new_zeros(())
    ).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    raw = torch.exp(log_weight)
    truncated = selected & (raw > cap)
    weights = raw.clamp(max=cap)
    outside = torch.zeros_like(selected)
    if band is not None:
        outside = selected & ((raw < band[0]) | (raw > band[1]))
        weights = torch.where(outside, weights.new_zeros(()), weights)
    weights = torch.where(selected, weights, weights.new_ones(()))
    applied = torch.where(selected, weights, weights.new_zeros(()))
    counted = selected.to(raw.dtype)
    stats = WeightStats(
        tokens=counted.sum(),
        raw_sum=(raw * counted).sum(),
        raw_max=torch.where(selected, raw, raw.new_zeros(())).max()
        if raw.numel()
        else raw.new_zeros(()),
        truncated=(truncated & ~outside).to(raw.dtype).sum(),
        masked=outside.to(raw.dtype).sum(),
        weight_sum=applied.sum(),
        weight_square_sum=(applied * applied).sum(),
    )
    return BehaviourWeights(weights=weights, stats=stats)
