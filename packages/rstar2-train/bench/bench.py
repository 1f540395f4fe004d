"""Seconds per GRPO step: rstar2-train against TRL's ``GRPOTrainer`` on the same workload.

One configuration (``workload.Workload``): the same starting checkpoint (a tiny Qwen3 briefly
SFT'd by rstar2 so that it answers some problems), the same prompts in the same order, the same
group size, token budget, temperature, learning rate, AdamW, clip range and token-mean loss, no KL
term, fp32 on the CPU, one optimizer step per step, single-turn (rstar2: ``max_turns=1``, RoC
off), and the same reward: rstar2-eval's grader on the completion, 0 when truncated.

The two frameworks alternate in one process: each round trains a fresh run of ``--steps`` steps
on each side (the first side alternates round by round, so drifting machine load hits both
alike), and the first ``--warmup`` steps of every run are discarded. A step's time is the wall
time between the ends of consecutive steps (generation, rewards, update, weight sync, logging).
TRL must be installed (the root ``bench`` dependency group: ``uv sync --group bench``).

    python packages/rstar2-train/bench/bench.py                      # 3 rounds of 4 steps
    python packages/rstar2-train/bench/bench.py --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rstar2_side import run_rstar2
from workload import Prepared, StepRecord, Workload, prepare

try:
    from trl_side import run_trl
except ModuleNotFoundError as missing:  # TRL is in the root bench group, not in any package
    if missing.name not in ("trl", "datasets"):
        raise
    raise SystemExit(
        f"{missing.name} is not installed: run `uv sync --group bench` (or `uv run nox -s bench`)"
    ) from missing

Runner = Callable[..., list[StepRecord]]
SIDES: dict[str, Runner] = {
    "rstar2": run_rstar2,
    "trl": run_trl,
    # Every rollout recomputing its prompt (padded rows, as TRL's), to show what sharing saves.
    "rstar2-unshared": functools.partial(run_rstar2, overrides=["rl.shared_prefix=false"]),
}


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def measure(
    prepared: Prepared, sides: list[str], *, rounds: int, steps: int, warmup: int, work: Path
) -> dict[str, list[StepRecord]]:
    """Alternate the sides for ``rounds`` rounds; every measured step of each side."""
    measured: dict[str, list[StepRecord]] = {name: [] for name in sides}
    order = list(sides)
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            logging.info(
                "round %d/%d: %s, %d steps (load %s)", round_ + 1, rounds, name, steps, _load()
            )
            records = SIDES[name](prepared, steps=steps, out_dir=work / f"{name}-{round_}")
            if len(records) != steps:
                raise RuntimeError(f"{name} ran {len(records)} steps, expected {steps}")
            measured[name].extend(records[warmup:])
            logging.info("%s: %s s/step", name, " ".join(f"{r.seconds:.2f}" for r in records))
    return measured


def summary(records: list[StepRecord]) -> dict[str, float]:
    seconds = [r.seconds for r in records]
    out = {
        "steps": float(len(seconds)),
        "mean_s": statistics.fmean(seconds),
        "stdev_s": statistics.stdev(seconds) if len(seconds) > 1 else 0.0,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "reward_mean": statistics.fmean(r.reward for r in records),
        "completion_tokens_mean": statistics.fmean(r.completion_tokens for r in records),
    }
    phases = sorted({k for r in records for k in r.phases})
    for phase in phases:
        out[phase] = statistics.fmean(r.phases[phase] for r in records if phase in r.phases)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="Rounds; each trains one fresh run of every side."
    )
    parser.add_argument("--steps", type=int, default=4, help="Steps per run, warm-up included.")
    parser.add_argument(
        "--warmup", type=int, default=1, help="Steps discarded at each run's start."
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=Workload().sft_steps,
        help="SFT steps that make the starting checkpoint (ignored with --prepared).",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="Folder for the runs (default: a temporary one)."
    )
    parser.add_argument(
        "--prepared", type=Path, default=None, help="Reuse a prepared.json from an earlier --work."
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=list(SIDES),
        default=list(SIDES),
        help="Configurations to run (rstar2 and trl are needed for the ratio).",
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here too.")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be at least 0 and less than --steps")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="rstar2-train-bench-") as tmp:
        work = args.work or Path(tmp)
        if args.prepared is not None:
            prepared = Prepared.load(args.prepared)
        else:
            prepared = prepare(Workload(sft_steps=args.sft_steps), work / "workload")
            prepared.save(work / "workload" / "prepared.json")
        load_before = _load()
        started = time.perf_counter()
        measured = measure(
            prepared,
            args.sides,
            rounds=args.rounds,
            steps=args.steps,
            warmup=args.warmup,
            work=work,
        )
        result = {
            "workload": prepared.workload.model_dump(),
            "rounds": args.rounds,
            "steps_per_run": args.steps,
            "warmup_steps": args.warmup,
            "load_before": load_before,
            "load_after": _load(),
            "wall_s": time.perf_counter() - started,
            "sides": {name: summary(records) for name, records in measured.items()},
        }
    sides = result["sides"]
    if "rstar2" in sides and "trl" in sides:
        result["trl_over_rstar2"] = sides["trl"]["mean_s"] / sides["rstar2"]["mean_s"]
    print(json.dumps(result, indent=2))
    print(f"\nload {result['load_before']} -> {result['load_after']}")
    for name, figures in sides.items():
        print(
            f"{name:>14}: {figures['mean_s']:.3f} ± {figures['stdev_s']:.3f} s/step "
            f"(min {figures['min_s']:.3f}, max {figures['max_s']:.3f}, n={int(figures['steps'])})"
        )
    if "trl_over_rstar2" in result:
        print(f"TRL / rstar2 seconds per step: {result['trl_over_rstar2']:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
