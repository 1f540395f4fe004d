"""The ``--plot`` chart: per-benchmark bars of avg@k, maj@k and pass@k (one accuracy bar where a
benchmark has one sample per problem: at k = 1 the three are the same number)."""

from __future__ import annotations

from pathlib import Path

from rstar2_data.jsonl import atomic_output
from rstar2_eval.scoring import ScoreReport


def _at_largest_k(metric: dict[int, float]) -> float | None:
    return metric[max(metric)] if metric else None


def score_series(report: ScoreReport) -> list[tuple[str, list[float | None]]]:
    """The chart's bar series: (legend label, value per benchmark; None draws no bar).

    A benchmark whose largest k is 1 gets its avg@1 bar only (maj@1 and pass@1 equal it); a
    report of only such benchmarks is one series, labelled as the accuracy it is.
    """
    scores = report.benchmarks
    several = [max(s.pass_at_k, default=1) > 1 for s in scores]
    if not any(several):
        return [("accuracy (pass@1, k=1)", [s.avg for s in scores])]

    def where_several(values: list[float | None]) -> list[float | None]:
        return [value if k else None for value, k in zip(values, several, strict=True)]

    return [
        ("avg@k (avg pass@1)", [s.avg for s in scores]),
        ("maj@k", where_several([_at_largest_k(s.maj_at_k) for s in scores])),
        ("pass@k", where_several([_at_largest_k(s.pass_at_k) for s in scores])),
    ]


def plot_scores(report: ScoreReport, path: Path) -> None:
    """Write a PNG bar chart; needs the ``plot`` extra (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError("plotting needs matplotlib: pip install 'rstar2-eval[plot]'") from error

    names = [score.benchmark for score in report.benchmarks]
    series = score_series(report)
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(names) + 2), 4.5), dpi=120)
    for offset, (label, values) in enumerate(series):
        positions = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(names))]
        drawn = [
            (x, value) for x, value in zip(positions, values, strict=True) if value is not None
        ]
        if not drawn:
            continue
        bars = axes.bar([x for x, _ in drawn], [100 * v for _, v in drawn], width, label=label)
        axes.bar_label(bars, labels=[f"{100 * v:.1f}" for _, v in drawn], fontsize=8, padding=2)
    axes.set_xticks(range(len(names)))
    axes.set_xticklabels(
        [f"{s.benchmark}\n(k={s.min_samples})" for s in report.benchmarks], fontsize=9
    )
    axes.set_ylabel("accuracy (%)")
    axes.set_ylim(0, 108)
    axes.set_title("rstar2-eval: scores per benchmark (k = samples per problem)")
    # Below the axes, so it never covers the bar labels near 100%.
    axes.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        fontsize=8,
        ncols=len(series),
        frameon=False,
    )
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    with atomic_output(path) as temporary:
        figure.savefig(temporary, format="png")
    plt.close(figure)
