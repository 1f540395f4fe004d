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
from shapes import SHAPES
from transformers import Qwen3Config, Qwen3ForCausalLM

from rstar2_scheduler import (
    GenerationRequest,
    SamplingParams,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_scheduler.compilation import compile_count, compile_seconds
from rstar2_train.actor import Actor, make_optimizer
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import FSDPConfig, MemoryConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.memory import (
    GIB,
    ModelShape,
    device_memory,
    estimate_peak,
    memory_settings,
    plan_memory,
)
from rstar2_train.modeling import choose_attention
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port
from rstar2_train.precision import Precision

PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "rstar2_scheduler",
    "rstar2_train.placement.ranks",
    "rstar2_train.modeling",
    "isolated_rows",
    "shapes",
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
    """``count`` sequences whose lengths spread evenly over a quarter to 1.75x ``length`` (mean
    ``length``), in a shuffled order, as RL responses do; the first quarter of each is prompt."""
    generator = torch.Generator().manual_seed(0)
    low, high = max(2, length // 4), max(3, 7 * length // 4)
    lengths = torch.linspace(low, high, count).round().long()
    lengths = lengths[torch.randperm(count, generator=generator)].tolist()
    return [
        TokenSequence(
            ids=torch.randint(0, vocab, (n,), generator=generator).tolist(),
            mask=[0] * (n // 4) + [1] * (n - n // 4),
        )
        for n in lengths
    ]


def padded_groups(seqs: list[TokenSequence], tokens: int) -> list[list[TokenSequence]]:
    """What a padding collator makes of ``seqs`` in data order: consecutive sequences per
    micro-batch while rows x the longest of them stay within ``tokens`` (padding included)."""
    groups: list[list[TokenSequence]] = []
    current: list[TokenSequence] = []
    for sequence in seqs:
        width = max([len(sequence.ids), *(len(s.ids) for s in current)])
        if current and width * (len(current) + 1) > tokens:
            groups.append(current)
            current = []
        current.append(sequence)
    if current:
        groups.append(current)
    return groups


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


def measure_naive(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """What a user writes instead: the transformers model with float32 parameters under bf16
    autocast (``row.weights`` float32) or with bf16 parameters (bfloat16), AdamW as rstar2 runs
    it (fused on CUDA), padded micro-batches of the same token budget as rstar2's, the full
    logits and a float32 log-softmax over them."""
    where = device()
    weights = getattr(torch, row.weights) if where.type == "cuda" else torch.float32
    model = build(row.shape, "sdpa", weights)
    model.train()
    optimizer = make_optimizer(model.parameters(), OptimizerConfig(lr=1e-6))
    tokens = planned(row, args, model)["micro_batch_tokens"]
    build_s = events.elapsed()
    events.progress("model built")
    seqs = sequences(args.sequences, args.length, SHAPES[row.shape]["vocab_size"])
    trained = float(sum(sum(s.mask[1:]) for s in seqs))
    groups = []
    for group in padded_groups(seqs, tokens):
        width = max(len(s.ids) for s in group)
        ids = torch.tensor([s.ids + [0] * (width - len(s.ids)) for s in group])
        attention = torch.tensor([[1] * len(s.ids) + [0] * (width - len(s.ids)) for s in group])
        mask = torch.tensor([s.mask[1:] + [0] * (width - len(s.ids)) for s in group])
        groups.append((ids.to(where), attention.to(where), mask.to(where, torch.float32)))
    autocast = weights == torch.float32 and where.type == "cuda"

    def step() -> None:
        for ids, attention, mask in groups:
            with torch.autocast(where.type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=ids, attention_mask=attention).logits
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -(picked * mask).sum() / trained
            loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timing = timed_steps(step, args, events)
    parameters = sum(p.numel() for p in model.parameters())
    return update_result(
        sum(len(s.ids) for s in seqs),
        parameters,
        timing,
        first_step_at=build_s + timing["first_update_s"],
        model_build_s=build_s,
        micro_batch_tokens=tokens,
        micro_batches=len(groups),
        padded_tokens=sum(int(ids.numel()) for ids, _, _ in groups),
        weights=str(weights).removeprefix("torch."),
    )


def precision() -> Precision:
    """rstar2's default policy on a GPU (bf16 compute, float32 masters); float32 on a CPU."""
    compute = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return Precision(compute, torch.float32)


def single_rank(model: Qwen3ForCausalLM, *, checkpointing: bool) -> TrainerRank:
    """``model`` sharded by one FSDP2 rank (NCCL on a GPU, gloo on a CPU) under rstar2's
    default precision policy."""
    on_gpu = torch.cuda.is_available()
    rank = TrainerRank(0, threads=min(8, os.cpu_count() or 1))
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="nccl" if on_gpu else "gloo",
            fsdp=FSDPConfig(activation_checkpointing=checkpointing),
            optimizer=OptimizerConfig(lr=1e-6),
            schedule=ScheduleConfig(),
            total_steps=100,
            precision=precision(),
        ),
        model,
    )
    return rank


def loss_fn(total_tokens: int) -> Any:
    def loss(index: int, batch: MicroBatch, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return -(logprobs * batch.mask).sum() / total_tokens, {}

    return loss


def planned(row: Row, args: argparse.Namespace, model: Qwen3ForCausalLM) -> dict[str, Any]:
    """The micro-batch tokens and checkpointing of rstar2's side of ``row``: for a planned row,
    what a stage's memory plan picks on this GPU (a rank plans again at its first step); the
    estimate."""
    attention = choose_attention(
        row_attention(row, args), on_gpu=torch.cuda.is_available(), packed=row.packing
    )
    settings = memory_settings(
        precision(),
        micro_batch_tokens=args.micro_batch_tokens,
        attention=attention.name,
        device=device(),
        packed=row.packing,
        longest_sequence=max(len(s.ids) for s in row_sequences(row, args)),
        checkpointing=row.checkpointing,
        ranks=1 if row.kind == "rstar2-fsdp" else None,
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


def row_attention(row: Row, args: argparse.Namespace) -> str:
    """The row's attention; ``--attention`` stands in for ``auto`` (rows that name one keep
    it)."""
    return str(args.attention) if row.attention == "auto" and args.attention else row.attention


def row_sequences(row: Row, args: argparse.Namespace) -> list[TokenSequence]:
    return sequences(args.sequences, args.length, SHAPES[row.shape]["vocab_size"])


def measure_rstar2(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """rstar2's update: the in-process ``Actor`` (``rstar2``, what a stage on one GPU runs:
    float32 master weights beside the bf16 model) or one ``TrainerRank`` (``rstar2-fsdp``,
    FSDP2 over NCCL on a GPU, gloo on a CPU); ``token_logprobs`` with the fused head."""
    attention = choose_attention(
        row_attention(row, args), on_gpu=torch.cuda.is_available(), packed=row.packing
    )
    model = build(row.shape, attention.name, torch.float32)  # the masters' dtype
    parameters = sum(p.numel() for p in model.parameters())  # the tied head counted once
    plan = planned(row, args, model)
    built = events.elapsed()
    events.progress("model built")
    fsdp = row.kind == "rstar2-fsdp"
    rank: TrainerRank | None = None
    actor: Actor | None = None
    if fsdp:
        rank = single_rank(model, checkpointing=plan["activation_checkpointing"])
    else:
        if plan["activation_checkpointing"]:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        actor = Actor(
            model,  # type: ignore[arg-type]
            OptimizerConfig(lr=1e-6),
            ScheduleConfig(),
            total_steps=100,
            precision=precision(),
        )
    setup_s = events.elapsed() - built
    events.progress("trainer set up")
    try:
        seqs = row_sequences(row, args)
        batches = micro_batches(
            seqs,
            plan["micro_batch_tokens"],
            packing=row.packing,
            pad_id=0,
            device=torch.device("cpu") if fsdp else device(),
        )
        trained = sum(b.tokens for b in batches)
        own = list(range(len(batches)))
        startup: dict[str, float] = {}
        seconds, graphs = compile_seconds(), compile_count()

        def step() -> None:
            if rank is not None:
                update = rank.update(batches, loss_fn(trained), own, len(own), 1.0)
                startup.update(update.startup)
            else:
                assert actor is not None
                actor.update(batches, loss_fn(trained))

        timing = timed_steps(step, args, events)
        result = update_result(
            sum(len(s.ids) for s in seqs),
            parameters,
            timing,
            first_step_at=built + setup_s + timing["first_update_s"],
            model_build_s=built,
            trainer_setup_s=setup_s,
            compile_s=compile_seconds() - seconds,
            compiled_graphs=compile_count() - graphs,
            attention=attention.name,
            attention_reason=attention.reason,
            packing=row.packing,
            micro_batches=len(batches),
            padded_tokens=sum(int(b.input_ids.numel()) for b in batches),
            **plan,
        )
        trained_model = rank._model() if rank is not None else model
        # A rank's own plan may have turned checkpointing on at its first step.
        result["activation_checkpointing"] = bool(trained_model.is_gradient_checkpointing)
        return result
    finally:
        if rank is not None:
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


def make_engine(
    shape: str, args: argparse.Namespace, *, compile: bool = False
) -> TransformersEngine:
    """Slot decoding wherever the model allows it (on a CPU too, where ``auto`` would pick the
    padded layout), so a CPU run exercises the GPU's path; ``compile`` under the bench's
    compile budget."""
    config = TransformersEngineConfig(
        name="bench",
        kv_budget_tokens=args.requests * (args.prompt + args.new_tokens),
        max_batch_size=args.requests,
        seed=0,
        decode="slots",
        compile=compile,
        compile_budget_s=args.engine_compile_budget_s,
    )
    return TransformersEngine(generation_model(shape), config)


def measure_engine(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """TransformersEngine with every request in flight: a first pass (which compiles the decode
    step, CUDA graphs on CUDA, for ``row.compile``), then the timed pass. Both passes' times are
    reported, so the compiled row's total can be set against the eager one's."""
    engine = make_engine(row.shape, args, compile=row.compile)
    events.progress("model built")
    vocab = SHAPES[row.shape]["vocab_size"]

    async def run() -> dict[str, Any]:
        async with engine:
            compiled, graphs = compile_seconds(), compile_count()
            sync()
            began = time.perf_counter()
            events.progress("first pass started" + (" (compiles)" if row.compile else ""))
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
        batch = engine._batch
        return {
            "decode": type(batch).__name__,
            "compile": row.compile,
            # False once the compile budget or a compiler error turned compiling off.
            "compiled_at_end": bool(getattr(batch, "compile", False)),
            "requests": args.requests,
            "generated_tokens": generated,
            "generate_s": elapsed,
            "tokens_per_s": generated / elapsed,
            "peak_memory_gib": peak_gib(),
            **capture,
        }

    return asyncio.run(run())


def measure_weight_sync(row: Row, args: argparse.Namespace, events: Events) -> dict[str, Any]:
    """The trainer side (the rank's full-weight gather, in the compute dtype) and the engine
    side (``update_weights``) of one weight sync."""
    rank = single_rank(build(row.shape, "sdpa", torch.float32), checkpointing=False)
    try:
        events.progress("rank set up")
        sync()
        began = time.perf_counter()
        weights = rank.full_weights(rank.precision.compute)
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
    "rstar2-fsdp": measure_rstar2,
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
