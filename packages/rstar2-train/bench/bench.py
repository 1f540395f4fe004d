"""Seconds per GRPO step: rstar2-train against TRL's ``GRPOTrainer`` on the same workload.

One configuration (``workload.Workload``): the same starting checkpoint (a tiny Qwen3 briefly
SFT'd by rstar2 so that it answers some problems), the same prompts in the same order, the same
group size, token budget, temperature, learning rate, AdamW, clip range and token-mean loss, no KL
term, fp32 on the CPU, one optimizer step per step, single-turn (rstar2: ``max_turns=1``, RoC
off), and the same reward: rstar2-eval's grader on the completion, 0 when truncated.

Arms (``arms.py``) pair an rstar2 setting with a TRL setting: by default both generate on the
same number of torch threads (``--generation-threads``, 1), and ``as-is`` keeps the settings of
the benchmark before it set them equal. Every setting the arms name trains a fresh run of
``--steps`` steps in each round, all in one process, the order reversed every other round so
drifting machine load hits all alike; the first ``--warmup`` steps of every run are discarded.
A step's time is the wall time between the ends of consecutive steps (generation, rewards,
update, weight sync, logging). Each step also records the rollouts and tokens it trained on.
``--passes`` repeats the whole measurement and reports every figure's range over the passes.
TRL must be installed (the root ``bench`` dependency group: ``uv sync --group bench``).

    python packages/rstar2-train/bench/bench.py             # equal and as-is, 3 rounds of 4 steps
    python packages/rstar2-train/bench/bench.py --arms as-is equal@1 equal@2 all-groups@1 \\
        unshared@1 --rounds 6 --passes 2 --json out.json  # the README's table
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from arms import ARM_KINDS, Arm, Framework, RunSpec, distinct_runs, parse_arm
from rstar2_side import run_rstar2
from workload import Prepared, StepRecord, Workload, prepare

from rstar2_train import load_config

try:
    from trl_side import run_trl
except ModuleNotFoundError as missing:  # TRL is in the root bench group, not in any package
    if missing.name not in ("trl", "datasets"):
        raise
    raise SystemExit(
        f"{missing.name} is not installed: run `uv sync --group bench` (or `uv run nox -s bench`)"
    ) from missing

Runner = Callable[..., list[StepRecord]]
RUNNERS: dict[Framework, Runner] = {"rstar2": run_rstar2, "trl": run_trl}
DEFAULT_ARMS = ["equal", "as-is"]


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def measure(
    prepared: Prepared, runs: list[RunSpec], *, rounds: int, steps: int, warmup: int, work: Path
) -> dict[str, list[list[StepRecord]]]:
    """Every setting once per round for ``rounds`` rounds; its measured steps of each round,
    by label."""
    measured: dict[str, list[list[StepRecord]]] = {spec.label: [] for spec in runs}
    for round_ in range(rounds):
        for spec in runs if round_ % 2 == 0 else runs[::-1]:
            logging.info(
                "round %d/%d: %s, %d steps (load %s)",
                round_ + 1,
                rounds,
                spec.label,
                steps,
                _load(),
            )
            folder = work / f"{spec.label.replace(' ', '-')}-{round_}"
            records = RUNNERS[spec.framework](prepared, spec, steps=steps, out_dir=folder)
            if len(records) != steps:
                raise RuntimeError(f"{spec.label} ran {len(records)} steps, expected {steps}")
            measured[spec.label].append(records[warmup:])
            logging.info("%s: %s s/step", spec.label, " ".join(f"{r.seconds:.2f}" for r in records))
    return measured


def summary(records: list[StepRecord]) -> dict[str, float]:
    seconds = [r.seconds for r in records]
    out = {
        "steps": float(len(seconds)),
        "mean_s": statistics.fmean(seconds),
        "median_s": statistics.median(seconds),
        "stdev_s": statistics.stdev(seconds) if len(seconds) > 1 else 0.0,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "reward_mean": statistics.fmean(r.reward for r in records),
        "completion_tokens_mean": statistics.fmean(r.completion_tokens for r in records),
        "trained_rollouts_mean": statistics.fmean(r.trained_rollouts for r in records),
        "trained_tokens_mean": statistics.fmean(r.trained_tokens for r in records),
    }
    phases = sorted({k for r in records for k in r.phases})
    for phase in phases:
        out[phase] = statistics.fmean(r.phases[phase] for r in records if phase in r.phases)
    return out


def _mean_s(records: list[StepRecord]) -> float:
    return statistics.fmean(r.seconds for r in records)


def arm_figures(
    arm: Arm, runs: dict[str, dict[str, float]], rounds: dict[str, list[list[StepRecord]]]
) -> dict[str, Any]:
    """One arm's two sides from the summaries of their settings, and the ratios.

    Besides the ratio of the means, each round's ratio: the two runs of a round ran minutes
    apart at most, so the median of these is the figure least moved by load that drifts.
    """
    rstar2, trl = runs[arm.rstar2.label], runs[arm.trl.label]
    paired = [
        _mean_s(trl_round) / _mean_s(rstar2_round)
        for rstar2_round, trl_round in zip(
            rounds[arm.rstar2.label], rounds[arm.trl.label], strict=True
        )
    ]
    figures: dict[str, Any] = {
        "trl_over_rstar2": trl["mean_s"] / rstar2["mean_s"],
        "round_ratios": paired,
        "round_ratio_median": statistics.median(paired),
    }
    for side, values in (("rstar2", rstar2), ("trl", trl)):
        for key in ("mean_s", "trained_rollouts_mean", "trained_tokens_mean"):
            figures[f"{side}_{key}"] = values[key]
    return figures


def _span(values: list[float], digits: int) -> str:
    low, high = min(values), max(values)
    if round(low, digits) == round(high, digits):
        return f"{low:.{digits}f}"
    return f"{low:.{digits}f}-{high:.{digits}f}"


def arms_table(arms: list[Arm], passes: list[dict[str, Any]]) -> str:
    """The arms as a Markdown table (means over the measured steps); each cell is the range
    over the passes."""
    lines = [
        "| arm | rstar2 s/step | TRL s/step | TRL / rstar2 | TRL / rstar2, median of rounds "
        "| rstar2 trained rollouts, tokens / step | TRL trained rollouts, tokens / step |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        figures = [result["arms"][arm.name] for result in passes]

        def cell(key: str, digits: int, figures: list[dict[str, Any]] = figures) -> str:
            return _span([f[key] for f in figures], digits)

        lines.append(
            f"| {arm.name} ({arm.rstar2.label} / {arm.trl.label}) | {cell('rstar2_mean_s', 3)} "
            f"| {cell('trl_mean_s', 3)} | {cell('trl_over_rstar2', 2)} "
            f"| {cell('round_ratio_median', 2)} "
            f"| {cell('rstar2_trained_rollouts_mean', 1)}, {cell('rstar2_trained_tokens_mean', 0)} "
            f"| {cell('trl_trained_rollouts_mean', 1)}, {cell('trl_trained_tokens_mean', 0)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="arm kinds (KIND or KIND@N): "
        + "; ".join(f"{kind}: {text}" for kind, text in ARM_KINDS.items()),
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=DEFAULT_ARMS,
        metavar="KIND[@N]",
        help="Arms to compare; N is the generation threads of both sides (default: "
        "--generation-threads). Settings shared by several arms run once per round. "
        f"Default: {' '.join(DEFAULT_ARMS)}.",
    )
    parser.add_argument(
        "--generation-threads",
        type=int,
        default=1,
        help="torch threads both sides generate on in arms without @N (the rstar2 engine's "
        "rl.engines.torch_threads, TRL's model.generate); updates keep torch's default.",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="Rounds; each trains one fresh run of every setting."
    )
    parser.add_argument("--steps", type=int, default=4, help="Steps per run, warm-up included.")
    parser.add_argument(
        "--warmup", type=int, default=1, help="Steps discarded at each run's start."
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="Repeat the whole measurement (all rounds) this many times; figures give the range.",
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
    parser.add_argument("--json", type=Path, default=None, help="Write the figures here too.")
    args = parser.parse_args()
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be at least 0 and less than --steps")
    for name in ("generation_threads", "rounds", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    tiny_rl = load_config("tiny-rl").rl
    assert tiny_rl is not None
    tiny_rl_threads = tiny_rl.engines.torch_threads
    as_is = (tiny_rl_threads or torch.get_num_threads(), torch.get_num_threads())
    try:
        arms = [parse_arm(text, threads=args.generation_threads, as_is=as_is) for text in args.arms]
    except ValueError as error:
        parser.error(str(error))
    if len({arm.name for arm in arms}) != len(arms):
        parser.error(f"--arms names an arm twice: {args.arms}")
    runs = distinct_runs(arms)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rstar2-train-bench-") as tmp:
        work = args.work or Path(tmp)
        if args.prepared is not None:
            prepared = Prepared.load(args.prepared)
        else:
            prepared = prepare(Workload(sft_steps=args.sft_steps), work / "workload")
            prepared.save(work / "workload" / "prepared.json")
        passes: list[dict[str, Any]] = []
        for pass_ in range(args.passes):
            load_before, pass_started = _load(), time.perf_counter()
            measured = measure(
                prepared,
                runs,
                rounds=args.rounds,
                steps=args.steps,
                warmup=args.warmup,
                work=work / f"pass-{pass_}",
            )
            summaries = {
                label: summary([r for round_ in records for r in round_])
                for label, records in measured.items()
            }
            passes.append(
                {
                    "load_before": load_before,
                    "load_after": _load(),
                    "wall_s": time.perf_counter() - pass_started,
                    "runs": summaries,
                    "arms": {arm.name: arm_figures(arm, summaries, measured) for arm in arms},
                }
            )
    result = {
        "workload": prepared.workload.model_dump(),
        "arms": {arm.name: arm.model_dump() for arm in arms},
        "torch_threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "warmup_steps": args.warmup,
        "wall_s": time.perf_counter() - started,
        "passes": passes,
    }
    print(json.dumps(result, indent=2))
    for number, figures in enumerate(passes, start=1):
        print(
            f"\npass {number}/{len(passes)}: load {figures['load_before']} -> "
            f"{figures['load_after']}, {figures['wall_s']:.0f} s"
        )
        for label, run in figures["runs"].items():
            print(
                f"{label:>26}: {run['mean_s']:.3f} ± {run['stdev_s']:.3f} s/step "
                f"(median {run['median_s']:.3f}, min {run['min_s']:.3f}, max {run['max_s']:.3f}, "
                f"n={int(run['steps'])}); "
                f"trains {run['trained_rollouts_mean']:.1f} rollouts, "
                f"{run['trained_tokens_mean']:.0f} tokens / step; reward {run['reward_mean']:.2f}"
            )
    print(f"\n{arms_table(arms, passes)}\n\n{result['wall_s']:.0f} s in all")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
