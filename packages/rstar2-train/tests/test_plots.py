"""Metric plots: one PNG per figure with data, both axes labelled."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from matplotlib.axes import Axes

from rstar2_train.plots import FIGURES, write_plots


def test_every_plot_labels_both_axes(tmp_path: Path) -> None:
    records = [
        {
            "step": step,
            "train/loss": 1.0 / step,
            "reward/mean": 0.1 * step,
            "reward/accuracy": 0.1 * step,
            "val/demo/avg@1": 0.2 * step,
            "response/length_mean": 80.0,
            "tools/error_ratio_all_positives": 0.1,
            "actor/lr": 1e-4,
        }
        for step in (1, 2, 3)
    ]
    with (
        mock.patch.object(Axes, "set_xlabel", autospec=True, side_effect=Axes.set_xlabel) as x,
        mock.patch.object(Axes, "set_ylabel", autospec=True, side_effect=Axes.set_ylabel) as y,
    ):
        written = write_plots(records, tmp_path)
    assert {p.name for p in written} == {f"{figure.name}.png" for figure in FIGURES}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
    assert [call.args[1] for call in x.call_args_list] == ["step"] * len(FIGURES)
    assert [call.args[1] for call in y.call_args_list] == [f.y_label for f in FIGURES]
    assert all(figure.y_label for figure in FIGURES)
