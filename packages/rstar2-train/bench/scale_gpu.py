"""The FSDP2 update and TransformersEngine generation on one GPU, with a random-weight Qwen3
model of the Qwen3-0.6B shape built from its config (no hub access needed).

The update runs through ``TrainerRank`` (the code of every data-parallel rank, here one rank
over NCCL: ``fully_shard`` on a single GPU) with bf16 mixed precision and float32 master
weights, with and without activation checkpointing; generation runs through
``TransformersEngine`` in bf16. Weight sync is timed as the ranks' full-weight gather plus an
engine's ``update_weights``.

    python packages/rstar2-train/bench/scale_gpu.py --json out.json
    python packages/rstar2-train/bench/scale_gpu.py --tiny     # a CPU smoke run of the script
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_scheduler import (
    GenerationRequest,
    SamplingParams,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import FSDPConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port

QWEN3_06B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
}


def build(settings: dict[str, Any]) -> Qwen3ForCausalLM:
    config = Qwen3Config(**settings)
    config._attn_implementation = "sdpa"
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


def loss_fn(total_tokens: int) -> Any:
    def loss(index: int, batch: MicroBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        # A token-mean policy-gradient loss normalised over the whole step (advantage 1).
        return -(logprobs * batch.mask).sum() / total_tokens, {}

    return loss


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def update(settings: dict[str, Any], args: argparse.Namespace, checkpointing: bool) -> dict:
    cuda = torch.cuda.is_available()
    rank = TrainerRank(0, threads=8)
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="nccl" if cuda else "gloo",
            fsdp=FSDPConfig(
                param_dtype="bfloat16" if cuda else None, activation_checkpointing=checkpointing
            ),
            optimizer=OptimizerConfig(lr=1e-6),
            schedule=ScheduleConfig(),
            total_steps=100,
        ),
        build(settings),
    )
    seqs = sequences(args.sequences, args.length, settings["vocab_size"])
    batches = micro_batches(
        seqs, args.micro_batch_tokens, packing=True, pad_id=0, device=torch.device("cpu")
    )
    trained = sum(b.tokens for b in batches)
    tokens = sum(len(s.ids) for s in seqs)
    own = list(range(len(batches)))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        result = rank.update(batches, loss_fn(trained), own, len(own), 1.0)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    started = time.perf_counter()
    weights = rank.full_weights()
    gather_s = time.perf_counter() - started
    rank.close()
    mean = sum(times) / len(times)
    return {
        "activation_checkpointing": checkpointing,
        "parameters_m": sum(w.numel() for w in weights.values()) / 1e6,
        "tokens_per_step": tokens,
        "micro_batches": len(batches),
        "step_s": mean,
        "tokens_per_s": tokens / mean,
        "peak_memory_gib": peak,
        "grad_norm": result.grad_norm,
        "gather_full_weights_s": gather_s,
        "weights": weights,
    }


async def generate(settings: dict[str, Any], args: argparse.Namespace, weights: dict) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(settings).to(device=device, dtype=dtype)
    model.requires_grad_(False)
    out: dict[str, Any] = {}
    for batch in args.batch_sizes:
        engine = TransformersEngine(
            model,
            TransformersEngineConfig(
                name="bench",
                kv_budget_tokens=batch * (args.prompt + args.new_tokens) * 2,
                max_batch_size=batch,
                seed=0,
            ),
        )
        generator = torch.Generator().manual_seed(1)
        requests = [
            GenerationRequest(
                request_id=f"r{i}",
                prompt_ids=tuple(
                    torch.randint(
                        0, settings["vocab_size"], (args.prompt,), generator=generator
                    ).tolist()
                ),
                sampling=SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=i),
            )
            for i in range(batch)
        ]
        async with engine:
            await engine.generate(requests[0].model_copy(update={"request_id": "warm"}))
            sync()
            started = time.perf_counter()
            results = await asyncio.gather(*(engine.generate(r) for r in requests))
            sync()
            elapsed = time.perf_counter() - started
            generated = sum(len(r.token_ids) for r in results)
            sync()
            loaded = time.perf_counter()
            await engine.update_weights(weights.items(), version="1")
            sync()
            load_s = time.perf_counter() - loaded
        out[str(batch)] = {
            "requests": batch,
            "generated_tokens": generated,
            "seconds": elapsed,
            "tokens_per_s": generated / elapsed,
            "engine_update_weights_s": load_s,
        }
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="A tiny model (CPU smoke run).")
    parser.add_argument("--sequences", type=int, default=32, help="Sequences per update step.")
    parser.add_argument("--length", type=int, default=1024, help="Tokens per sequence.")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=1, help="Update steps not timed.")
    parser.add_argument("--steps", type=int, default=3, help="Timed update steps.")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--prompt", type=int, default=256, help="Prompt tokens per request.")
    parser.add_argument("--new-tokens", type=int, default=512, help="Tokens generated each.")
    parser.add_argument("--json", default=None, help="Also write the results here.")
    args = parser.parse_args()
    settings = TINY if args.tiny else QWEN3_06B
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "args": vars(args),
    }
    weights: dict = {}
    for checkpointing in (False, True):
        row = update(settings, args, checkpointing)
        weights = row.pop("weights")
        results[f"update_ac_{checkpointing}"] = row
        print(json.dumps(row), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    results["generate"] = asyncio.run(generate(settings, args, weights))
    print(json.dumps(results["generate"]), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
