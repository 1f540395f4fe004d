"""Decontamination: copies caught in the edited forms they take, ordinary problems left alone,
and the shared normalization equal to its regular-expression definition."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rstar2_data import MathProblem
from rstar2_data.filters import Decontaminate, Item, canonical_words, normalize_words

BENCHMARKS = Path(
    os.environ.get(
        "RSTAR2_BENCHMARK_DIR",
        Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks",
    )
)
needs_benchmarks = pytest.mark.skipif(
    not (BENCHMARKS / "math500.jsonl").is_file(),
    reason=f"benchmark files not found under {BENCHMARKS}",
)


def flagged(decontam: Decontaminate, text: str) -> str | None:
    row = MathProblem(id="x", source="t", problem=text, answer="1", answer_kind="integer")
    return decontam.check(Item(row))


SHORT = r"Compute $\dbinom{31}{28}$."


@pytest.mark.parametrize(
    "copy",
    [
        SHORT,
        r"compute \(\binom{31}{28}\)",
        r"Warm-up question. Compute $\dbinom{31}{28}$.",
        r"Compute $\dbinom{31}{28}$. Show your work.",
        r"Evaluate $\dbinom{31}{28}$.",
    ],
)
def test_a_short_problem_is_caught_in_every_edited_form(copy: str) -> None:
    decontam = Decontaminate({"math": [SHORT, "An unrelated longer problem about circles."]})
    assert flagged(decontam, copy) is not None


def test_a_short_problem_with_one_number_changed_is_caught_but_not_with_two() -> None:
    decontam = Decontaminate({"math": [SHORT, "Find the units digit of $18^6.$"]})
    assert flagged(decontam, "Find the units digit of $19^6.$") == "overlaps math (near copy)"
    assert flagged(decontam, "Warm-up: find the units digit of $18^7$.") is not None
    assert flagged(decontam, "Find the units digit of $19^7.$") is None
    # Under 6 words another number makes another instance of a stock exercise.
    assert flagged(decontam, r"Compute $\dbinom{30}{28}$.") is None


CLAUSED = "What fraction of 2 feet is 3 inches? Express your answer as a common fraction."


@pytest.mark.parametrize(
    ("row", "copy"),
    [
        ("What fraction of 2 feet is 3 inches?", True),
        ("Warm-up. What fraction of 2 feet is 3 inches? Show your work.", True),
        ("What fraction of 2 yards is 3 inches?", True),
        # The clause gone and a number changed: another problem.
        ("What fraction of 5 feet is 3 inches?", False),
        # Less than half of the problem's words: not a copy of it.
        ("What fraction of 2 feet", False),
    ],
)
def test_a_short_problem_with_its_last_clause_dropped_is_caught(row: str, copy: bool) -> None:
    decontam = Decontaminate({"math": [CLAUSED, SHORT]})
    assert (flagged(decontam, row) is not None) is copy


STOCK = "where m and n are relatively prime positive integers. Find m+n."


def test_stock_phrasing_alone_is_not_overlap() -> None:
    benchmarks = [
        f"A fair coin is tossed {k} times. The probability of {event} is m/n, {STOCK}"
        for k, event in ((7, "no two heads in a row"), (9, "exactly four tails"), (11, "a run"))
    ]
    decontam = Decontaminate({"aime": benchmarks})
    ordinary = f"Two dice are rolled until a double shows. The chance it is a six is m/n, {STOCK}"
    assert flagged(decontam, ordinary) is None
    assert flagged(decontam, "Warm-up. " + benchmarks[1]) == "overlaps aime (8-grams)"
    # Either safeguard alone suffices here: the phrase is in 3 benchmark problems (stock
    # phrasing), and it is less than half of any one problem's n-grams (coverage).
    no_stock = Decontaminate({"aime": benchmarks}, boilerplate=100)
    assert flagged(no_stock, ordinary) is None
    assert flagged(Decontaminate({"aime": benchmarks}, coverage=0), ordinary) is None
    # Without both, one shared 8-gram marks a copy (the paper's test).
    assert flagged(Decontaminate({"aime": benchmarks}, boilerplate=100, coverage=0), ordinary)


def _bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, imported as ``name`` (the bench scripts import each other so)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@needs_benchmarks
def test_planted_edits_of_every_target_problem_are_caught_and_amc23_is_not() -> None:
    planted = _bench_module("planted")
    targets = planted.benchmark_problems(BENCHMARKS, ("aime24", "aime25", "math500"))
    texts: dict[str, list[str]] = {}
    for name, text in targets:
        texts.setdefault(name, []).append(text)
    decontam = Decontaminate(texts)
    rng = random.Random(0)
    tried = missed = 0
    for _, text in targets:
        for edit in planted.EDITS.values():
            edited = edit(text, rng)
            if edited is not None:
                tried += 1
                missed += flagged(decontam, edited) is None
    assert tried > 2000
    assert missed / tried <= 0.005
    amc = planted.benchmark_problems(BENCHMARKS, ("amc23",))
    assert len(amc) == 40
    assert sum(flagged(decontam, text) is not None for _, text in amc) <= 1


@needs_benchmarks
def test_short_edited_copies_are_caught_and_real_and_clean_problems_are_not() -> None:
    """Every short MATH-500 problem with one number changed, and with its last clause dropped;
    the 40 AMC23 problems and 10,000 generated ordinary problems stay."""
    planted, synth = _bench_module("planted"), _bench_module("synth")
    targets = planted.benchmark_problems(BENCHMARKS, ("math500",))
    decontam = Decontaminate({"math500": [text for _, text in targets]})
    rng = random.Random(0)
    short = [text for _, text in targets if len(canonical_words(normalize_words(text))) < 24]
    for edit, least in (("one number changed", 0.95), ("last clause dropped", 0.7)):
        edited = [e for text in short if (e := planted.SHORT_EDITS[edit](text, rng)) is not None]
        assert len(edited) > 60
        caught = sum(flagged(decontam, text) is not None for text in edited)
        assert caught >= least * len(edited), (edit, caught, len(edited))
    amc = planted.benchmark_problems(BENCHMARKS, ("amc23",))
    assert [text for _, text in amc if flagged(decontam, text)] == []
    clean = [synth.problem_text(rng) for _ in range(10_000)]
    assert [text for text in clean if flagged(decontam, text)] == []


_SPACING = re.compile(r"\\[,;:! ]|\$|\\left|\\right")
_NON_WORD = re.compile(r"[^\w]+")


@given(st.text(alphabet=st.sampled_from(list("\\$,;:! lefrightLEFTab1_2é\t{}^-ßİ\x1c"))))
def test_normalize_words_equals_its_regular_expression_definition(text: str) -> None:
    expected = _NON_WORD.sub(" ", _SPACING.sub(" ", text.lower())).split()
    assert normalize_words(text) == expected


@needs_benchmarks
def test_normalize_words_on_benchmark_text() -> None:
    for line in (BENCHMARKS / "math500.jsonl").open():
        problem = json.loads(line)["problem"]
        expected = _NON_WORD.sub(" ", _SPACING.sub(" ", problem.lower())).split()
        assert normalize_words(problem) == expected
