"""One source of uniform random numbers for the samplers, from a torch or numpy generator."""

from __future__ import annotations

import numpy as np
import torch

RandomSource = torch.Generator | np.random.Generator | int | None
"""A torch generator (on any device), a numpy generator, an integer seed, or None for torch's
global generator. The same source and call sequence always give the same selection on the same
device; a CUDA generator draws a different stream than a CPU one with the same seed."""

Generator = torch.Generator | np.random.Generator | None


def as_generator(source: RandomSource) -> Generator:
    """Turn an integer seed into a fresh CPU generator, so one call draws one stream."""
    if isinstance(source, bool) or not isinstance(
        source, torch.Generator | np.random.Generator | int | None
    ):
        raise ValueError(
            "generator must be a torch.Generator, numpy.random.Generator, int seed or None, got "
            f"{type(source).__name__}"
        )
    if isinstance(source, int):
        return torch.Generator().manual_seed(source)
    return source


def uniforms(count: int, generator: Generator) -> list[float]:
    """``count`` draws from U[0, 1) as Python floats (the samplers work on small groups)."""
    if isinstance(generator, np.random.Generator):
        return [float(u) for u in generator.random(count)]
    device = generator.device if generator is not None else torch.device("cpu")
    draws = torch.rand(count, generator=generator, dtype=torch.float64, device=device)
    return [float(u) for u in draws.tolist()]
