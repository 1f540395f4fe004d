"""Composable row filters; each reports how many rows it removed and why."""

from rstar2_data.filters.answers import DEFAULT_MAX_ABS, IntegerAnswer
from rstar2_data.filters.base import Filter, FilterReport, Row, Verdict, row_text
from rstar2_data.filters.chain import DuplicateIdsError, FilterChain
from rstar2_data.filters.decontam import (
    DEFAULT_BOILERPLATE,
    DEFAULT_COVERAGE,
    DEFAULT_NGRAM,
    DEFAULT_SHORT_WORDS,
    Decontaminate,
    ngrams,
    word_ngrams,
)
from rstar2_data.filters.dedup import Dedup, DedupMode
from rstar2_data.filters.graded import (
    Difficulty,
    LabelVerification,
    Tally,
    load_tallies,
    tally_samples,
)
from rstar2_data.filters.text import (
    Item,
    canonical_words,
    normalize_text,
    normalize_words,
)

__all__ = [
    "DEFAULT_BOILERPLATE",
    "DEFAULT_COVERAGE",
    "DEFAULT_MAX_ABS",
    "DEFAULT_NGRAM",
    "DEFAULT_SHORT_WORDS",
    "Decontaminate",
    "Dedup",
    "DedupMode",
    "Difficulty",
    "DuplicateIdsError",
    "Filter",
    "FilterChain",
    "FilterReport",
    "IntegerAnswer",
    "Item",
    "LabelVerification",
    "Row",
    "Tally",
    "Verdict",
    "canonical_words",
    "load_tallies",
    "ngrams",
    "normalize_text",
    "normalize_words",
    "row_text",
    "tally_samples",
    "word_ngrams",
]
