"""The ``--plot`` chart: per-benchmark bars of avg@k, maj@k and pass@k."""

from __future__ import annotations

from pathlib import Path

from rstar2_data.jsonl import atomic_output
from rstar2_eval.scoring import ScoreReport


def _at_largest_k(metric: dict[int, float]) -> float | None:
    return metric[max(metric)] if metric else None


def plot_scores(report: ScoreReport, path: Path) -> None:
    """Write a PNG bar chart; needs the ``plot`` extra (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise RuntimeError("plotting needs matplotlib: pip install 'rstar2-eval[plot]'") from error

    names = [score.benchmark for score in report.benchmarks]
    series: list[tuple[str, list[float | None]]] = [
        ("avg@k (avg pass@1)", [s.avg for s in report.benchmarks]),
        ("maj@k", [_at_largest_k(s.maj_at_k) for s in report.benchmarks]),
        ("pass@k", [_at_largest_k(s.pass_at_k) for s in report.benchmarks]),
    ]
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(names) + 2), 4.5), dpi=120)
    for offset, (label, values) in enumerate(series):
        positions = [i + (offset - (len(series) - 1) / 2) * width for i in range(len(names))]
        heights = [0.0 if value is None else 100 * value for value in values]
        bars = axes.bar(positions, heights, width, label=label)
        labels = ["n/a" if value is None else f"{100 * value:.1f}" for value in values]
        axes.bar_label(bars, labels=labels, fontsize=8, padding=2)
    axes.set_xticks(range(len(names)))
    axes.set_xticklabels(
        [f"{s.benchmark}\n(k={s.min_samples})" for s in report.benchmarks], fontsize=9
    )
    axes.set_ylabel("accuracy (%)")
    axes.set_ylim(0, 108)
    axes.set_title("rstar2-eval: scores per benchmark (k = samples per problem)")
    # Below the axes, so it never covers the bar labels near 100%.
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, ncols=3, frameon=False)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    with atomic_output(path) as temporary:
        figure.savefig(temporary, format="png")
    plt.close(figure)
