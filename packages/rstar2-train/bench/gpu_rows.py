"""The measurements of ``scale_gpu.py``'s rows (each runs in a process of its own)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from isolated_rows import Events, Row
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_scheduler import (
    GenerationRequest,
    SamplingParams,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import FSDPConfig, MemoryConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.memory import (
    GIB,
    ModelShape,
    device_memory,
    estimate_peak,
    fsdp_settings,
    plan_memory,
)
from rstar2_train.modeling import choose_attention
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port
from rstar2_train.startup import compile_count, compile_seconds

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
PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "rstar2_scheduler",
    "rstar2_train.placement.ranks",
    "rstar2_train.modeling",
    "isolated_rows",
    "gpu_rows",
]
"""What the server that forks the rows imports once (each row would take seconds to)."""


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else None


def build(shape: str, attention: str, dtype: torch.dtype | None = None) -> Qwen3ForCausalLM:
    """Random weights of ``shape``, created on the device (a 4B model initialised on a CPU
    takes minutes), in ``dtype`` (default: bf16 on a GPU, float32 on a CPU)."""
    if dtype is None:
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    config = Qwen3Config(**SHAPES[shape])
    config._attn_implementation = attention
    torch.manual_seed(0)
    with device():
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)  # type: ignore[no-any-return]


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


def timed_steps(step: Callable[[], None], args: argparse.Namespace, events: Events) -> dict:
    """``warmup`` steps (at least one: the first, timed alone, as it includes any compilation),
    then ``steps`` timed steps."""
    sync()
    started = time.perf_counter()
    events.progress("first step started")
    step()
    sync()
    first = time.perf_counter() - started
    events.progress("first step done")
    for _ in range(args.warmup - 1):
        step()
    times = []
    for _ in range(args.steps):
        sync()
        began = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - began)
    return {"first_update_s": first, "step_s": sum(times) / len(times)}


def update_result(tokens: int, parameters: int, timing: dict, **extra: Any) -> dict[str, Any]:
    result = {
        "parameters_m": parameters / 1e6,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / timing["step_s"],
        "peak_memory_gib": peak_gib(),
        **timing,
        **extra,
    }
    result["time_to_first_step_s"] = result.pop("first_step_at")
    return result


def naive_rows(args: argparse.Namespace, shape: str) -> int:
    if args.naive_rows is not None:
        return int(args.naive_rows)
    if shape == "4b":
        return 4
    if torch.cuda.is_available():
        big = torch.cuda.get_device_properties(0).total_memory >= 100 * GIB
        return 16 if big else 8
    return 4


def measure_naive(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """What a user writes instead: fp32 weights under bf16 autocast, fused AdamW, full logits."""
    where = device()
    model = build(row.shape, "sdpa", torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=where.type == "cuda")
    build_s = events.elapsed()
    events.progress("model built")
    seqs = sequences(args.sequences, args.length, SHAPES[row.shape]["vocab_size"])
    ids = torch.tensor([s.ids for s in seqs])
    mask = torch.tensor([s.mask for s in seqs], dtype=torch.float32)[:, 1:]
    trained = float(mask.sum())
    rows = naive_rows(args, row.shape)

    def step() -> None:
        for start in range(0, len(seqs), rows):
            chunk = ids[start : start + rows].to(where)
            with torch.autocast(where.type, dtype=torch.bfloat16):
                logits = model(input_ids=chunk).logits
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            picked = log_probs.gather(-1, chunk[:, 1:, None]).squeeze(-1)
            loss = -(picked * mask[start : start + rows].to(where)).sum() / trained
            loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timing = timed_steps(step, args, events)
    parameters = sum(p.numel() for p in model.parameters())
    return update_result(
        ids.numel(),
        parameters,
        timing,
        first_step_at=build_s + timing["first_update_s"],
        model_build_s=build_s,
        naive_rows=rows,
    )


def single_rank(model: Qwen3ForCausalLM, *, checkpointing: bool) -> TrainerRank:
    """``model`` sharded by one FSDP2 rank: over NCCL with bf16 mixed precision (float32 master
    weights) on a GPU, over gloo in float32 on a CPU."""
    on_gpu = torch.cuda.is_available()
    rank = TrainerRank(0, threads=min(8, os.cpu_count() or 1))
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="nccl" if on_gpu else "gloo",
            fsdp=FSDPConfig(
                param_dtype="bfloat16" if on_gpu else None,
                activation_checkpointing=checkpointing,
            ),
            optimizer=OptimizerConfig(lr=1e-6),
            schedule=ScheduleConfig(),
            total_steps=100,
        ),
        model,
    )
    return rank


def loss_fn(total_tokens: int) -> Any:
    def loss(index: int, batch: MicroBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return -(logprobs * batch.mask).sum() / total_tokens, {}

    return loss


def planned(row: Row, args: argparse.Namespace, model: Qwen3ForCausalLM) -> dict[str, Any]:
    """The micro-batch tokens and checkpointing of the row: for a planned row, what a stage's
    memory plan picks on this GPU (the rank plans again at its first step); the estimate."""
    fsdp = FSDPConfig(param_dtype="bfloat16")
    settings = fsdp_settings(
        fsdp,
        torch.bfloat16,
        ranks=1,
        tokens=args.micro_batch_tokens,
        checkpointing=row.checkpointing,
    )
    shape = ModelShape.of(model)
    found = device_memory(device(), MemoryConfig().usable_fraction)
    decision = "as configured"
    if row.plan and found is not None:
        plan = plan_memory(
            shape,
            settings,
            budget=found[0],
            min_micro_batch_tokens=MemoryConfig().min_micro_batch_tokens,
            can_shrink=True,
            can_checkpoint=True,
            settings_to_change="--micro-batch-tokens",
        )
        settings, decision = plan.settings, "; ".join(plan.changes) or decision
    return {
        "micro_batch_tokens": settings.micro_batch_tokens,
        "activation_checkpointing": settings.checkpointing,
        "memory_plan": decision,
        "estimated_peak_gib": estimate_peak(shape, settings).total / GIB,
    }


def measure_rstar2(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """One TrainerRank (FSDP2 over NCCL on a GPU, gloo on a CPU)."""
    attention = choose_attention(
        row.attention, on_gpu=torch.cuda.is_available(), packed=row.packing
    )
    model = build(row.shape, attention.name)
    parameters = sum(p.numel() for p in model.parameters())  # the tied head counted once
    plan = planned(row, args, model)
    built = events.elapsed()
    events.progress("model built")
    rank = single_rank(model, checkpointing=plan["activation_checkpointing"])
    setup_s = events.elapsed() - built
    events.progress("rank set up")
    try:
        seqs = sequences(args.sequences, args.length, SHAPES[row.shape]["vocab_size"])
        batches = micro_batches(
            seqs,
            plan["micro_batch_tokens"],
            packing=row.packing,
            pad_id=0,
            device=torch.device("cpu"),
        )
        trained = sum(b.tokens for b in batches)
        own = list(range(len(batches)))
        startup: dict[str, float] = {}
        compiled = compile_count()

        def step() -> None:
            update = rank.update(batches, loss_fn(trained), own, len(own), 1.0)
            startup.update(update.startup)

        timing = timed_steps(step, args, events)
        result = update_result(
            sum(len(s.ids) for s in seqs),
            parameters,
            timing,
            first_step_at=built + setup_s + timing["first_update_s"],
            model_build_s=built,
            rank_setup_s=setup_s,
            compile_s=startup.get("startup/compile_s", 0.0),
            compiled_graphs=compile_count() - compiled,
            attention=attention.name,
            attention_reason=attention.reason,
            packing=row.packing,
            micro_batches=len(batches),
            **plan,
        )
        # The rank's own plan may have turned checkpointing on at its first step.
        result["activation_checkpointing"] = bool(rank._model().is_gradient_checkpointing)
        return result
    finally:
        rank.close()


def prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, vocab, (args.prompt,), generator=generator).tolist()
        for _ in range(args.requests)
    ]


def generation_model(shape: str) -> Qwen3ForCausalLM:
    model = build(shape, "sdpa")
    model.requires_grad_(False)
    model.eval()
    return model


def measure_generate(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """The library call a user makes: ``model.generate`` on the whole batch."""
    model = generation_model(row.shape)
    events.progress("model built")
    batch = torch.tensor(prompts(args, SHAPES[row.shape]["vocab_size"]), device=device())
    kwargs = {
        "attention_mask": torch.ones_like(batch),
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "pad_token_id": 0,
    }
    sync()
    began = time.perf_counter()
    model.generate(batch, max_new_tokens=4, min_new_tokens=4, **kwargs)  # warm-up
    sync()
    warmup = time.perf_counter() - began
    events.progress("warm-up done")
    sync()
    began = time.perf_counter()
    out = model.generate(
        batch, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **kwargs
    )
    sync()
    elapsed = time.perf_counter() - began
    generated = int(out.shape[0] * (out.shape[1] - batch.shape[1]))
    return {
        "requests": args.requests,
        "generated_tokens": generated,
        "generate_s": elapsed,
        "warmup_s": warmup,
        "tokens_per_s": generated / elapsed,
        "peak_memory_gib": peak_gib(),
    }


def engine_requests(args: argparse.Namespace, vocab: int, seed: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            request_id=f"r{i}",
            prompt_ids=tuple(prompt),
            sampling=SamplingParams(max_new_tokens=args.new_tokens, seed=seed + i),
        )
        for i, prompt in enumerate(prompts(args, vocab))
    ]


def make_engine(shape: str, args: argparse.Namespace) -> TransformersEngine:
    config = TransformersEngineConfig(
        name="bench",
        kv_budget_tokens=args.requests * (args.prompt + args.new_tokens),
        max_batch_size=args.requests,
        seed=0,
    )
    return TransformersEngine(generation_model(shape), config)


def measure_engine(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """TransformersEngine with every request in flight: a first pass that compiles (CUDA
    graphs of the decode step, on CUDA), then the timed pass."""
    engine = make_engine(row.shape, args)
    events.progress("model built")
    vocab = SHAPES[row.shape]["vocab_size"]

    async def run() -> dict[str, Any]:
        async with engine:
            compiled, graphs = compile_seconds(), compile_count()
            sync()
            began = time.perf_counter()
            events.progress("first pass started (compiles on CUDA)")
            await asyncio.gather(*(engine.generate(r) for r in engine_requests(args, vocab, 10**6)))
            sync()
            first = time.perf_counter() - began
            events.progress("first pass done")
            capture = {
                "first_pass_s": first,
                "compile_s": compile_seconds() - compiled,
                "compiled_graphs": compile_count() - graphs,
            }
            sync()
            began = time.perf_counter()
            results = await asyncio.gather(
                *(engine.generate(r) for r in engine_requests(args, vocab, 0))
            )
            sync()
            elapsed = time.perf_counter() - began
        generated = sum(len(r.token_ids) for r in results)
        return {
            "decode": type(engine._batch).__name__,
            "requests": args.requests,
            "generated_tokens": generated,
            "generate_s": elapsed,
            "tokens_per_s": generated / elapsed,
            "peak_memory_gib": peak_gib(),
            **capture,
        }

    return asyncio.run(run())


def measure_weight_sync(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """The trainer side (the rank's full-weight gather) and the engine side
    (``update_weights``) of one weight sync."""
    rank = single_rank(build(row.shape, "sdpa"), checkpointing=False)
    try:
        events.progress("rank set up")
        sync()
        began = time.perf_counter()
        weights = rank.full_weights()
        gather = time.perf_counter() - began
    finally:
        rank.close()
    engine = make_engine(row.shape, args)
    events.progress("weights gathered, engine built")

    async def load() -> float:
        async with engine:
            sync()
            began = time.perf_counter()
            await engine.update_weights(weights.items(), version="1")
            sync()
            return time.perf_counter() - began

    return {
        "gather_full_weights_s": gather,
        "engine_update_weights_s": asyncio.run(load()),
        "weights_gib": sum(t.numel() * t.element_size() for t in weights.values()) / GIB,
        "peak_memory_gib": peak_gib(),
    }


MEASURE: dict[str, Callable[[Row, argparse.Namespace, Events], dict[str, Any]]] = {
    "naive": measure_naive,
    "rstar2": measure_rstar2,
    "generate": measure_generate,
    "engine": measure_engine,
    "weight-sync": measure_weight_sync,
}


def child(row: Row, settings: dict[str, Any], events_path: str) -> None:
    """A row's process: measure, write the result (or the error) as the last event."""
    os.setsid()  # its own process group: a killed row takes its compile workers with it
    events = Events(events_path, row)
    try:
        result = MEASURE[row.kind](row, argparse.Namespace(**settings), events)
        events.write(result=result)
    except torch.OutOfMemoryError as error:
        events.write(error=f"out of memory: {str(error).splitlines()[0]}")
        sys.exit(1)
    except Exception as error:
        traceback.print_exc()
        events.write(error=f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
        sys.exit(1)
