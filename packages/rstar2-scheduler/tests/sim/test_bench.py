"""The benchmark end to end on a small workload: every policy, the bound, the CLI and the plot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rstar2_data.terminal import cut_words
from rstar2_scheduler.cli import _print_report, app
from rstar2_scheduler.sim import BenchConfig, BenchReport, LogNormal, WorkloadConfig, run_benchmark
from rstar2_scheduler.sim.bench import sweep_config
from rstar2_scheduler.sim.engine import SimEngineConfig

WORKLOAD = WorkloadConfig(
    prompts=6,
    rollouts_per_prompt=16,
    response_budget=4096,
    turn_tokens=LogNormal(median=300, sigma=1.0),
)
# A small cache, so that a static split overloads it.
ENGINE = SimEngineConfig(num_blocks=2048, max_num_seqs=64)
# The sweep's engines and workload (the defaults), whose size and seed each test sets.
TWO_ENGINES = BenchConfig(engines=2, workload=WorkloadConfig(prompts=1))


@pytest.fixture(scope="module")
def report() -> BenchReport:
    return run_benchmark(BenchConfig(engines=3, workload=WORKLOAD, engine=ENGINE))


def test_every_policy_runs_the_same_work_above_the_bound(report: BenchReport) -> None:
    assert list(report.runs) == [
        "static",
        "static/lockstep",
        "least-loaded",
        "kv-aware",
        "kv-aware/max",
    ]
    decoded = {name: sum(e.decode_tokens for e in run.engines) for name, run in report.runs.items()}
    assert len(set(decoded.values())) == 1  # identical plans, identical output tokens
    for name, run in report.runs.items():
        metrics = run.metrics
        assert metrics.rollouts == WORKLOAD.rollouts
        assert metrics.failed == 0
        assert metrics.makespan_s >= report.bound.bound_s
        assert metrics.balanced_s <= metrics.makespan_s
        if name != "static/lockstep":  # there rollouts also wait for each other between turns
            assert metrics.tool_latency.mean_s == pytest.approx(
                WORKLOAD.tool_latency_s.mean, rel=0.25
            )
        assert metrics.preemptions == sum(e.preemptions for e in run.engines)


def test_lockstep_baseline_waits_for_the_slowest_turn(report: BenchReport) -> None:
    static, lockstep = report.runs["static"], report.runs["static/lockstep"]
    # Same placement; lockstep rollouts sit out the rest of their engine's turn before calling
    # the tool, so the gap between turns grows far beyond the tool latency and the phase slows.
    assert [e.rollouts for e in lockstep.metrics.engines] == [
        e.rollouts for e in static.metrics.engines
    ]
    assert lockstep.metrics.tool_latency.mean_s > 3 * static.metrics.tool_latency.mean_s
    assert lockstep.metrics.makespan_s > static.metrics.makespan_s


def test_kv_aware_is_never_slower_nor_recomputes_more_than_a_static_split(
    report: BenchReport,
) -> None:
    static, kv = report.runs["static"], report.runs["kv-aware"]
    # Each engine's static share (32) fits one batch (64): the batch floor admits it as the
    # static split does. Admission by the forecast alone, which assumed each rollout could
    # reach its whole 4.4K-token reservation, took 77.5 s against the static split's 46.2 s.
    assert kv.metrics.makespan_s <= static.metrics.makespan_s
    assert kv.recomputed_tokens <= static.recomputed_tokens
    assert kv.prefill_tokens <= static.prefill_tokens
    checks = {c.name: c for c in report.targets()}
    assert set(checks) == {
        "idle time cut vs static",
        "rollout-phase speed-up vs static",
        "idle time cut vs static/lockstep",
        "rollout-phase speed-up vs static/lockstep",
        "makespan above lower bound",
    }
    speedup = checks["rollout-phase speed-up vs static"]
    assert speedup.value == pytest.approx(static.metrics.makespan_s / kv.metrics.makespan_s)
    assert speedup.met == (speedup.value >= 1.45)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("prompts", "seed"),
    [
        # 256 rollouts on two engines of 256 sequences: the static split runs each engine's
        # whole share in its first batch, which is as good as it gets; the forecast alone held
        # kv-aware back (149.8 s against 144.8 s) until the batch floor.
        (8, 0),
        # 1,024 rollouts: with the batch floor alone kv-aware took 344.7 s against the static
        # split's 332.0 s: it held new rollouts back while the engine's batch was full, so the
        # last ones started at 109 s instead of 29 s and the long ones among them set the
        # makespan.
        (32, 0),
        # 1,120 rollouts reserving 7.8x the cache: the static split's queue still fits it. While
        # phases of at most two batches per engine were placed at once, the forecast placed this
        # one and took 366.5 s against 342.7 s.
        (35, 2),
    ],
    ids=["one-batch", "two-batches", "fits-the-cache"],
)
def test_kv_aware_is_not_slower_than_a_static_split_on_a_short_phase(
    prompts: int, seed: int
) -> None:
    runs = run_benchmark(sweep_config(TWO_ENGINES, prompts, seed)).runs
    assert runs["kv-aware"].metrics.makespan_s <= runs["static"].metrics.makespan_s


@pytest.mark.slow
def test_kv_aware_beats_the_static_split_once_its_queue_outgrows_the_cache() -> None:
    # 1,248 rollouts reserving 8.7x the cache: the smallest phase of the sweep placed by the
    # forecast. The static split's queue evicts the prefixes of rollouts waiting on tools.
    runs = run_benchmark(sweep_config(TWO_ENGINES, 39, 0)).runs
    static, kv = runs["static"], runs["kv-aware"]
    assert static.metrics.makespan_s > 1.05 * kv.metrics.makespan_s
    assert static.prefill_tokens > 2 * kv.prefill_tokens


def test_report_round_trips_through_json(report: BenchReport) -> None:
    again = BenchReport.model_validate_json(report.model_dump_json())
    assert again == report


def test_cli_prints_the_table_and_writes_plot_and_json(tmp_path: Path) -> None:
    plot, out = tmp_path / "timeline.png", tmp_path / "report.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--engines", "2",
            "--prompts", "2",
            "--rollouts-per-prompt", "8",
            "--budget", "2048",
            "--kv-tokens", "16384",
            "--policy", "static",
            "--policy", "kv-aware",
            "--reservation", "max",
            "--no-lockstep-baseline",
            "--plot", str(plot),
            "--json", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "static" in result.output
    assert "kv-aware" in result.output
    assert "least-loaded" not in result.output
    assert "lower bound" in result.output
    assert plot.read_bytes().startswith(b"\x89PNG")
    saved = json.loads(out.read_text())
    assert set(saved["runs"]) == {"static", "kv-aware/max"}
    assert saved["config"]["reservations"] == ["max"]
    assert saved["config"]["engine"]["num_blocks"] == 1024
    # The saved report can be drawn again without rerunning it.
    again = tmp_path / "again.png"
    result = CliRunner().invoke(app, ["plot", str(out), "--out", str(again)])
    assert result.exit_code == 0, result.output
    assert again.read_bytes().startswith(b"\x89PNG")


def test_report_tables_fit_80_columns_without_cutting_a_word(report: BenchReport) -> None:
    def render(width: int) -> str:
        console = Console(width=width, file=io.StringIO(), record=True)
        _print_report(report, console)
        return console.export_text()

    narrow, wide = render(80), render(1000)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)
    assert "prefill tokens" in wide


@pytest.mark.parametrize("command", [[], ["bench"], ["plot"], ["sweep"]])
def test_help_fits_80_columns_without_cutting_a_word(command: list[str]) -> None:
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "--help"]).output
    wide = CliRunner(env={"COLUMNS": "1000"}).invoke(app, [*command, "--help"]).output
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert not cut_words(narrow, wide)


def test_cli_rejects_an_unknown_policy() -> None:
    result = CliRunner().invoke(app, ["bench", "--policy", "random"])
    assert result.exit_code != 0
    assert "random" in result.output


def test_sweep_writes_every_point_and_kv_aware_places_a_short_phase_as_static_does(
    tmp_path: Path,
) -> None:
    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(
        app, ["sweep", "--prompts", "1", "--prompts", "2", "--seed", "3", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())
    assert [(p["prompts"], p["rollouts"], p["seed"]) for p in points] == [(1, 32, 3), (2, 64, 3)]
    # A phase of at most two batches per engine: kv-aware runs the static split's schedule.
    assert all(p["kv_aware_s"] == p["static_s"] > p["bound_s"] for p in points)
    assert "lowest speed-up 1.000x" in result.stdout
    # Progress goes to stderr (and, transient, leaves nothing there once done): never stdout.
    assert "2/2" not in result.stdout


def test_sweep_runs_the_workload_budget_and_engines_it_is_given(tmp_path: Path) -> None:
    def point(*options: str) -> dict[str, float]:
        out = tmp_path / "sweep.json"
        args = ["sweep", "--prompts", "1", "--seed", "3", "--json", str(out), *options]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        [only] = json.loads(out.read_text())
        return dict(only)

    default = point()
    small_engines = point("--kv-tokens", "16384", "--max-num-seqs", "8")
    short_budget = point("--budget", "1024")
    # Engines of 8 sequences take longer over the same work; a 1,024-token budget is less work.
    assert small_engines["static_s"] > default["static_s"]
    assert short_budget["bound_s"] < default["bound_s"]


def test_rl_bench_reports_each_staleness_on_stdout_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "rl.json"
    result = CliRunner().invoke(
        app,
        [
            "rl-bench",
            *("--engines", "2", "--prompts", "2", "--rollouts-per-prompt", "4", "--steps", "3"),
            *("--staleness", "1", "--staleness", "0", "--json", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    arms = [(run["hardware"], run["max_staleness"]) for run in report["runs"]]
    # Two engines: split hardware, and equal hardware with one of the two GPUs training.
    assert arms == [("split", 0), ("split", 1), ("equal", 0), ("equal", 1)]
    assert [run["gpus"] for run in report["runs"]] == [66, 66, 2, 2]
    assert "0 (sync)" in result.stdout
    assert "target (equal hardware)" in result.stdout
    assert f"report: {out}" in result.stdout
    # Progress goes to stderr (and, transient, leaves nothing there once done): never stdout.
    assert "3/3" not in result.stdout


def test_rl_bench_names_the_options_of_a_refused_run() -> None:
    result = CliRunner().invoke(app, ["rl-bench", "--steps", "2", "--warmup-steps", "2"])
    assert result.exit_code == 2
    assert "'--steps'" in result.output
    assert "warmup_steps (2) must be below steps (2)" in result.output
    result = CliRunner().invoke(app, ["rl-bench", "--steps", "3", "--staleness", "2"])
    assert result.exit_code == 2
    assert "'--steps': steps (3) must exceed warmup_steps (1) + max_staleness (2)" in result.output
    result = CliRunner().invoke(app, ["rl-bench", "--engines", "4", "--trainer-gpus", "4"])
    assert result.exit_code == 2
    assert "'--trainer-gpus'" in result.output
    assert "trainer_gpus (4) must leave engines" in result.output
