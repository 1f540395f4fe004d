"""A PNG timeline of engine utilization per policy (needs the ``plot`` extra: matplotlib)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import atomic_output
from rstar2_scheduler.metrics import EngineMetrics, PhaseMetrics

_BINS = 600


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plotting needs matplotlib: pip install 'rstar2-scheduler[plot]'"
        ) from exc
    return plt


def _engine_row(engine: EngineMetrics, edges: list[float]) -> list[float]:
    """KV usage per time bin where the engine was busy for most of the bin, NaN where idle."""
    row: list[float] = []
    intervals = engine.busy_intervals
    samples = engine.kv_timeline
    i = s = 0
    for left, right in itertools.pairwise(edges):
        busy = 0.0
        while i < len(intervals) and intervals[i][1] <= left:
            i += 1
        j = i
        while j < len(intervals) and intervals[j][0] < right:
            busy += min(right, intervals[j][1]) - max(left, intervals[j][0])
            j += 1
        while s + 1 < len(samples) and samples[s + 1][0] <= (left + right) / 2:
            s += 1
        usage = samples[s][1] if samples else 0.0
        row.append(usage if busy >= (right - left) / 2 else float("nan"))
    return row


def plot_timelines(
    phases: Mapping[str, PhaseMetrics],
    path: Path,
    *,
    bound_s: float | None = None,
    title: str | None = None,
) -> Path:
    """One panel per policy: engines by time, coloured by KV usage while busy, blank when idle."""
    plt = _pyplot()
    horizon = max(m.makespan_s for m in phases.values()) * 1.02 or 1.0
    edges = [horizon * k / _BINS for k in range(_BINS + 1)]
    fig, axes = plt.subplots(
        len(phases), 1, figsize=(11, 1.2 + 1.6 * len(phases)), sharex=True, squeeze=False
    )
    image = None
    for ax, (name, metrics) in zip(axes[:, 0], phases.items(), strict=True):
        grid = [_engine_row(engine, edges) for engine in metrics.engines]
        cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
        image = ax.imshow(
            grid,
            aspect="auto",
            interpolation="nearest",
            extent=(0, horizon, len(grid) - 0.5, -0.5),
            cmap=cmap,
            vmin=0.0,
            vmax=1.0,
        )
        ax.axvline(metrics.makespan_s, color="black", linewidth=1.2)
        if bound_s is not None:
            ax.axvline(bound_s, color="crimson", linestyle="--", linewidth=1.2)
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels([str(k) for k in range(len(grid))], fontsize=7)
        ax.set_ylabel("engine")
        ax.set_title(
            f"{name}: makespan {metrics.makespan_s:,.0f} s, idle {metrics.idle_fraction:.1%}, "
            f"{metrics.preemptions} preemptions",
            fontsize=10,
            loc="left",
        )
    axes[-1, 0].set_xlabel("time in the rollout phase (s)")
    caption = "grey: engine idle; black line: makespan"
    if bound_s is not None:
        caption += "; dashed red: lower bound"
    fig.text(0.01, 0.005, caption, fontsize=8, color="#555555")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="KV cache usage", fraction=0.03, pad=0.01)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
