"""Counting answer tags: Resample-on-Correct penalizes a response with none or several."""

from __future__ import annotations

from rstar2_scheduler.protocol.template import ANSWER_OPEN


def count_answer_tags(text: str) -> int:
    """Number of ``<answer>`` blocks the model opened in ``text``."""
    return text.count(ANSWER_OPEN)
