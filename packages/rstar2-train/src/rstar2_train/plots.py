"""PNG plots of a run's metrics over steps (needs matplotlib: the ``plot`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, NamedTuple

from rstar2_data.jsonl import atomic_output


class Figure(NamedTuple):
    """One PNG: the metric keys it draws as glob patterns (missing keys are skipped;
    "val/*/avg@*" draws one line per validation benchmark)."""

    name: str
    title: str
    y_label: str
    patterns: tuple[str, ...]


FIGURES: Sequence[Figure] = (
    Figure("loss", "Loss", "loss (nats per trained token)", ("train/loss", "val/loss")),
    Figure("reward", "Reward", "mean reward per rollout", ("reward/mean",)),
    Figure("accuracy", "Accuracy", "fraction correct", ("reward/accuracy", "val/*/avg@*")),
    Figure("response_length", "Response length", "tokens per rollout", ("response/length_mean",)),
    Figure(
        "tool_errors",
        "Tool-error ratio",
        "failed tool calls / tool calls",
        ("tools/error_ratio_all_positives", "tools/error_ratio_kept_positives"),
    ),
    Figure("learning_rate", "Learning rate", "learning rate", ("actor/lr",)),
)


def _series(
    records: Sequence[dict[str, Any]], pattern: str
) -> dict[str, tuple[list[int], list[float]]]:
    """Every metric whose key matches the glob ``pattern``, as (steps, values)."""
    keys = sorted({key for record in records for key in record if fnmatchcase(key, pattern)})
    out: dict[str, tuple[list[int], list[float]]] = {}
    for key in keys:
        points = [(r["step"], float(r[key])) for r in records if r.get(key) is not None]
        if points:
            out[key] = ([step for step, _ in points], [value for _, value in points])
    return out


def write_plots(records: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """One PNG per figure that has data; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as missing:
        raise ImportError("plots need matplotlib: pip install 'rstar2-train[plot]'") from missing
    written: list[Path] = []
    for spec in FIGURES:
        lines: dict[str, tuple[list[int], list[float]]] = {}
        for pattern in spec.patterns:
            lines.update(_series(records, pattern))
        if not lines:
            continue
        figure, axes = plt.subplots(figsize=(6.4, 3.6))
        for label, (steps, values) in lines.items():
            axes.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
        axes.set_title(spec.title)
        axes.set_xlabel("step")
        axes.set_ylabel(spec.y_label)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        path = folder / f"{spec.name}.png"
        with atomic_output(path) as temporary:
            figure.savefig(temporary, format="png", dpi=100)
        plt.close(figure)
        written.append(path)
    return written
