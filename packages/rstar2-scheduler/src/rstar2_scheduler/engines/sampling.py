"""Sampling one token per row from logits, with the log-prob the trainer will recompute."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import torch

from rstar2_scheduler.engine import SamplingParams


class Sampled(NamedTuple):
    """One token per row, its log-prob and, for rows that asked (``return_support``), its
    support: the ids the row's sampler could draw (empty: the whole vocabulary)."""

    tokens: list[int]
    logprobs: list[float]
    support: list[tuple[int, ...] | None]


def sample_next(
    logits: torch.Tensor, samplings: Sequence[SamplingParams], rngs: Sequence[random.Random]
) -> Sampled:
    """One token per row of ``logits`` ``[rows, vocab]`` under each row's ``samplings``.

    The log-prob is the log-softmax of the temperature-scaled logits at the sampled token (of the
    plain logits when greedy, temperature 0): what the trainer recomputes for the same tokens.
    Top-k, then top-p over what top-k keeps (vLLM's order), restrict which tokens can be drawn;
    the reported log-prob is renormalised over them only for rows with ``return_support``, which
    also get the ids kept, so a trainer renormalising over the same ids recomputes it exactly.

    Each row draws one uniform number per token from its own ``rngs`` entry and takes the token
    where it falls in the row's cumulative distribution (inverse-CDF sampling), so a row's tokens
    depend on its seed alone, never on its batch or device, and the draw is one batched op: one
    ``torch.multinomial`` per row with its own generator was an eighth of a small model's decode
    step at 32 rows.
    """
    vocab = logits.shape[-1]
    device = logits.device
    temperatures = [s.temperature for s in samplings]
    scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
    log_probs = torch.log_softmax(logits.float() / scale.to(device).unsqueeze(-1), dim=-1)
    probs = log_probs.exp()
    kept = _kept(probs, samplings)
    if kept is not None:
        probs = probs.masked_fill(~kept, 0.0)
    # Uniforms from every row's stream, greedy rows included, so a row's stream advances one
    # number per token whatever its settings.
    uniform = torch.tensor([rng.random() for rng in rngs], dtype=torch.float64, device=device)
    cdf = probs.double().cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=vocab - 1)
    greedy = torch.tensor([t == 0 for t in temperatures], device=device)
    tokens = torch.where(greedy, log_probs.argmax(dim=-1), drawn)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    support: list[tuple[int, ...] | None] = [None] * len(samplings)
    asked = [i for i, s in enumerate(samplings) if s.return_support]
    if asked:
        restricted = [i for i in asked if kept is not None and temperatures[i] > 0]
        for i in asked:
            support[i] = ()
        if restricted:
            rows = torch.tensor(restricted, device=device)
            assert kept is not None
            mask = kept[rows]
            norm = torch.logsumexp(log_probs[rows].masked_fill(~mask, float("-inf")), dim=-1)
            chosen[rows] -= norm
            for i, ids in zip(restricted, mask.cpu(), strict=True):
                support[i] = tuple(ids.nonzero().squeeze(-1).tolist())
    return Sampled(tokens.tolist(), chosen.tolist(), support)


def _kept(probs: torch.Tensor, samplings: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Per row, the tokens its top-k and top-p leave drawable (None: every row keeps all)."""
    top_ks = [s.top_k for s in samplings]
    top_ps = [s.top_p for s in samplings]
    if not any(top_ks) and all(p >= 1.0 for p in top_ps):
        return None
    device = probs.device
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    rank = torch.arange(probs.shape[-1], device=device)
    # A row's k (its whole vocabulary when 0) bounds it first; top-p then applies to the
    # distribution top-k left, renormalised.
    limit = torch.tensor([k or probs.shape[-1] for k in top_ks], device=device).unsqueeze(-1)
    keep_sorted = rank < limit
    sorted_probs = sorted_probs.masked_fill(~keep_sorted, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    top_p = torch.tensor(top_ps, dtype=torch.float32, device=device)
    # A threshold above any cumulative mass (rounding can take it past 1) keeps a row whole.
    threshold = torch.where(top_p < 1.0, top_p, torch.full_like(top_p, 2.0)).unsqueeze(-1)
    keep_sorted &= before < threshold
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
