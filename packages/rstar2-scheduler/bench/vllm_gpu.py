"""VLLMEngine on one GPU: generation, a weight sync, sleep and wake, and the time a sync takes.

    python packages/rstar2-scheduler/bench/vllm_gpu.py --json vllm_gpu.json
    python packages/rstar2-scheduler/bench/vllm_gpu.py --model /path/to/checkpoint

Needs a CUDA GPU and ``rstar2-scheduler[vllm]``. Without ``--model`` it writes a random-weight
Qwen3 checkpoint of the Qwen3-0.6B shape (``--shape tiny``: 2 layers; the output head untied)
into a temporary folder, so no hub access is needed. The layers keep the usual initialisation;
the output head is drawn with a larger spread (``--head-std``) so that greedy decoding has clear
winners and a changed weight shows.

What it checks, each against a transformers reference model in float32 on the same GPU that
scores vLLM's completions token by token (teacher forcing):

1. generation: vLLM's greedy completions and their log-probs are those of the checkpoint;
2. sync: after ``update_weights`` with other weights (a second random draw), the completions
   and log-probs are those of the new weights, and no longer those of the old ones;
3. sleep and wake: ``sleep(2)`` frees GPU memory, and after ``update_weights`` with the
   original weights and ``wake_up()`` the completions are the checkpoint's again (the report
   also says whether they are token for token the first ones);
4. timing: the wall time of each sync (and of ``--syncs`` more), with bytes per second.

It prints one JSON report (also written to ``--json``) and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen3Config

from rstar2_scheduler import GenerationRequest, SamplingParams, VLLMEngine, VLLMEngineConfig

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint folder (default: a random-weight one)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--head-std", type=float, default=0.5, help="random output head's std")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per check")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24, help="greedy tokens per prompt")
    parser.add_argument("--bucket-mb", type=float, default=512, help="weight_bucket_mb")
    parser.add_argument("--syncs", type=int, default=3, help="extra timed syncs")
    parser.add_argument("--gpu-memory", type=float, default=0.5, help="gpu_memory_utilization")
    parser.add_argument("--tolerance", type=float, default=0.25, help="log-prob tolerance (bf16)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (no CUDA graphs)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    return parser.parse_args(argv)


def random_model(config: Any, *, seed: int, head_std: float) -> PreTrainedModel:
    """A random-weight model of ``config`` in bfloat16, its untied output head drawn with
    ``head_std`` (so that greedy decoding has clear winners)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        with torch.no_grad():
            head.weight.normal_(0.0, head_std)
    return model


def build_checkpoint(shape: str, folder: Path, *, seed: int, head_std: float) -> Path:
    """A random-weight Qwen3 checkpoint (config and safetensors, bfloat16) in ``folder``."""
    config = Qwen3Config(**SHAPES[shape], tie_word_embeddings=False, max_position_embeddings=4096)
    random_model(config, seed=seed, head_std=head_std).save_pretrained(folder)
    return folder


def redraw(checkpoint: Path, *, seed: int, head_std: float) -> dict[str, torch.Tensor]:
    """Other weights for the same architecture: a fresh random draw from its config."""
    model = random_model(AutoConfig.from_pretrained(checkpoint), seed=seed, head_std=head_std)
    return {name: t.detach() for name, t in model.state_dict().items()}


def prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def agreement(
    reference: PreTrainedModel,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
) -> dict[str, float]:
    """How ``reference`` scores a completion: the largest log-prob difference from the
    engine's, and the share of tokens that are the reference's own greedy choice."""
    device = next(reference.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logits = reference(ids).logits[0, len(prompt) - 1 : -1].float()
    scores = torch.log_softmax(logits, dim=-1)
    picked = torch.tensor(tokens, device=device)
    chosen = scores.gather(1, picked[:, None])[:, 0]
    engine = torch.tensor(logprobs, device=device)
    return {
        "max_logprob_diff": float((chosen - engine).abs().max()),
        "greedy_share": float((scores.argmax(-1) == picked).float().mean()),
    }


def verdict(
    scored: list[dict[str, float]], *, tolerance: float, expect_match: bool
) -> dict[str, Any]:
    """Whether completions match a reference (every log-prob within ``tolerance`` and at least
    90% greedy choices) or clearly do not (a log-prob off by over 5x ``tolerance``)."""
    worst = max(s["max_logprob_diff"] for s in scored)
    greedy = sum(s["greedy_share"] for s in scored) / len(scored)
    matches = worst <= tolerance and greedy >= 0.9
    differs = worst > 5 * tolerance
    return {
        "max_logprob_diff": worst,
        "greedy_share": greedy,
        "passed": matches if expect_match else differs,
    }


async def complete(
    engine: VLLMEngine, asks: list[list[int]], new_tokens: int, tag: str
) -> list[Any]:
    results = await asyncio.gather(
        *(
            engine.generate(
                GenerationRequest(
                    request_id=f"{tag}-{i}",
                    prompt_ids=tuple(prompt),
                    sampling=SamplingParams(max_new_tokens=new_tokens, temperature=0.0),
                )
            )
            for i, prompt in enumerate(asks)
        )
    )
    failed = [r.error for r in results if r.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"generation failed: {failed[0]}")
    return list(results)


def score(
    reference: PreTrainedModel, asks: list[list[int]], results: list[Any]
) -> list[dict[str, float]]:
    return [
        agreement(reference, prompt, list(r.token_ids), list(r.logprobs))
        for prompt, r in zip(asks, results, strict=True)
    ]


def sync_figures(engine: VLLMEngine) -> dict[str, Any]:
    stats = engine.last_sync
    assert stats is not None
    return {**stats.model_dump(), "gb_per_s": stats.bytes / stats.seconds / 1e9}


async def run(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    import vllm

    original = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    weights = {name: t.detach() for name, t in original.state_dict().items()}
    other = redraw(checkpoint, seed=1, head_std=args.head_std)
    reference = original.float().cuda().eval()
    asks = prompts(args.prompts, args.prompt_tokens, reference.config.vocab_size)
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=str(checkpoint),
            weight_bucket_mb=args.bucket_mb,
            engine_args={
                "enable_sleep_mode": True,
                "gpu_memory_utilization": args.gpu_memory,
                "skip_tokenizer_init": True,
                "dtype": "bfloat16",
                "max_model_len": args.prompt_tokens + args.new_tokens + 16,
                "enforce_eager": args.eager,
                "seed": 0,
            },
        )
    )
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "checkpoint": str(checkpoint) if args.model else f"random {args.shape}",
        "parameters": sum(t.numel() for t in weights.values()),
    }
    started = time.perf_counter()
    await engine.start()
    report["start_s"] = time.perf_counter() - started
    try:
        first = await complete(engine, asks, args.new_tokens, "before")
        report["generation"] = verdict(
            score(reference, asks, first), tolerance=args.tolerance, expect_match=True
        )

        await engine.update_weights(other.items(), version="other")
        report["sync"] = sync_figures(engine)
        changed = await complete(engine, asks, args.new_tokens, "other")
        reference.load_state_dict({k: v.float() for k, v in other.items()})
        report["sync_new_weights"] = verdict(
            score(reference, asks, changed), tolerance=args.tolerance, expect_match=True
        )
        reference.load_state_dict({k: v.float() for k, v in weights.items()})
        report["sync_old_weights_gone"] = verdict(
            score(reference, asks, changed), tolerance=args.tolerance, expect_match=False
        )
        report["completions_changed"] = sum(
            a.token_ids != b.token_ids for a, b in zip(first, changed, strict=True)
        )

        free_before = torch.cuda.mem_get_info()[0]
        await engine.sleep(2)
        freed = torch.cuda.mem_get_info()[0] - free_before
        await engine.update_weights(weights.items(), version="original")
        colocated = sync_figures(engine)
        await engine.wake_up()
        again = await complete(engine, asks, args.new_tokens, "again")
        restored = verdict(
            score(reference, asks, again), tolerance=args.tolerance, expect_match=True
        )
        report["sleep_wake"] = {
            "freed_gib": freed / 2**30,
            "sync": colocated,
            "same_completions": all(
                a.token_ids == b.token_ids for a, b in zip(first, again, strict=True)
            ),
            "original_weights": restored,
            "passed": freed > 0 and restored["passed"],
        }

        timings = []
        for index in range(args.syncs):
            await engine.update_weights(weights.items(), version=f"timed-{index}")
            timings.append(sync_figures(engine))
        report["timed_syncs"] = timings
    finally:
        await engine.close()
    checks = ["generation", "sync_new_weights", "sync_old_weights_gone", "sleep_wake"]
    report["passed"] = all(report[name]["passed"] for name in checks)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("vllm_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = (
            Path(args.model)
            if args.model
            else build_checkpoint(args.shape, Path(folder), seed=0, head_std=args.head_std)
        )
        report = asyncio.run(run(args, checkpoint))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
