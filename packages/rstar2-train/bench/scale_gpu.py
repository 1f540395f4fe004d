"""rstar2's update step and TransformersEngine on one GPU, against what a user would write
instead, in the same run; every row in its own process, under its own time cap.

Models: random weights of the Qwen3-0.6B and Qwen3-4B shapes, built from their configs on the
GPU (no hub access). Workload: ``--sequences`` sequences a step whose lengths spread evenly
over a quarter to 1.75x ``--length`` (mean ``--length``), shuffled, as RL responses are; the
first quarter of each is prompt, the rest trained. Rows, in the order they run (most important
first):

- ``naive`` (per shape): the baseline a user writes: the transformers model with float32
  parameters under bf16 autocast (a float32 residual stream), AdamW as rstar2 runs it (fused on
  CUDA), padded micro-batches of consecutive sequences within the same token budget as rstar2's
  plan (padding counted in the budget), the full logits and a float32 log-softmax.
- ``naive-bf16`` (per shape): the same with bf16 parameters (a bf16 residual stream as rstar2's,
  bf16 AdamW moments where rstar2 keeps float32 ones).
- ``rstar2`` (per shape): what a stage on one GPU runs: the in-process ``Actor`` (float32 master
  weights and moments, bf16 compute), ``token_logprobs`` (fused chunked LM head), attention
  ``auto`` (``varlen_attention`` for packed rows on a GPU), packed rows, and the memory plan
  (micro-batch tokens and activation checkpointing fitted to the free memory).
- ``rstar2-fsdp`` (per shape): the same through one ``TrainerRank`` (FSDP2 on one rank).
- ``generate``, ``engine`` and ``engine-compiled`` (0.6B): ``--requests`` prompts of
  ``--prompt`` tokens, ``--new-tokens`` sampled each at temperature 1: ``model.generate`` on the
  whole batch, then TransformersEngine with every request in flight (slot decoding), eager
  (its default) and with its decode step compiled (CUDA graphs) under
  ``--engine-compile-budget-s``; each engine row times a first pass and a second one, so the
  compiled row's first pass (with its compile time) sets against the eager row's.
- ``weight-sync`` (0.6B): the rank's full-weight gather in the compute dtype and the engine's
  ``update_weights`` of those weights.
- variants (0.6B unless named): packing off; packed rows under ``sdpa`` (a dense document
  mask); activation checkpointing (also 4B); with ``--with-flex``, packed rows under
  ``flex_attention`` (compiles Triton kernels in its first step: on an H200 with torch 2.11 its
  first step had not finished after 120 s, so it is not run by default).

Each update row reports time to first step (from the row's start: model build, trainer set-up,
the first update with any compilation) beside its steady tokens/s (real tokens, padding not
counted; mean of ``--steps`` steps after the ``--warmup`` steps), peak memory, the memory
plan's estimate and MFU (6 x parameters x tokens/s over the GPU's dense bf16 peak); rstar2 rows
also as ratios to their shape's ``naive`` row.

A row runs in a process of its own (forked from a server that has imported torch once), so it
starts with the GPU's memory to itself and a stall, an OOM or a crash ends that row only: it is
recorded with how far it got (its last progress event) and the next row starts. Each row's
outcome is printed to stdout as one JSON line as soon as it ends (and ``--json`` is rewritten),
so a run killed midway leaves every finished row machine-readable; a timestamped line goes to
stderr as each row starts and ends, and the table goes to stderr at the end (``--table`` on
stdout instead). ``--budget-s`` caps the whole run (a row gets at most what is left; rows that
no longer fit are recorded as not run); ``--cap ROW=SECONDS`` changes one row's cap.

    python packages/rstar2-train/bench/scale_gpu.py --json gpu.json    # 0.6B and 4B, <= 480 s
    python packages/rstar2-train/bench/scale_gpu.py --only '4b/*'
    python packages/rstar2-train/bench/scale_gpu.py --tiny             # CPU smoke run (tests)

``--tiny`` runs every row on a tiny model on the CPU, with the packed rows under
``varlen_attention`` (its per-sequence reference kernel there) and the compiled engine row
compiling for real under a budget it overruns, so the fall-back to eager decoding runs too.

On a GPU machine whose Python has torch, transformers, aiohttp, typer, pyyaml and rich and no
package index (nothing here imports ray, vllm, datasets, math-verify or redis): in a checkout,
``uv build --all-packages --out-dir dist`` and ``pip download --only-binary=:all: --dest dist
pydantic prometheus-client`` (with the GPU machine's ``--python-version``/``--platform``); copy
``dist/`` and this ``bench/`` folder there, ``pip install --no-deps dist/*.whl``, and run
``python bench/scale_gpu.py``.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import transformers
from gpu_rows import PRELOAD, child
from isolated_rows import Row, run_rows

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "MI300X": 1307.0}
"""Dense bf16 peak of a GPU by the model in its name (``--peak-tflops`` overrides)."""
NAIVE_LABEL = "naive: fp32 weights under autocast, padded rows, full logits"
NAIVE_BF16_LABEL = "naive: bf16 weights, padded rows, full logits"
RSTAR2_LABEL = "rstar2 default (in-process, auto attention, packed, planned)"
FSDP_LABEL = "rstar2 on one FSDP2 rank (auto attention, packed, planned)"


def update_rows(shape: str, cap_s: float) -> list[Row]:
    """The naive baselines and rstar2's two update paths for ``shape``."""
    return [
        Row(f"{shape}/naive", "naive", NAIVE_LABEL, cap_s, plan=True),
        Row(f"{shape}/rstar2", "rstar2", RSTAR2_LABEL, cap_s, plan=True),
        Row(f"{shape}/naive-bf16", "naive", NAIVE_BF16_LABEL, cap_s, plan=True, weights="bfloat16"),
        Row(f"{shape}/rstar2-fsdp", "rstar2-fsdp", FSDP_LABEL, cap_s, plan=True),
    ]


def default_rows(shapes: list[str], *, on_gpu: bool, flex: bool = False) -> list[Row]:
    """The rows of a run over ``shapes``, most important first."""
    first, *rest = shapes
    large = rest[0] if rest else None
    rows = update_rows(first, 60)
    if large is not None:
        rows += update_rows(large, 90)
    rows += [
        Row(f"{first}/generate", "generate", "model.generate, whole batch", 60),
        Row(f"{first}/engine", "engine", "TransformersEngine, eager slot decoding", 60),
        Row(
            f"{first}/engine-compiled",
            "engine",
            "TransformersEngine, compiled slot decoding",
            120,
            compile=True,
        ),
        Row(f"{first}/weight-sync", "weight-sync", "weight sync: gather + update_weights", 45),
        Row(f"{first}/packing-off", "rstar2", "rstar2, packing off", 45, packing=False),
        Row(
            f"{first}/sdpa-packed", "rstar2", "rstar2, packed rows under sdpa", 45, attention="sdpa"
        ),
        Row(
            f"{first}/checkpointing",
            "rstar2",
            "rstar2 + activation checkpointing",
            45,
            checkpointing=True,
        ),
    ]
    if large is not None:
        rows.append(
            Row(
                f"{large}/checkpointing",
                "rstar2",
                "rstar2 + activation checkpointing",
                90,
                checkpointing=True,
            )
        )
    if flex:
        no_backward = None if on_gpu else "FlexAttention has no backward pass on a CPU"
        rows.append(
            Row(
                f"{first}/flex",
                "rstar2",
                "rstar2, packed rows under flex_attention (compiles)",
                120,
                attention="flex_attention",
                skip=no_backward,
            )
        )
    return rows


def peak_tflops(args: argparse.Namespace, name: str) -> float | None:
    if args.peak_tflops is not None:
        return float(args.peak_tflops)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def add_ratios(rows: list[dict[str, Any]], peak: float | None) -> None:
    """MFU of each update row; each rstar2 row's tokens/s and peak memory over its shape's
    baseline; the engine's tokens/s over ``model.generate``'s."""
    by_id = {row["id"]: row for row in rows if row.get("status") == "ok"}
    for row in by_id.values():
        shape = row["id"].split("/")[0]
        if "tokens_per_step" in row and peak is not None:
            row["mfu"] = 6 * row["parameters_m"] * 1e6 * row["tokens_per_s"] / (peak * 1e12)
        naive = by_id.get(f"{shape}/naive")
        if "tokens_per_step" in row and naive is not None and row is not naive:
            row["speed_vs_naive"] = row["tokens_per_s"] / naive["tokens_per_s"]
            if row.get("peak_memory_gib") and naive.get("peak_memory_gib"):
                row["memory_vs_naive"] = row["peak_memory_gib"] / naive["peak_memory_gib"]
        generate = by_id.get(f"{shape}/generate")
        if "decode" in row and generate is not None:
            row["speed_vs_generate"] = row["tokens_per_s"] / generate["tokens_per_s"]
    for row in by_id.values():
        eager = by_id.get(row["id"].removesuffix("-compiled"))
        if row.get("compile") and eager is not None and eager is not row:
            # Tokens after which compiling has paid for its first pass: the compiled row's extra
            # first-pass time over what each token saves.
            extra = row["first_pass_s"] - eager["first_pass_s"]
            saved = 1 / eager["tokens_per_s"] - 1 / row["tokens_per_s"]
            row["break_even_tokens"] = extra / saved if saved > 0 else None


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['device']}, torch {results['torch']}, transformers "
        f"{results['transformers']}, {results['date']}, {results['elapsed_s']:.0f} s in all",
        "| row | status | first step s | tokens/s | vs baseline | peak GiB | vs baseline | MFU "
        "| notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(row: dict, key: str, fmt: str) -> str:
        value = row.get(key)
        return format(value, fmt) if isinstance(value, int | float) else "-"

    for row in results["rows"]:
        if row["status"] != "ok":
            note = row.get("error", "")
            if row.get("reached"):
                note += f"; last reached: {row['reached']}"
            lines.append(f"| {row['id']} | {row['status']} | | | | | | | {note} |")
            continue
        notes = []
        if "attention" in row:
            notes.append(
                f"{row['attention']}, {row['micro_batches']} micro-batches of "
                f"<= {row['micro_batch_tokens']} tokens"
            )
            if row["activation_checkpointing"]:
                notes.append("checkpointing on")
            notes.append(f"plan: {row['memory_plan']}, est. {row['estimated_peak_gib']:.1f} GiB")
            notes.append(f"compile {row['compile_s']:.1f} s")
        if "weights" in row:
            notes.append(
                f"{row['weights']} weights, {row['micro_batches']} padded micro-batches of "
                f"<= {row['micro_batch_tokens']} tokens ({row['padded_tokens']:,} with padding)"
            )
        if "first_pass_s" in row:
            notes.append(
                f"first pass {row['first_pass_s']:.1f} s, compile "
                f"{row['compile_s']:.1f} s, {row['decode']}"
                + (", compiled to the end" if row.get("compiled_at_end") else "")
            )
            if row.get("break_even_tokens") is not None:
                notes.append(f"pays off after {row['break_even_tokens']:,.0f} tokens")
        if "gather_full_weights_s" in row:
            notes.append(
                f"gather {row['gather_full_weights_s']:.2f} s, update_weights "
                f"{row['engine_update_weights_s']:.2f} s"
            )
        versus = "speed_vs_generate" if "speed_vs_generate" in row else "speed_vs_naive"
        lines.append(
            f"| {row['id']} | ok | {cell(row, 'time_to_first_step_s', '.1f')}"
            f" | {cell(row, 'tokens_per_s', ',.0f')} | {cell(row, versus, '.2f')}"
            f" | {cell(row, 'peak_memory_gib', '.1f')} | {cell(row, 'memory_vs_naive', '.2f')}"
            f" | {cell(row, 'mfu', '.1%')} | {'; '.join(notes)} |"
        )
    return "\n".join(lines)


def parse_caps(values: list[str]) -> dict[str, float]:
    caps = {}
    for value in values:
        name, _, seconds = value.partition("=")
        try:
            caps[name] = float(seconds)
        except ValueError:
            raise SystemExit(f"--cap {value!r}: expected ROW=SECONDS, e.g. 0.6b/flex=300") from None
    return caps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=["0.6b", "4b"],
        default=["0.6b", "4b"],
        help="Model shapes: the first gets every row, the second its update rows.",
    )
    parser.add_argument("--tiny", action="store_true", help="A tiny model (CPU smoke run).")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="ROW",
        help="Run these rows only (ids or patterns, e.g. '4b/*').",
    )
    parser.add_argument(
        "--budget-s", type=float, default=480.0, help="Wall-clock cap of the whole run, in seconds."
    )
    parser.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="ROW=SECONDS",
        help="Time cap of one row (repeatable).",
    )
    parser.add_argument("--sequences", type=int, default=32, help="Sequences per update step.")
    parser.add_argument("--length", type=int, default=1024, help="Tokens per sequence.")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=16384,
        help="rstar2's micro-batch budget before the memory plan.",
    )
    parser.add_argument(
        "--attention",
        default=None,
        help="Attention of the rows whose own is auto (e.g. varlen_attention).",
    )
    parser.add_argument(
        "--engine-compile-budget-s",
        type=float,
        default=120.0,
        help="The compiled engine row's compile budget (TransformersEngineConfig).",
    )
    parser.add_argument(
        "--with-flex",
        action="store_true",
        help="Also run packed rows under flex_attention (compiles for minutes).",
    )
    parser.add_argument(
        "--table", action="store_true", help="Print the table to stdout, not stderr."
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="Steps before the timed ones (at least 1: the first, timed on its own).",
    )
    parser.add_argument("--steps", type=int, default=3, help="Timed update steps.")
    parser.add_argument("--requests", type=int, default=256, help="Generation requests.")
    parser.add_argument("--prompt", type=int, default=256, help="Prompt tokens per request.")
    parser.add_argument("--new-tokens", type=int, default=256, help="Tokens generated each.")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="Dense bf16 peak of the GPU for MFU (default: by its name: "
        "H100/H200 989, A100 312, MI300X 1307).",
    )
    parser.add_argument("--json", default=None, help="Also write the results here.")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup: at least 1 (the first step is timed on its own)")
    if args.tiny:
        args.shapes = ["tiny"]
        args.sequences, args.length, args.micro_batch_tokens = 8, 64, 256
        args.requests, args.prompt, args.new_tokens = 4, 8, 8
        args.warmup, args.steps = 1, 1
        # The GPU's kernels' stand-ins on a CPU: varlen_attention's reference kernel, and a
        # real compile of the decode step that overruns its budget and falls back to eager.
        args.attention = args.attention or "varlen_attention"
        args.engine_compile_budget_s = 0.001
    # Rows fork from a server process that never touches CUDA, so this process may.
    on_gpu = torch.cuda.is_available()
    rows = default_rows(args.shapes, on_gpu=on_gpu, flex=args.with_flex)
    if args.only:
        rows = [r for r in rows if any(fnmatch.fnmatch(r.id, p) for p in args.only)]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "cap", "only")}
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    started = time.perf_counter()
    results: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
        "elapsed_s": 0.0,
        "args": vars(args),
        "rows": [],
        "row_settings": [asdict(row) for row in rows],
    }

    def finished(outcome: dict[str, Any]) -> None:
        print(json.dumps(outcome), flush=True)
        results["rows"].append(outcome)
        results["elapsed_s"] = time.perf_counter() - started
        if args.json:
            write_atomically(Path(args.json), json.dumps(results, indent=2))

    run_rows(
        rows,
        settings,
        budget_s=args.budget_s,
        caps=parse_caps(args.cap),
        target=child,
        preload=PRELOAD,
        on_row=finished,
    )
    results["elapsed_s"] = time.perf_counter() - started
    add_ratios(results["rows"], peak_tflops(args, name))
    print(json.dumps({"summary": results}), flush=True)
    print(table(results), file=sys.stdout if args.table else sys.stderr, flush=True)
    if args.json:
        write_atomically(Path(args.json), json.dumps(results, indent=2))


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


if __name__ == "__main__":
    main()
