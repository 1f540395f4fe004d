"""Forecast of the KV cache an engine's running rollouts will come to hold, learnt online.

A rollout's footprint (the KV tokens its context takes) grows as it generates and tool responses
are appended, and drops to zero when it ends at its final footprint F. ``FootprintForecast``
estimates the distribution of F during the phase with a Kaplan-Meier estimator over footprint
bins: finished rollouts are observations of F, running ones are censored at the context they
have reached (their F is at least that). Early in a phase only short rollouts have finished;
counting the running ones as censored keeps the estimate from concluding that all rollouts are
short. Past the point where too few rollouts support the estimate (fewer than ``min_at_risk``,
or than ``min_at_risk_fraction`` of the rollouts in flight), the remaining probability goes to
the largest footprint any rollout may reach, so an uncertain forecast errs towards the fixed
reservation rather than towards eviction. The relative part matters at scale: over eight
engines an absolute count is reached four times sooner than over two, and a tail trusted that
early let every engine over-admit and evict the prefixes of rollouts waiting on tools (the
scheduler README has the measurements).

From the distribution it derives, for a rollout at context c, its expected footprint after
every running rollout has generated t more tokens: ``(c + t) P(F >= c + t | F >= c)``. Summed
over an engine's rollouts and maximised over t, that is the expected peak of the engine's KV
usage if it admitted nothing more; rollouts that will end soon free their cache before the long
ones peak, which a sum of expected final footprints would ignore.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class FootprintForecast:
    """Online estimate of final rollout footprints and of the KV usage they lead to.

    Footprints are counted in ``bins`` bins of equal width up to ``max_tokens``, the largest
    footprint a rollout of the phase may reach (its prompt plus its whole response budget).
    """

    def __init__(
        self,
        max_tokens: int,
        *,
        bins: int = 64,
        min_at_risk: int = 32,
        min_at_risk_fraction: float = 0.1,
    ) -> None:
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
        if bins <= 0 or min_at_risk <= 0:
            raise ValueError("bins and min_at_risk must be > 0")
        if not 0 <= min_at_risk_fraction <= 1:
            raise ValueError(f"min_at_risk_fraction must be in [0, 1], got {min_at_risk_fraction}")
        self.max_tokens = max_tokens
        self.width = -(-max_tokens // bins)
        self.bins = -(-max_tokens // self.width)
        self.min_at_risk = min_at_risk
        self.min_at_risk_fraction = min_at_risk_fraction
        self.finished = [0] * self.bins
        # Expected footprint per (current bin, progress bin); no data yet: the fixed reservation.
        self.rows = self._rows([1.0] * self.bins)

    def bin_of(self, tokens: int) -> int:
        return min(self.bins - 1, max(0, tokens) // self.width)

    def observe(self, footprint: int) -> None:
        """A rollout ended holding ``footprint`` tokens."""
        self.finished[self.bin_of(footprint)] += 1

    def survival(
        self, running: Sequence[int], finished: Sequence[int] | None = None
    ) -> list[float]:
        """P(F reaches bin b) for every bin, given the running rollouts' current bins (and the
        finished ones' footprints, by default those observed so far)."""
        finished = self.finished if finished is None else finished
        at_risk = [0] * (self.bins + 1)
        for b in reversed(range(self.bins)):
            at_risk[b] = at_risk[b + 1] + finished[b] + running[b]
        support = max(self.min_at_risk, math.ceil(self.min_at_risk_fraction * sum(running)))
        survival: list[float] = []
        alive = 1.0
        for b in range(self.bins):
            survival.append(alive)
            if at_risk[b] < support:
                # Too little support from here on: every remaining rollout may reach the top.
                survival.extend([alive] * (self.bins - b - 1))
                break
            alive *= 1 - finished[b] / at_risk[b]
        return survival

    def refresh(self, running: Sequence[int], finished: Sequence[int] | None = None) -> None:
        """Re-estimate from the finished rollouts and the running ones (counts per bin)."""
        self.rows = self._rows(self.survival(running, finished))

    def _rows(self, survival: list[float]) -> list[list[float]]:
        width, top = self.width, self.max_tokens
        rows: list[list[float]] = []
        for b in range(self.bins):
            here = survival[b]
            centre = b * width + width // 2
            # Where the estimate says nobody gets, yet a rollout did, assume it may run on.
            ratios = [s / here if here > 0 else 1.0 for s in survival[b:]]
            row = [min(top, centre + k * width) * r for k, r in enumerate(ratios)]
            rows.append(row + [0.0] * b)
        return rows
