"""bench/scale_gpu.py's CPU smoke run: every row of the GPU benchmark runs and is compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "bench" / "scale_gpu.py"


@pytest.mark.slow  # a tiny model through every row: about a minute on 2 cores
def test_tiny_run_measures_every_row_against_its_baseline(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    command = [sys.executable, str(SCRIPT), "--tiny", "--json", str(out)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(out.read_text())
    update = results["update"]
    assert update[0]["label"].startswith("naive")
    assert len(update) == 5
    for row in update:
        assert "error" not in row
        assert row["tokens_per_s"] > 0
        assert row["tokens_per_step"] == 8 * 64
    for row in update[1:]:
        assert row["speed_vs_naive"] > 0
        assert row["attention"] == "sdpa"  # auto on a CPU
    assert [row["packing"] for row in update[1:]] == [True, False, True, True]
    naive, engine = results["generate"]
    assert naive["generated_tokens"] == engine["generated_tokens"] == 4 * 8
    assert engine["decode"] == "PaddedBatch"
    assert engine["speed_vs_generate"] > 0
    assert "| update step | tokens/s | vs naive |" in completed.stdout
