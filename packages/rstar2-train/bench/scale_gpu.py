"""rstar2's update step and TransformersEngine on one GPU, against what a user would write
instead, measured in the same run.

Models: random weights of the Qwen3-0.6B or Qwen3-4B shape built from their configs (no hub
access needed). Every figure of rstar2 is given as a ratio to its baseline from this run:

- Update: one optimizer step of a token-mean policy-gradient loss (advantage 1) over
  ``--sequences`` x ``--length`` tokens (3/4 of each trained) in micro-batches of
  ``--micro-batch-tokens``. Baseline ("naive"): the transformers model with float32 parameters
  under bf16 autocast, fused AdamW, no FSDP, rows of whole sequences, the full logits and a
  float32 log-softmax over them. rstar2: ``TrainerRank`` (FSDP2 ``fully_shard`` on one rank,
  bf16 mixed precision with float32 master weights, AdamW), ``token_logprobs`` (the fused
  chunked LM head), the attention that ``model.attn_implementation`` picks (``auto``:
  FlexAttention for packed rows on a GPU), with variants (packing off, packed rows under sdpa,
  activation checkpointing). MFU = 6 x parameters x tokens/s over the GPU's dense bf16 peak.
- Generation: ``--requests`` prompts of ``--prompt`` tokens, ``--new-tokens`` sampled each at
  temperature 1. Baseline: ``model.generate`` on the whole batch. rstar2: TransformersEngine
  with every request in flight (slot decoding, compiled decode step on CUDA), after a warm-up
  pass that compiles it. Also timed: the weight sync of the update's weights (the ranks'
  full-weight gather, the engine's ``update_weights``).

    python packages/rstar2-train/bench/scale_gpu.py --json out.json          # 0.6B, everything
    python packages/rstar2-train/bench/scale_gpu.py --shape 4b --parts update
    python packages/rstar2-train/bench/scale_gpu.py --tiny                   # CPU smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_scheduler import (
    GenerationRequest,
    SamplingParams,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import FSDPConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.modeling import choose_attention
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port

QWEN3 = {
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
}
SHAPES: dict[str, dict[str, Any]] = {
    "0.6b": {
        **QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
    },
    "4b": {
        **QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "MI300X": 1307.0}
"""Dense bf16 peak of a GPU by the model in its name (``--peak-tflops`` overrides)."""


@dataclass(frozen=True)
class Variant:
    """One rstar2 update configuration."""

    label: str
    attention: str
    packing: bool
    checkpointing: bool = False


VARIANTS = {
    "0.6b": [
        Variant("rstar2 (attention auto, packed)", "auto", True),
        Variant("rstar2, packing off", "auto", False),
        Variant("rstar2, packed, sdpa (the former default)", "sdpa", True),
        Variant("rstar2 (auto, packed) + activation checkpointing", "auto", True, True),
    ],
    "4b": [
        Variant("rstar2 (attention auto, packed)", "auto", True),
        Variant("rstar2 (auto, packed) + activation checkpointing", "auto", True, True),
    ],
}
VARIANTS["tiny"] = VARIANTS["0.6b"]


def cuda() -> bool:
    return torch.cuda.is_available()


def sync() -> None:
    if cuda():
        torch.cuda.synchronize()


def reset_memory() -> None:
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if cuda() else math.nan


def build(settings: dict[str, Any], attention: str) -> Qwen3ForCausalLM:
    config = Qwen3Config(**settings)
    config._attn_implementation = attention
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def sequences(count: int, length: int, vocab: int) -> list[TokenSequence]:
    generator = torch.Generator().manual_seed(0)
    prompt = length // 4
    return [
        TokenSequence(
            ids=torch.randint(0, vocab, (length,), generator=generator).tolist(),
            mask=[0] * prompt + [1] * (length - prompt),
        )
        for _ in range(count)
    ]


def timed_steps(step: Callable[[], None], args: argparse.Namespace) -> list[float]:
    times = []
    for index in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        step()
        sync()
        if index >= args.warmup:
            times.append(time.perf_counter() - started)
    return times


def update_row(label: str, tokens: int, parameters: int, times: list[float], peak: float) -> dict:
    mean = sum(times) / len(times)
    return {
        "label": label,
        "parameters_m": parameters / 1e6,
        "tokens_per_step": tokens,
        "step_s": mean,
        "tokens_per_s": tokens / mean,
        "peak_memory_gib": peak,
    }


def naive_update(settings: dict[str, Any], args: argparse.Namespace) -> dict:
    """What a user writes instead: fp32 weights under bf16 autocast, fused AdamW, full logits."""
    reset_memory()
    device = torch.device("cuda" if cuda() else "cpu")
    model = build(settings, "sdpa").to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda())
    seqs = sequences(args.sequences, args.length, settings["vocab_size"])
    ids = torch.tensor([s.ids for s in seqs])
    mask = torch.tensor([s.mask for s in seqs], dtype=torch.float32)[:, 1:]
    trained = float(mask.sum())
    rows = max(1, args.micro_batch_tokens // args.length)

    def step() -> None:
        for start in range(0, len(seqs), rows):
            chunk = ids[start : start + rows].to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(input_ids=chunk).logits
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            picked = log_probs.gather(-1, chunk[:, 1:, None]).squeeze(-1)
            loss = -(picked * mask[start : start + rows].to(device)).sum() / trained
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = timed_steps(step, args)
    parameters = sum(p.numel() for p in model.parameters())
    return update_row(
        "naive: autocast, fused AdamW, full logits", ids.numel(), parameters, times, peak_gib()
    )


def loss_fn(total_tokens: int) -> Any:
    def loss(index: int, batch: MicroBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return -(logprobs * batch.mask).sum() / total_tokens, {}

    return loss


def rstar2_update(
    settings: dict[str, Any], args: argparse.Namespace, variant: Variant
) -> tuple[dict, dict[str, torch.Tensor]]:
    """One TrainerRank (FSDP2 over NCCL on the GPU, gloo on a CPU); returns its row and the
    full weights it ends with."""
    reset_memory()
    attention = choose_attention(variant.attention, on_gpu=cuda(), packed=variant.packing)
    model = build(settings, attention)
    parameters = sum(p.numel() for p in model.parameters())  # the tied head counted once
    rank = TrainerRank(0, threads=min(8, os.cpu_count() or 1))
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="nccl" if cuda() else "gloo",
            fsdp=FSDPConfig(
                param_dtype="bfloat16" if cuda() else None,
                activation_checkpointing=variant.checkpointing,
            ),
            optimizer=OptimizerConfig(lr=1e-6),
            schedule=ScheduleConfig(),
            total_steps=100,
        ),
        model,
    )
    try:
        seqs = sequences(args.sequences, args.length, settings["vocab_size"])
        batches = micro_batches(
            seqs,
            args.micro_batch_tokens,
            packing=variant.packing,
            pad_id=0,
            device=torch.device("cpu"),
        )
        trained = sum(b.tokens for b in batches)
        own = list(range(len(batches)))
        times = timed_steps(
            lambda: rank.update(batches, loss_fn(trained), own, len(own), 1.0), args
        )
        peak = peak_gib()
        row = update_row(variant.label, sum(len(s.ids) for s in seqs), parameters, times, peak)
        row.update(attention=attention, packing=variant.packing, micro_batches=len(batches))
        row["activation_checkpointing"] = variant.checkpointing
        started = time.perf_counter()
        weights = rank.full_weights()
        row["gather_full_weights_s"] = time.perf_counter() - started
        return row, weights
    finally:
        rank.close()


def guarded(run: Callable[[], Any], label: str) -> Any:
    """``run()``, or an error row when the GPU runs out of memory."""
    try:
        return run()
    except torch.OutOfMemoryError as error:
        print(f"{label}: out of memory ({str(error).splitlines()[0]})", flush=True)
        reset_memory()
        return {"label": label, "error": "out of memory"}


def prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
        for _ in range(args.requests)
    ]


def generation_model(settings: dict[str, Any]) -> Qwen3ForCausalLM:
    model = build(settings, "sdpa")
    if cuda():
        model.to(device=torch.device("cuda"), dtype=torch.bfloat16)
    model.requires_grad_(False)
    model.eval()
    return model


def hf_generate(settings: dict[str, Any], args: argparse.Namespace) -> dict:
    """The library call a user makes: ``model.generate`` on the whole batch."""
    reset_memory()
    model = generation_model(settings)
    device = next(model.parameters()).device
    batch = torch.tensor(prompts(args, settings["vocab_size"]), device=device)
    kwargs = {
        "attention_mask": torch.ones_like(batch),
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "pad_token_id": 0,
    }
    model.generate(batch, max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
    sync()
    started = time.perf_counter()
    out = model.generate(
        batch, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kwargs
    )
    sync()
    elapsed = time.perf_counter() - started
    generated = int(out.shape[0] * (out.shape[1] - batch.shape[1]))
    return {
        "label": "model.generate, whole batch",
        "requests": args.requests,
        "generated_tokens": generated,
        "seconds": elapsed,
        "tokens_per_s": generated / elapsed,
        "peak_memory_gib": peak_gib(),
    }


async def engine_generate(
    settings: dict[str, Any], args: argparse.Namespace, weights: dict[str, torch.Tensor]
) -> dict:
    reset_memory()
    model = generation_model(settings)
    config = TransformersEngineConfig(
        name="bench",
        kv_budget_tokens=args.requests * (args.prompt + args.new_tokens),
        max_batch_size=args.requests,
        seed=0,
    )
    engine = TransformersEngine(model, config)
    batch = prompts(args, settings["vocab_size"])

    def requests(seed: int) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                request_id=f"r{i}",
                prompt_ids=tuple(prompt),
                sampling=SamplingParams(max_new_tokens=args.new_tokens, seed=seed + i),
            )
            for i, prompt in enumerate(batch)
        ]

    async with engine:
        # A whole pass first: it compiles the decode step for every window it reaches.
        await asyncio.gather(*(engine.generate(r) for r in requests(10**6)))
        sync()
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in requests(0)))
        sync()
        elapsed = time.perf_counter() - started
        row: dict[str, Any] = {
            "label": "TransformersEngine, all requests in flight",
            "decode": type(engine._batch).__name__,
            "requests": args.requests,
            "generated_tokens": sum(len(r.token_ids) for r in results),
            "seconds": elapsed,
            "peak_memory_gib": peak_gib(),
        }
        row["tokens_per_s"] = row["generated_tokens"] / elapsed
        if weights:
            sync()
            started = time.perf_counter()
            await engine.update_weights(weights.items(), version="1")
            sync()
            row["engine_update_weights_s"] = time.perf_counter() - started
    return row


def peak_tflops(args: argparse.Namespace) -> float | None:
    if args.peak_tflops is not None:
        return float(args.peak_tflops)
    if not cuda():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def add_ratios(results: dict[str, Any], peak: float | None) -> None:
    """Each rstar2 row's tokens/s and peak memory over its baseline's, and MFU."""
    update = results.get("update", [])
    for row in update:
        if "error" not in row and peak is not None:
            row["mfu"] = 6 * row["parameters_m"] * 1e6 * row["tokens_per_s"] / (peak * 1e12)
    if update and "error" not in update[0]:
        for row in update[1:]:
            if "error" not in row:
                row["speed_vs_naive"] = row["tokens_per_s"] / update[0]["tokens_per_s"]
                if cuda():
                    row["memory_vs_naive"] = row["peak_memory_gib"] / update[0]["peak_memory_gib"]
    generate = results.get("generate", [])
    if len(generate) == 2 and all("error" not in row for row in generate):
        generate[1]["speed_vs_generate"] = generate[1]["tokens_per_s"] / generate[0]["tokens_per_s"]


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{results['device']}, torch {results['torch']}, transformers {results['transformers']}, "
        f"{results['date']}, shape {results['shape']}",
        "| update step | tokens/s | vs naive | peak GiB | vs naive | MFU |",
        "|---|---|---|---|---|---|",
    ]

    def cell(row: dict, key: str, fmt: str) -> str:
        return format(row[key], fmt) if key in row else "-"

    for row in results.get("update", []):
        if "error" in row:
            lines.append(f"| {row['label']} | {row['error']} | | | | |")
            continue
        lines.append(
            f"| {row['label']} | {row['tokens_per_s']:,.0f} | {cell(row, 'speed_vs_naive', '.2f')}"
            f" | {row['peak_memory_gib']:.1f} | {cell(row, 'memory_vs_naive', '.2f')}"
            f" | {cell(row, 'mfu', '.1%')} |"
        )
    if results.get("generate"):
        lines += ["", "| generation | tokens/s | vs model.generate |", "|---|---|---|"]
        for row in results["generate"]:
            speed = row.get("tokens_per_s", math.nan)
            lines.append(
                f"| {row['label']} | {speed:,.0f} | {cell(row, 'speed_vs_generate', '.2f')} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["0.6b", "4b"], default="0.6b", help="Model shape.")
    parser.add_argument(
        "--tiny", action="store_true", help="A tiny model and workload (CPU smoke run)."
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["update", "generate"],
        default=["update", "generate"],
        help="What to measure.",
    )
    parser.add_argument("--sequences", type=int, default=32, help="Sequences per update step.")
    parser.add_argument("--length", type=int, default=1024, help="Tokens per sequence.")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=1, help="Update steps not timed.")
    parser.add_argument("--steps", type=int, default=3, help="Timed update steps.")
    parser.add_argument("--requests", type=int, default=256, help="Generation requests.")
    parser.add_argument("--prompt", type=int, default=256, help="Prompt tokens per request.")
    parser.add_argument("--new-tokens", type=int, default=512, help="Tokens generated each.")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="Dense bf16 peak of the GPU for MFU (default: by its name: H100/H200 989, A100 "
        "312, MI300X 1307).",
    )
    parser.add_argument("--json", default=None, help="Also write the results here.")
    args = parser.parse_args()
    if args.tiny:
        args.shape = "tiny"
        args.sequences, args.length, args.micro_batch_tokens = 8, 64, 256
        args.requests, args.prompt, args.new_tokens = 4, 8, 8
        args.warmup, args.steps = 0, 1
    settings = SHAPES[args.shape]
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda() else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
        "shape": args.shape,
        "args": vars(args),
    }
    weights: dict[str, torch.Tensor] = {}
    if "update" in args.parts:
        rows = [guarded(lambda: naive_update(settings, args), "naive")]
        print(json.dumps(rows[0]), flush=True)
        for variant in VARIANTS[args.shape]:
            outcome = guarded(lambda v=variant: rstar2_update(settings, args, v), variant.label)
            row = outcome if isinstance(outcome, dict) else outcome[0]
            if not isinstance(outcome, dict) and not weights:
                weights = outcome[1]
            rows.append(row)
            print(json.dumps(row), flush=True)
        results["update"] = rows
    if "generate" in args.parts:
        results["generate"] = [
            guarded(lambda: hf_generate(settings, args), "model.generate"),
            guarded(lambda: asyncio.run(engine_generate(settings, args, weights)), "engine"),
        ]
        print(json.dumps(results["generate"]), flush=True)
    add_ratios(results, peak_tflops(args))
    print(table(results), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
