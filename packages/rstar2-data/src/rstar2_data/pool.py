"""The pool: every source's converted rows, sampled to the recipe's counts, in recipe order."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from rstar2_data.recipe import Recipe
from rstar2_data.sources import CachedSource


@dataclass(frozen=True)
class PoolPart:
    """One source's share: all its rows (``take`` None) or those at the sorted ``take``."""

    source: CachedSource
    requested: int | None
    take: list[int] | None

    @property
    def size(self) -> int:
        return self.source.converted if self.take is None else len(self.take)


def targets(recipe: Recipe) -> dict[str, int | None]:
    """Rows requested per source: ``count``, or the source's share of ``total`` by weight."""
    weights = {s.name: s.weight for s in recipe.sources if s.weight is not None}
    total_weight = sum(weights.values())
    out: dict[str, int | None] = {}
    for spec in recipe.sources:
        if spec.weight is not None and recipe.total is not None:
            out[spec.name] = max(1, round(recipe.total * spec.weight / total_weight))
        else:
            out[spec.name] = spec.count
    return out


def sample(source: CachedSource, requested: int | None, seed: int) -> PoolPart:
    """A seeded sample of ``requested`` rows of ``source`` (all when it has no more)."""
    if requested is None or requested >= source.converted:
        return PoolPart(source, requested, None)
    rng = random.Random(f"{seed}:{source.name}")
    return PoolPart(source, requested, sorted(rng.sample(range(source.converted), requested)))


class Pool:
    """The rows the filters see, as lines of the sources' cache files."""

    def __init__(self, parts: list[PoolPart]) -> None:
        self.parts = parts

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    def _part_lines(self, part: PoolPart) -> Iterator[bytes]:
        with part.source.path.open("rb") as handle:
            if part.take is None:
                yield from handle
                return
            position = 0
            for index in part.take:
                line = next(islice(handle, index - position, None))
                position = index + 1
                yield line

    def lines(self, start: int = 0) -> Iterator[bytes]:
        """The pool's rows from position ``start`` on."""
        for part in self.parts:
            if start >= part.size:
                start -= part.size
                continue
            yield from islice(self._part_lines(part), start, None)
            start = 0
