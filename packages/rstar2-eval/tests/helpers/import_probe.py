"""A verifier that reports whether verifying its item had to import any module."""

from __future__ import annotations

import sys

from rstar2_eval.verification import math_verify_equal


def verify_without_imports(answer: str, gold: str) -> bool:
    """math-verify's verdict is discarded: True when the verification imported nothing."""
    before = len(sys.modules)
    math_verify_equal(answer, gold)
    return len(sys.modules) == before
