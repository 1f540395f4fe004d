"""Sampling one token per row from logits, with the log-prob the trainer will recompute."""

from __future__ import annotations

import random

import torch


def sample_next(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    rngs: list[random.Random],
) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` ``[rows, vocab]``, and its log-prob.

    The log-prob is the log-softmax of the temperature-scaled logits at the sampled token (of the
    plain logits when greedy, temperature 0): what the trainer recomputes for the same tokens.
    Top-p restricts which tokens can be drawn but does not renormalize the reported log-prob.

    Each row draws one uniform number per token from its own ``rngs`` entry and takes the token
    where it falls in the row's cumulative distribution (inverse-CDF sampling), so a row's tokens
    depend on its seed alone, never on its batch or device, and the draw is one batched op: one
    ``torch.multinomial`` per row with its own generator was an eighth of a small model's decode
    step at 32 rows.
    """
    vocab = logits.shape[-1]
    device = logits.device
    scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
    log_probs = torch.log_softmax(logits.float() / scale.to(device).unsqueeze(-1), dim=-1)
    probs = log_probs.exp()
    if any(p < 1.0 for p in top_ps):
        probs = _nucleus(probs, torch.tensor(top_ps, dtype=torch.float32, device=device))
    # Uniforms from every row's stream, greedy rows included, so a row's stream advances one
    # number per token whatever its settings.
    uniform = torch.tensor([rng.random() for rng in rngs], dtype=torch.float64, device=device)
    cdf = probs.double().cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=vocab - 1)
    greedy = torch.tensor([t == 0 for t in temperatures], device=device)
    tokens = torch.where(greedy, log_probs.argmax(dim=-1), drawn)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), chosen.tolist()


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero, per row, all but the smallest set of most likely tokens whose mass reaches the
    row's ``top_p`` (rows with ``top_p`` 1 are left whole)."""
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # A threshold above any cumulative mass (rounding can take it past 1) keeps a row whole.
    threshold = torch.where(top_p < 1.0, top_p, torch.full_like(top_p, 2.0)).unsqueeze(-1)
    sorted_probs = sorted_probs.masked_fill(before >= threshold, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)
