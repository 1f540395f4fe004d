"""Scale benchmark of ``rstar2-data build`` and the decontamination report.

Builds the recipe chain of the README (``integer_answer`` -> normalized ``dedup`` -> 8-gram
``decontaminate`` against AIME24/25 and MATH-500 -> shuffled JSONL) over a synthetic corpus of
``--rows`` problems (``synth.py``: 300-800 characters, 2% planted duplicates, 0.5% planted
benchmark copies), each build in a fresh process, and reports wall time, rows/s and peak RSS
(the process's own high-water mark, from ``wait4``), its CPU time (user + system: on a
loaded machine a steadier measure of the work than wall time), and the load average around it.

With ``--baseline-src`` (the ``src`` folder of another rstar2-data, e.g. a checkout of main)
the two builds alternate, round by round, under the same interpreter and load, and the report
gives their ratio and compares their outputs: after undoing each build's seeded shuffle, the
rows both kept must be in the same order, and each row only one kept is classified against the
corpus's ground truth (a planted benchmark copy the other missed, or an ordinary problem the
other flagged). Then ``decontam.py``'s caught and false-flag fractions are added.

    python packages/rstar2-data/bench/bench.py                       # 100K rows
    python packages/rstar2-data/bench/bench.py --rows 1000000 \\
        --baseline-src /tmp/rstar2-main/packages/rstar2-data/src --work /tmp/rstar2-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from decontam import measure
from synth import write

from rstar2_data.output import permutation

BENCHMARKS = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "benchmarks"
RECIPE = """\
name: scale
kind: math
seed: 0
sources:
  - name: synth
    path: {data}
    fields: {{id: uid, problem: question, answer: final_answer}}
filters:
  - {{type: integer_answer}}
  - {{type: dedup, mode: normalized}}
{decontaminate}output: {{format: jsonl, shuffle: true}}
"""
DECONTAMINATE = """\
  - type: decontaminate
    n: 8
    benchmarks:
      - {{name: aime24, path: {benchmarks}/aime24.jsonl}}
      - {{name: aime25, path: {benchmarks}/aime25.jsonl}}
      - {{name: math500, path: {benchmarks}/math500.jsonl}}
"""
CLI = "import sys; from rstar2_data.cli import app; sys.argv[0] = 'rstar2-data'; app()"


def run_build(recipe: Path, out: Path, src: Path | None) -> dict[str, Any]:
    """One build in a fresh process (``src`` first on the path when given)."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", CLI, "build", str(recipe), "--out", str(out), "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    assert process.stderr is not None
    error = process.stderr.read().decode()
    if status != 0:
        raise RuntimeError(f"build failed ({status}): {error[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "rows_out": manifest["rows"],
        "filters": manifest["filters"],
    }


def unshuffled_ids(data: Path, seed: int = 0) -> list[str]:
    """The ids of a build's rows in the order before its seeded shuffle."""
    ids = [json.loads(line)["id"] for line in data.open(encoding="utf-8")]
    order = permutation(len(ids), f"{seed}:shuffle")
    before = [""] * len(ids)
    for position, row in enumerate(order):
        before[row] = ids[position]
    return before


def compare(baseline: Path, new: Path, corpus: Path) -> dict[str, Any]:
    """How the two outputs differ, classified by the corpus's planted ground truth."""
    planted = {}
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if '"planted"' in line:
                row = json.loads(line)
                planted[row["uid"]] = row["planted"]
    old, fresh = unshuffled_ids(baseline), unshuffled_ids(new)
    old_set, fresh_set = set(old), set(fresh)
    same_order = [i for i in old if i in fresh_set] == [i for i in fresh if i in old_set]

    def kinds(ids: set[str]) -> dict[str, int]:
        return dict(
            Counter(
                f"planted copy ({planted[i].split('/')[1]})" if i in planted else "ordinary"
                for i in ids
            )
        )

    return {
        "identical_bytes": baseline.read_bytes() == new.read_bytes(),
        "common_rows_in_same_order": same_order,
        "only_in_baseline": kinds(old_set - fresh_set),
        "only_in_new": kinds(fresh_set - old_set),
        "planted_copies_left": {
            "baseline": len(old_set & planted.keys()),
            "new": len(fresh_set & planted.keys()),
            "planted": len(planted),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the synthetic corpus")
    parser.add_argument("--rounds", type=int, default=1, help="builds of each side")
    parser.add_argument(
        "--baseline-src", type=Path, help="src folder of the rstar2-data to compare against"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/rstar2-data-bench"))
    parser.add_argument("--benchmarks", type=Path, default=BENCHMARKS)
    parser.add_argument(
        "--no-decontaminate",
        action="store_true",
        help="leave the decontaminate filter out (then the outputs must be byte-identical)",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / f"synth-{args.rows}.jsonl"
    if not corpus.is_file():
        write(corpus, rows=args.rows, seed=0, benchmarks=args.benchmarks)
    recipe = args.work / "recipe.yaml"
    decontaminate = "" if args.no_decontaminate else DECONTAMINATE
    recipe.write_text(
        RECIPE.format(data=corpus, decontaminate=decontaminate.format(benchmarks=args.benchmarks))
    )
    sides = {"new": None}
    if args.baseline_src is not None:
        sides = {"baseline": args.baseline_src.resolve(), "new": None}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, src in sides.items():
            result = run_build(recipe, args.work / f"out-{side}", src)
            result["rows_per_s"] = round(args.rows / result["wall_s"])
            runs[side].append(result)
            print(f"round {round_ + 1} {side}: {result}", file=sys.stderr)
    report: dict[str, Any] = {"rows": args.rows, "cpus": os.cpu_count(), "runs": runs}
    if "baseline" in runs:
        pairs = list(zip(runs["baseline"], runs["new"], strict=True))
        report["speedup_wall"] = [round(b["wall_s"] / n["wall_s"], 2) for b, n in pairs]
        report["speedup_cpu"] = [round(b["cpu_s"] / n["cpu_s"], 2) for b, n in pairs]
        report["outputs"] = compare(
            args.work / "out-baseline" / "data.jsonl", args.work / "out-new" / "data.jsonl", corpus
        )
    report["decontamination"] = {
        k: v
        for k, v in measure(args.benchmarks, seed=0, ordinary=20_000).items()
        if k not in ("missed", "amc23_flags")
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
