"""The demo summary: a re-run keeps earlier runs' timings; tables and headers at 80 columns."""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from rstar2_data.terminal import cut_words
from rstar2_train.demo import (
    AblationResult,
    AblationRun,
    DemoOptions,
    DemoRunner,
    DemoSummary,
    HeldOutScores,
    PhaseTime,
)
from rstar2_train.demo.report import earlier_invocations, print_summary, write_summary


def _scores(accuracy: float) -> HeldOutScores:
    return HeldOutScores(
        checkpoint="runs/demo/sft/final",
        eval_dir="runs/demo/eval/sft",
        problems=193,
        rollouts=193,
        accuracy=accuracy,
        tool_calls_per_rollout=0.97,
        no_tool_rate=0.119,
        tool_error_ratio=0.096,
        tool_error_ratio_correct=0.083,
        format_error_rate=0.0,
        mean_response_tokens=73.9,
    )


def _summary(timings: list[PhaseTime], started: datetime, total: float) -> DemoSummary:
    return DemoSummary(
        quick=False,
        seed=0,
        sft=_scores(0.855),
        rl=_scores(0.979),
        rl_reward_first=0.78,
        rl_reward_last=0.931,
        started=started,
        timings=timings,
        total_seconds=total,
        plots=["runs/demo/rl/plots/reward.png"],
        samples=["runs/demo/samples.md"],
    )


def _phase(name: str, seconds: float, *, skipped: bool = False) -> PhaseTime:
    return PhaseTime(phase=name, seconds=seconds, skipped=skipped, load_avg_1m=1.5)


FIRST = [_phase("data", 2.0), _phase("sft", 294.0), _phase("rl", 120.0)]
AGAIN = [_phase("data", 0.1), _phase("sft", 0.0, skipped=True), _phase("rl", 0.0, skipped=True)]


def test_a_rerun_keeps_the_earlier_runs_timings(tmp_path: Path) -> None:
    json_path, text_path = tmp_path / "summary.json", tmp_path / "summary.txt"
    first = _summary(FIRST, datetime(2026, 11, 26, 7, 0, tzinfo=UTC), 431.0)
    write_summary(first, json_path, text_path)
    assert "run 1 of" not in text_path.read_text()  # one run: one plain time line

    again = _summary(AGAIN, datetime(2026, 11, 26, 8, 0, tzinfo=UTC), 3.0)
    again = again.model_copy(update={"earlier_invocations": earlier_invocations(json_path)})
    write_summary(again, json_path, text_path)
    kept = DemoSummary.model_validate_json(json_path.read_text())
    assert kept.invocations() == [first.invocation(), again.invocation()]
    text = " ".join(text_path.read_text().split())
    assert (
        "time, run 1 of 2 (2026-11-26 07:00 UTC): 431s in all: data 2s (load 1.5), sft 294s" in text
    )
    assert "time, run 2 of 2 (2026-11-26 08:00 UTC): 3s in all:" in text
    assert "sft done before" in text


def test_a_summary_written_before_timings_were_kept_is_carried_over(tmp_path: Path) -> None:
    old = _summary(FIRST, datetime(2026, 11, 26, 7, 0, tzinfo=UTC), 431.0).model_dump(mode="json")
    del old["started"], old["earlier_invocations"]  # the older summary.json had neither
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(old))
    (carried,) = earlier_invocations(path)
    assert carried.started is None
    assert carried.timings == FIRST
    assert carried.total_seconds == 431.0


def test_an_unreadable_summary_is_reported_not_silently_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "summary.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert earlier_invocations(path) == []
    assert f"{path}: unreadable" in caplog.text


def _render(summary: DemoSummary, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    print_summary(summary, console)
    return console.export_text()


def test_the_summary_tables_fit_80_columns_without_cutting_a_word() -> None:
    ablation = AblationResult(
        runs=[
            AblationRun(
                strategy=strategy,
                seed=seed,
                run_dir=f"runs/demo/ablation/roc-{strategy}-seed{seed}",
                scores=_scores(0.98),
                train_tool_error_ratio_kept_positives=0.011,
            )
            for strategy in ("sample", "none")
            for seed in (0, 1, 2)
        ],
        mean_tool_error_ratio_correct={"sample": 0.007, "none": 0.022},
        roc_lower=True,
    )
    summary = _summary(FIRST, datetime(2026, 11, 26, 7, 0, tzinfo=UTC), 431.0)
    summary = summary.model_copy(update={"ablation": ablation})
    narrow, wide = _render(summary, 80), _render(summary, 1000)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)
    assert "tool-error ratio, correct rollouts" in " ".join(wide.split())


def test_the_demo_stage_headers_fit_80_columns(tmp_path: Path) -> None:
    output = io.StringIO()
    runner = DemoRunner(
        DemoOptions(out=tmp_path / "a folder with a long name" / "demo"),
        Console(width=80, file=output, force_terminal=True, color_system=None),
        Console(file=io.StringIO()),
    )
    title = f"RL: demo-rl (GRPO-RoC) -> {runner.paths.rl}"
    runner._header(title)
    runner._header("summary")
    text = output.getvalue()
    assert title in " ".join(text.split())
    assert "[2/6] summary" in text
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
