"""Reduce per-token values (losses, entropies) to a scalar under one of three conventions."""

from __future__ import annotations

from typing import get_args

import torch

from rstar2_algo.aggregation_modes import LossAggregation as LossAggregation

Count = int | float | torch.Tensor


def _check_count(name: str, value: Count | None) -> None:
    if isinstance(value, int | float) and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAggregation = "token-mean",
    *,
    token_count: Count | None = None,
    seq_count: Count | None = None,
    norm_length: int | None = None,
) -> torch.Tensor:
    """Aggregate ``values`` over the positions where ``mask`` is set.

    ``values`` and ``mask`` share a shape; the sequence modes need 2-D ``[sequences, tokens]``.
    The mask may be bool or 0/1 floats; values where it is not set never reach the result or its
    gradient, whatever they are (``inf`` and ``NaN`` included). Normalisers default to this
    batch's own (tokens with mask set; sequences with at least one such token; ``norm_length`` =
    the padded length), and an empty mask gives 0 rather than NaN. A data-parallel or
    gradient-accumulating trainer passes the global ``token_count`` (token-mean) or
    ``seq_count`` (sequence modes), and a constant ``norm_length`` (the response budget), so the
    sum of micro-batch losses equals the loss of the whole batch. Counts may be tensors (e.g.
    all-reduced) to avoid a device sync.
    """
    if agg not in get_args(LossAggregation):
        raise ValueError(f"agg must be one of {get_args(LossAggregation)}, got {agg!r}")
    if values.shape != mask.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal values shape {tuple(values.shape)}"
        )
    _check_count("token_count", token_count)
    _check_count("seq_count", seq_count)
    if norm_length is not None and norm_length < 1:
        raise ValueError(f"norm_length must be >= 1, got {norm_length}")
    weights = mask.to(values.dtype)
    # Select rather than multiply: 0 * inf and 0 * NaN are NaN, and masked positions routinely
    # hold non-finite values (padding logits, an overflowed ratio). ``where`` also sends a zero
    # gradient, never NaN, to the positions it does not select.
    masked = torch.where(mask.bool(), values, values.new_zeros(()))

    if agg == "token-mean":
        if seq_count is not None or norm_length is not None:
            raise ValueError("token-mean takes token_count; seq_count/norm_length do not apply")
        denominator = weights.sum().clamp(min=1) if token_count is None else token_count
        return masked.sum() / denominator

    if token_count is not None:
        raise ValueError(f"{agg} takes seq_count; token_count applies to token-mean only")
    if values.dim() != 2:
        raise ValueError(
            f"{agg} needs 2-D [sequences, tokens] values, got shape {tuple(values.shape)}"
        )
    tokens = weights.sum(dim=-1)
    if agg == "seq-mean-token-mean":
        if norm_length is not None:
            raise ValueError("norm_length applies to seq-mean-token-sum-norm only")
        per_sequence = masked.sum(dim=-1) / tokens.clamp(min=1)
    else:
        per_sequence = masked.sum(dim=-1) / (
            values.shape[-1] if norm_length is None else norm_length
        )
    if seq_count is None:
        return per_sequence.sum() / (tokens > 0).sum().clamp(min=1)
    return per_sequence.sum() / seq_count
