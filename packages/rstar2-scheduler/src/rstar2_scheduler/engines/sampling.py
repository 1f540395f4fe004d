"""Sampling one token per row from logits, with the log-prob the trainer will recompute."""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    generators: list[torch.Generator],
) -> tuple[list[int], list[float]]:
    """One token per row of ``logits`` ``[rows, vocab]``, and its log-prob.

    The log-prob is the log-softmax of the temperature-scaled logits at the sampled token (of the
    plain logits when greedy, temperature 0): what the trainer recomputes for the same tokens.
    Top-p restricts which tokens can be drawn but does not renormalize the reported log-prob.
    """
    tokens: list[int] = []
    logprobs: list[float] = []
    logits = logits.float()
    for row, (temperature, top_p, generator) in enumerate(
        zip(temperatures, top_ps, generators, strict=True)
    ):
        scaled = logits[row] / temperature if temperature > 0 else logits[row]
        log_probs = torch.log_softmax(scaled, dim=-1)
        if temperature == 0:
            token = int(torch.argmax(log_probs))
        else:
            probs = log_probs.exp()
            if top_p < 1.0:
                probs = _nucleus(probs, top_p)
            token = int(torch.multinomial(probs, 1, generator=generator))
        tokens.append(token)
        logprobs.append(float(log_probs[token]))
    return tokens, logprobs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches ``top_p``."""
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before >= top_p] = 0.0
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)
