"""Seeded random quantities of a simulated workload (token counts, latencies)."""

from __future__ import annotations

import math
import random

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LogNormal(BaseModel):
    """A log-normal draw, clipped to ``[minimum, maximum]``: long-tailed, like response lengths."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    median: float = Field(gt=0, description="exp(mu): half the draws fall below it.")
    sigma: float = Field(ge=0, description="Standard deviation of the log; 0 is a constant.")
    minimum: float = Field(default=0.0, ge=0, description="Draws below are raised to it.")
    maximum: float | None = Field(default=None, gt=0, description="Draws above are cut to it.")

    @model_validator(mode="after")
    def _check_range(self) -> LogNormal:
        if self.maximum is not None and self.maximum < self.minimum:
            raise ValueError(f"maximum ({self.maximum}) must be >= minimum ({self.minimum})")
        return self

    @property
    def mean(self) -> float:
        """Mean of the unclipped distribution."""
        return self.median * math.exp(self.sigma**2 / 2)

    def sample(self, rng: random.Random) -> float:
        value = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        value = max(self.minimum, value)
        return value if self.maximum is None else min(self.maximum, value)

    def sample_int(self, rng: random.Random) -> int:
        """A draw rounded to a whole count of at least 1 (token counts)."""
        return max(1, round(self.sample(rng)))
