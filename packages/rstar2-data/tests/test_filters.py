"""Filters remove what they should, keep the rest, and count removals per reason."""

import json
from pathlib import Path

import pytest

from rstar2_data import AnswerKind, GradedSample, MathProblem
from rstar2_data.filters import (
    Decontaminate,
    Dedup,
    Difficulty,
    IntegerAnswer,
    LabelVerification,
    load_tallies,
    tally_samples,
)
from rstar2_data.jsonl import DataFileError


def problem(
    pid: str, text: str = "Q", answer: str = "1", kind: AnswerKind = "integer"
) -> MathProblem:
    return MathProblem(id=pid, source="s", problem=text, answer=answer, answer_kind=kind)


def test_integer_answer_filter() -> None:
    rows = [
        problem("a", answer="25"),
        problem("b", answer="\\frac{1}{2}", kind="expression"),
        problem("c", answer=str(10**13)),
        problem("d", answer="-1000"),
    ]
    kept, report = IntegerAnswer(max_abs=10**12).apply(rows)
    assert [r.id for r in kept] == ["a", "d"]
    assert report.removed == {"answer is not an integer": 1, f"answer larger than {10**12}": 1}
    assert (report.rows_in, report.kept) == (4, 2)


def test_dedup_exact_and_normalized() -> None:
    rows = [
        problem("a", "Find $x$ if $2x = 4$."),
        problem("b", "Find $x$ if $2x = 4$."),
        problem("c", "find  x if 2x=4"),
        problem("d", "Find y if 2y = 4."),
    ]
    kept, report = Dedup(mode="exact").apply(rows)
    assert [r.id for r in kept] == ["a", "c", "d"]
    assert report.removed == {"duplicate (exact)": 1}
    kept, report = Dedup(mode="normalized").apply(rows)
    assert [r.id for r in kept] == ["a", "d"]
    assert report.removed == {"duplicate (normalized)": 2}
    # A fresh run starts with an empty memory.
    assert len(Dedup().apply(rows)[0]) == 2


BENCH = (
    "Let $N$ be the greatest four-digit positive integer with the property that whenever one of "
    "its digits is changed to $1$, the resulting number is divisible by $7$."
)


def test_decontamination_matches_reformatted_copies_only() -> None:
    decontam = Decontaminate({"aime": [BENCH]}, n=8)
    rows = [
        problem("copy", BENCH),
        problem("reformatted", BENCH.upper().replace("$", "").replace(" ", "  ")),
        problem("embedded", "Warm-up. " + BENCH + " Find N mod 1000."),
        problem("other", "Let N be the least three-digit integer whose digits sum to 7."),
    ]
    kept, report = decontam.apply(rows)
    assert [r.id for r in kept] == ["other"]
    assert report.removed == {"overlaps aime (8-grams)": 3}
    # Past the n-gram threshold, whole copies are still caught by their whole text.
    strict = Decontaminate({"aime": [BENCH]}, n=8, min_matches=40)
    assert [r.id for r in strict.apply(rows)[0]] == ["embedded", "other"]
    with pytest.raises(ValueError, match="must be >= 1"):
        Decontaminate({}, n=0)


def samples(pid: str, correct: list[bool]) -> list[GradedSample]:
    return [
        GradedSample(problem_id=pid, sample_index=i, answer="1" if ok else None, correct=ok)
        for i, ok in enumerate(correct)
    ]


def test_label_verification_keeps_m_of_n() -> None:
    tallies = tally_samples(
        samples("two", [True, True] + [False] * 14)
        + samples("one", [True] + [False] * 15)
        + samples("none", [False] * 16)
    )
    rows = [problem("two"), problem("one"), problem("none"), problem("ungraded")]
    kept, report = LabelVerification(tallies, min_correct=2).apply(rows)
    assert [r.id for r in kept] == ["two"]
    assert report.removed == {"fewer than 2 samples match the label": 2, "no graded samples": 1}
    kept, _ = LabelVerification(tallies, min_correct=2, keep_ungraded=True).apply(rows)
    assert [r.id for r in kept] == ["two", "ungraded"]


def test_difficulty_drops_problems_solved_every_time() -> None:
    tallies = tally_samples(
        samples("easy", [True] * 8)
        + samples("mid", [True] * 7 + [False])
        + samples("hard", [False] * 8)
    )
    rows = [problem("easy"), problem("mid"), problem("hard")]
    kept, report = Difficulty(tallies).apply(rows)
    assert [r.id for r in kept] == ["mid", "hard"]
    assert report.removed == {"solved by every sample": 1}
    kept, _ = Difficulty(tallies, max_correct=4).apply(rows)
    assert [r.id for r in kept] == ["hard"]


def test_graded_samples_file_errors_name_the_record(tmp_path: Path) -> None:
    path = tmp_path / "graded.jsonl"
    good = {"problem_id": "p", "sample_index": 0, "answer": "3", "correct": True}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "sample_index": 1}) + "\n")
    assert load_tallies([path])["p"].total == 2
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "correct": "maybe"}) + "\n")
    with pytest.raises(DataFileError, match=r"graded\.jsonl:2: correct"):
        load_tallies([path])
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataFileError, match="sample 0 of p repeats"):
        load_tallies([path])
    path.write_text("{not json\n")
    with pytest.raises(DataFileError, match=r"graded\.jsonl:1: invalid JSON"):
        load_tallies([path])
