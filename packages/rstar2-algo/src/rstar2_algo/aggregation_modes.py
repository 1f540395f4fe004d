"""The loss-aggregation conventions by name, importable without torch: configs validate against
them before anything is computed."""

from __future__ import annotations

from typing import Literal

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""``token-mean``: sum over all loss tokens / their number (DAPO, the paper).
``seq-mean-token-mean``: mean over sequences of each sequence's token mean (original GRPO).
``seq-mean-token-sum-norm``: mean over sequences of token sum / a constant length (Dr. GRPO)."""
