"""The ``--plot`` chart: three bars (avg@k, maj@k, pass@k) only where they can differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.axes
import pytest

from rstar2_data import MathProblem
from rstar2_eval import ProblemSet
from rstar2_eval.generations import Generation
from rstar2_eval.grading import Grade
from rstar2_eval.plotting import plot_scores
from rstar2_eval.scoring import ScoredSample, ScoreReport, aggregate_scores


def _report(samples_per_set: dict[str, int]) -> ScoreReport:
    """Two problems per set, the first always right, the second right on even samples."""
    sets, samples = {}, []
    for name, k in samples_per_set.items():
        problems = [
            MathProblem(
                id=str(i), source="t", problem=f"{i} + 1?", answer=str(i + 1), answer_kind="integer"
            )
            for i in range(2)
        ]
        sets[name] = ProblemSet.of(name, problems)
        for problem in problems:
            for index in range(k):
                correct = problem.id == "0" or index % 2 == 0
                samples.append(
                    ScoredSample(
                        generation=Generation(
                            benchmark=name, problem_id=problem.id, sample_index=index, response="r"
                        ),
                        grade=Grade(
                            correct=correct,
                            status="correct" if correct else "incorrect",
                            answer=problem.answer if correct else "0",
                            method="integer",
                        ),
                    )
                )
    return aggregate_scores(samples, sets, origin="t", boxed_fallback=False, timeout_s=1.0).report


def _bars(report: ScoreReport, path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Plot ``report``; the number of bars drawn per legend label."""
    drawn: dict[str, int] = {}
    bar = matplotlib.axes.Axes.bar

    def counting(self: matplotlib.axes.Axes, x: Any, height: Any, *args: Any, **kw: Any) -> Any:
        drawn[kw["label"]] = drawn.get(kw["label"], 0) + len(height)
        return bar(self, x, height, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", counting)
    plot_scores(report, path)
    assert path.stat().st_size > 0
    return drawn


def test_one_sample_per_problem_draws_one_accuracy_bar_per_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _report({"a": 1, "b": 1})
    assert _bars(report, tmp_path / "k1.png", monkeypatch) == {"accuracy (pass@1, k=1)": 2}


def test_several_samples_draw_three_bars_and_k1_benchmarks_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _report({"a": 4, "b": 1})
    assert report.benchmarks[0].pass_at_k[4] > report.benchmarks[0].avg  # the bars differ
    drawn = _bars(report, tmp_path / "k4.png", monkeypatch)
    assert drawn == {"avg@k (avg pass@1)": 2, "maj@k": 1, "pass@k": 1}
