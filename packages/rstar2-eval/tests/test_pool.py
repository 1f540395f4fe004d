"""The worker pool: hostile answers time out alone, hung workers are killed and replaced."""

from __future__ import annotations

import time

import pytest
from hanging_verifier import verify_or_hang
from import_probe import verify_without_imports

from rstar2_eval import Grader, VerifierPool
from rstar2_eval.pool import VerifyResult

HOSTILE = [
    r"10^{10^{10}}",
    "1+" * 50_000 + "1",  # a 100 KB answer
]


def test_hostile_answers_end_as_timeouts_or_wrong(grader: Grader) -> None:
    grades = grader.grade_answers([*HOSTILE, r"\frac{1}{2}"], ["2"] * len(HOSTILE) + ["0.5"])
    assert {g.status for g in grades[:-1]} <= {"timeout", "incorrect"}
    assert grades[0].status == "timeout"
    assert grades[-1].correct


def test_one_hostile_answer_holds_up_one_worker_only(grader: Grader) -> None:
    normal = [rf"\frac{{{i}}}{{{i + 1}}}" for i in range(1, 21)]
    golds = [rf"\frac{{{2 * i}}}{{{2 * i + 2}}}" for i in range(1, 21)]
    landed: list[int] = []
    grades = grader.grade_answers(
        [r"9^{9^{9^{9}}}", *normal], ["2", *golds], on_graded=landed.extend
    )
    assert grades[0].status == "timeout"
    assert all(grade.correct for grade in grades[1:])
    # Every normal item landed while the hostile one still held its worker.
    assert landed[-1] == 0


def test_a_hung_worker_is_killed_and_the_batch_completes() -> None:
    items = [("hang", "x")] + [(str(i), str(i)) for i in range(30)]
    finished: list[int] = []
    with VerifierPool(
        2, 0.5, kill_grace_s=0.5, verifier=verify_or_hang, memory_limit_mb=None
    ) as pool:
        started = time.monotonic()
        results = pool.verify(items, lambda key, _: finished.append(key))
        elapsed = time.monotonic() - started
        assert pool.replacements == 1
        # The replacement worker serves later calls.
        assert pool.verify([("hang", "x"), ("a", "a")])[1] == VerifyResult("correct", None)
    assert results[0].status == "timeout"
    assert "killed" in str(results[0].detail)
    assert all(r.status == "correct" for r in results[1:])
    # The 30 quick items all landed while the hung one was still being waited on.
    assert finished[-1] == 0
    assert elapsed < 60  # a sanity bound against a hang, not a performance target


def test_invalid_pool_settings() -> None:
    with pytest.raises(ValueError, match="workers"):
        VerifierPool(0, 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierPool(1, 0.0)


def test_a_warm_worker_imports_nothing_for_its_first_symbolic_answer() -> None:
    # A garbled integer (letters inside digits: symbols to math-verify) against an integer gold
    # takes math-verify's symbolic path, sympy.simplify; its first call used to import sympy
    # modules (about 0.5 s on a loaded 2-core machine) on the first such answer of every worker.
    with VerifierPool(1, 60.0, verifier=verify_without_imports, memory_limit_mb=None) as pool:
        results = pool.verify([("19You74316", "19130160")])
    assert results == [VerifyResult("correct", None)]
