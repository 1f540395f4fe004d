"""Grading workers start from any caller: unguarded scripts, stdin, and report real failures.

These run real interpreters: the defect they guard against (workers re-running the caller's main
module) only shows in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rstar2_eval import GradingError, VerifierPool

# Grades one answer that needs math-verify (so a worker starts) and leaves a mark each time the
# module body runs: workers that re-ran the caller's main module would add marks, or fail.
SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    with Path(sys.argv[1]).open("a") as marks:
        marks.write("ran\\n")
    import rstar2_eval as E

    grades = E.grade_many([r"<answer>\\boxed{\\frac{1}{2}}</answer>"], ["0.5"])
    print(grades[0].correct, grades[0].method)
    """
)


def _check(result: subprocess.CompletedProcess[str], marks: Path) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "math_verify"]
    assert marks.read_text() == "ran\n"  # the caller's code ran once: workers never import it


def test_grading_from_an_unguarded_script(tmp_path: Path) -> None:
    script = tmp_path / "grade.py"
    script.write_text(SCRIPT)
    marks = tmp_path / "marks.txt"
    result = subprocess.run(
        [sys.executable, str(script), str(marks)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _check(result, marks)


def test_grading_from_stdin(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    result = subprocess.run(
        [sys.executable, "-", str(marks)],
        input=SCRIPT,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _check(result, marks)


def test_a_worker_that_fails_to_start_reports_its_own_error() -> None:
    # 1 MB of extra address space is too little to import math-verify: the worker's own
    # MemoryError and exit status reach the caller, not a guess about the environment.
    with VerifierPool(1, 1.0, memory_limit_mb=1) as pool, pytest.raises(GradingError) as caught:
        pool.verify([("1", "1")])
    message = str(caught.value)
    assert "exited with code 1 before it was ready: MemoryError" in message
    assert "Traceback" in message


def _defined_in_main(answer: str, gold: str) -> bool:
    return answer == gold


def test_a_verifier_workers_cannot_import_is_refused() -> None:
    _defined_in_main.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in the main script"):
        VerifierPool(1, 1.0, verifier=_defined_in_main)
    with pytest.raises(ValueError, match="module-level function"):
        VerifierPool(1, 1.0, verifier=lambda answer, gold: True)
