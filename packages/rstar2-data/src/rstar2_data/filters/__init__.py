"""Composable row filters; each reports how many rows it removed and why."""

from rstar2_data.filters.answers import DEFAULT_MAX_ABS, IntegerAnswer
from rstar2_data.filters.base import Filter, FilterReport, Row, row_text
from rstar2_data.filters.decontam import DEFAULT_NGRAM, Decontaminate, ngrams
from rstar2_data.filters.dedup import Dedup, DedupMode, normalize_text
from rstar2_data.filters.graded import (
    Difficulty,
    LabelVerification,
    Tally,
    load_tallies,
    tally_samples,
)

__all__ = [
    "DEFAULT_MAX_ABS",
    "DEFAULT_NGRAM",
    "Decontaminate",
    "Dedup",
    "DedupMode",
    "Difficulty",
    "Filter",
    "FilterReport",
    "IntegerAnswer",
    "LabelVerification",
    "Row",
    "Tally",
    "load_tallies",
    "ngrams",
    "normalize_text",
    "row_text",
    "tally_samples",
]
