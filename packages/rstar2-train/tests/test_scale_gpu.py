"""bench/scale_gpu.py: each row in a process of its own under its own time cap, a budget over
the whole run, and a CPU smoke run of every row (so the GPU benchmark cannot rot between GPU
runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
SCRIPT = BENCH / "scale_gpu.py"
sys.path.insert(0, str(BENCH))

from isolated_rows import Row, run_rows  # noqa: E402  (the bench folder is not a package)
from row_targets import behave  # noqa: E402


def rows(*labels: str, cap_s: float = 30.0) -> list[Row]:
    return [Row(f"t/{i}-{label}", "test", label, cap_s) for i, label in enumerate(labels)]


def test_a_stalled_failed_or_crashed_row_costs_that_row_only() -> None:
    started = time.perf_counter()
    plan = rows("finish", "stall", "fail", "crash", "finish", cap_s=3.0)
    outcomes = run_rows(plan, {}, budget_s=60, target=behave, preload=["row_targets"])
    elapsed = time.perf_counter() - started
    assert [o["status"] for o in outcomes] == ["ok", "timed out", "failed", "failed", "ok"]
    finished, stalled, failed, crashed, after = outcomes
    assert finished["value"] == after["value"] == 1
    assert stalled["error"] == "stopped at its cap of 3.0 s"
    assert stalled["reached"].startswith("stalling (+")  # how far it got
    assert 3.0 <= stalled["seconds"] < 10
    assert failed["error"] == "ValueError: no"
    assert crashed["error"] == "the process ended with code 3"
    pids = {o["pid"] for o in outcomes}
    assert len(pids) == len(plan)
    assert os.getpid() not in pids
    assert elapsed < 40  # the stalled row was stopped, not waited for


def test_the_budget_caps_the_run_and_rows_left_over_are_recorded() -> None:
    plan = [*rows("finish", "stall", cap_s=60.0), Row("t/last", "test", "finish", 60.0)]
    started = time.perf_counter()
    outcomes = run_rows(
        plan, {"work_s": 0.5}, budget_s=15.0, target=behave, preload=["row_targets"], min_start_s=2
    )
    elapsed = time.perf_counter() - started
    assert [o["status"] for o in outcomes] == ["ok", "timed out", "not run"]
    assert outcomes[2]["error"].startswith("budget spent")
    assert elapsed < 25  # the stalled row got what was left of the budget, not its 60 s cap
    skipped = run_rows(
        [Row("t/s", "test", "finish", 5.0, skip="no GPU")], {}, budget_s=5, target=behave,
        preload=["row_targets"],
    )  # fmt: skip
    assert skipped == [{"id": "t/s", "label": "finish", "status": "skipped", "error": "no GPU"}]


@pytest.mark.slow  # the tiny model through every row, each row a process: 1-2 min on 2 cores
def test_tiny_run_measures_every_row_in_its_own_process(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    command = [
        sys.executable, str(SCRIPT), "--tiny", "--json", str(out), "--cap", "tiny/packing-off=0.2"
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(out.read_text())
    by_id = {row["id"]: row for row in results["rows"]}
    order = [
        "tiny/naive", "tiny/rstar2", "tiny/naive-bf16", "tiny/rstar2-fsdp", "tiny/generate",
        "tiny/engine", "tiny/engine-compiled", "tiny/weight-sync", "tiny/packing-off",
        "tiny/sdpa-packed", "tiny/checkpointing",
    ]  # fmt: skip
    assert list(by_id) == order
    # stdout: one JSON line per row as it ended, in order, then the summary with the ratios;
    # the table went to stderr.
    lines = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [line["id"] for line in lines[:-1]] == order
    assert lines[-1]["summary"]["rows"] == results["rows"]
    assert "| row | status | first step s | tokens/s |" in completed.stderr
    # The capped row was stopped and the rows after it still ran.
    assert by_id["tiny/packing-off"]["status"] == "timed out"
    measured = [row for row in results["rows"] if row["status"] == "ok"]
    assert len(measured) == len(order) - 1
    assert len({row["pid"] for row in measured}) == len(measured)  # one process each
    for name in ("naive", "naive-bf16", "rstar2", "rstar2-fsdp", "sdpa-packed", "checkpointing"):
        row = by_id[f"tiny/{name}"]
        assert row["tokens_per_step"] == 8 * 64  # lengths 16 to 112, mean 64
        assert row["tokens_per_s"] > 0
        assert 0 < row["first_update_s"] <= row["time_to_first_step_s"]
    # Both sides train the same real tokens in micro-batches of the same budget; the naive
    # loop's padding is counted in its budget, not in its tokens/s.
    naive, rstar2 = by_id["tiny/naive"], by_id["tiny/rstar2"]
    assert naive["tokens_per_step"] == rstar2["tokens_per_step"]
    assert naive["micro_batch_tokens"] == rstar2["micro_batch_tokens"] == 256
    assert naive["padded_tokens"] > naive["tokens_per_step"]  # the lengths vary
    for name in ("rstar2", "rstar2-fsdp", "checkpointing"):
        row = by_id[f"tiny/{name}"]
        assert row["speed_vs_naive"] > 0
        # The GPU's packed-row kernel, as its reference kernel on the CPU.
        assert row["attention"] == "varlen_attention"
        assert row["compile_s"] == 0.0
        assert row["estimated_peak_gib"] > 0
    assert by_id["tiny/sdpa-packed"]["attention"] == "sdpa"
    assert by_id["tiny/checkpointing"]["activation_checkpointing"] is True
    generate, engine = by_id["tiny/generate"], by_id["tiny/engine"]
    compiled = by_id["tiny/engine-compiled"]
    assert generate["generated_tokens"] == engine["generated_tokens"] == 4 * 8
    assert engine["decode"] == compiled["decode"] == "SlotBatch"
    assert engine["compile_s"] == 0.0
    # The compiled row compiled for real, overran its budget and decoded eagerly after.
    assert compiled["compile"] is True
    assert compiled["compile_s"] > 0
    assert compiled["compiled_at_end"] is False
    assert compiled["generated_tokens"] == 4 * 8
    assert engine["speed_vs_generate"] > 0
    sync = by_id["tiny/weight-sync"]
    assert sync["gather_full_weights_s"] >= 0
    assert sync["engine_update_weights_s"] >= 0
    assert "start tiny/naive" in completed.stderr
    assert "end   tiny/packing-off: timed out" in completed.stderr


@pytest.mark.slow  # imports torch and transformers in a fresh interpreter (~10-20 s)
def test_the_bench_imports_nothing_a_bare_gpu_image_lacks_beyond_its_wheels() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import scale_gpu, gpu_rows; "
        "heavy = {'ray', 'vllm', 'datasets', 'math_verify', 'redis'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert completed.stdout.strip() == "[]"
