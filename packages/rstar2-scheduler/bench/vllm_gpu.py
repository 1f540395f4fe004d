"""VLLMEngine's acceptance run on one GPU (about five minutes): generation, weight syncs, sleep
and wake, fused layers synced in parts, sampled log-probs, refusals, and what each sync cost.

    python packages/rstar2-scheduler/bench/vllm_gpu.py --json vllm_gpu.json
    python packages/rstar2-scheduler/bench/vllm_gpu.py --tiny      # 2-layer shape, seconds

Needs a CUDA GPU and ``rstar2-scheduler[vllm]``. It writes random-weight Qwen3 checkpoints of the
Qwen3-0.6B shape (``--tiny``: 2 layers) into a temporary folder, so no hub access is needed; the
output head (the embedding, when tied) is drawn with a larger spread (``--head-std``) so that
greedy decoding has clear winners and a changed weight shows. ``--model`` replaces the untied
checkpoint with yours.

Every check compares vLLM's completions with a float32 transformers reference on the same GPU
that scores them token by token (teacher forcing), under the weights the engine should hold:

1. ``generation``: greedy completions and log-probs are the checkpoint's;
2. ``sampled``: temperature 0.7 twice with the same seeds gives the same tokens, with log-probs
   equal to ``log_softmax(logits / 0.7)`` (what a trainer recomputes);
3. ``full_sync``: after ``update_weights`` with a second random draw the completions are the new
   weights', no longer the old ones';
4. ``fused_split``: one layer's q/k/v sent in two buckets of one call (q first, k and v after
   other tensors), then q alone and k, v in a second call: after each call the log-probs are
   those of the reference holding exactly the mixed weights;
5. ``sleep_wake``: while ``sleep(2)`` holds, generate is refused and a sync that leaves out one
   ``v_proj`` is refused naming ``qkv_proj.weight[v_proj]``; a whole sync and ``wake_up()``
   bring the checkpoint's completions back; the memory sleep freed and each sync phase's free
   memory are recorded;
6. ``tied``: a tied-embedding checkpoint through generation, a full sync and the sleep cycle;
   its engine reports ``raw_logprobs`` (what ``logprobs_mode_for(1, 0.9)`` picks), and a
   ``top_p = 0.9`` run at T = 1 draws only nucleus tokens and reports ``log_softmax(logits)``.

Each sync's version, seconds, GB/s and free memory after each phase are in the report. It
prints one JSON report (also written to ``--json``) and exits 1 when a check fails, 2 without a
GPU. vLLM runs eagerly unless ``--cuda-graphs`` (vLLM's torch.compile and CUDA graphs: a slower
start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen3Config

from rstar2_scheduler import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    VLLMEngine,
    VLLMEngineConfig,
)
from rstar2_scheduler.engines import logprobs_mode_for
from rstar2_scheduler.engines.vllm_sync import fused_members, plan_buckets

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
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
"""vLLM's Qwen3 ``packed_modules_mapping``: which checkpoint tensors share a fused parameter."""
TINY_BUCKET_MB = 0.1
"""The tiny shape's bucket size: small enough for several buckets and a split fused layer."""
SAMPLED_T = 0.7
TOP_P = 0.9


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", help="untied checkpoint folder (default: a random one)")
    parser.add_argument("--tiny", action="store_true", help="2-layer shape instead of 0.6B")
    parser.add_argument("--head-std", type=float, default=0.5, help="random output head's std")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per check")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens per completion")
    parser.add_argument(
        "--bucket-mb", type=float, help=f"weight_bucket_mb (default 512; {TINY_BUCKET_MB} tiny)"
    )
    parser.add_argument("--gpu-memory", type=float, default=0.5, help="gpu_memory_utilization")
    parser.add_argument("--tolerance", type=float, default=0.25, help="log-prob tolerance (bf16)")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="vLLM's torch.compile and CUDA graphs"
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.bucket_mb is None:
        args.bucket_mb = TINY_BUCKET_MB if args.tiny else 512.0
    return args


def shape_name(args: argparse.Namespace) -> str:
    return "tiny" if args.tiny else "qwen3-0.6b"


def random_model(config: Any, *, seed: int, head_std: float) -> PreTrainedModel:
    """A random-weight model of ``config`` in bfloat16 whose output head (the embedding, when
    tied) is drawn with ``head_std``, so that greedy decoding has clear winners."""
    torch.manual_seed(seed)
    # transformers' stubs leave these calls untyped
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        head.weight.normal_(0.0, head_std)
    return model


def build_checkpoint(folder: Path, *, tiny: bool, tied: bool, seed: int, head_std: float) -> Path:
    """A random-weight Qwen3 checkpoint (config and safetensors, bfloat16) in ``folder``."""
    shape = SHAPES["tiny" if tiny else "qwen3-0.6b"]
    config = Qwen3Config(**shape, tie_word_embeddings=tied, max_position_embeddings=4096)
    random_model(config, seed=seed, head_std=head_std).save_pretrained(folder)
    return folder


def redraw(checkpoint: Path, *, seed: int, head_std: float) -> dict[str, torch.Tensor]:
    """Other weights for the same architecture: a fresh random draw from its config."""
    model = random_model(AutoConfig.from_pretrained(checkpoint), seed=seed, head_std=head_std)
    return {name: t.detach() for name, t in model.state_dict().items()}


def prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def attention_parts(layer: int) -> list[str]:
    """One layer's q, k and v projection weights: the parts of its fused ``qkv_proj``."""
    return [f"model.layers.{layer}.self_attn.{part}.weight" for part in PACKED["qkv_proj"]]


def fused_split(
    new: dict[str, torch.Tensor], current: dict[str, torch.Tensor], layer: int, limit: int
) -> list[tuple[str, torch.Tensor]]:
    """One sync that takes ``layer``'s q/k/v from ``new`` with q in an earlier bucket than k and
    v: q, then tensors of ``current`` (unchanged by it) until a bucket of ``limit`` bytes must be
    cut, then k and v. Raises ``ValueError`` when the other tensors cannot fill a bucket."""
    q, k, v = attention_parts(layer)
    order = [(q, new[q])]
    filled = 0
    for name, tensor in current.items():
        if filled > limit:
            break
        if name not in (q, k, v):
            order.append((name, tensor))
            filled += tensor.numel() * tensor.element_size()
    order += [(k, new[k]), (v, new[v])]
    homes = {
        name: index
        for index, bucket in enumerate(
            plan_buckets(order, limit_bytes=limit, members=fused_members(PACKED))
        )
        for name, _ in bucket
    }
    if homes[q] == homes[k]:
        raise ValueError(f"the other tensors do not fill a {limit}-byte bucket: use a smaller one")
    return order


def without(weights: dict[str, torch.Tensor], left_out: Iterable[str]) -> list[Any]:
    skipped = set(left_out)
    return [(name, tensor) for name, tensor in weights.items() if name not in skipped]


def requests(
    asks: list[list[int]], new_tokens: int, tag: str, *, temperature: float = 0.0, top_p: float = 1
) -> list[GenerationRequest]:
    """One request per prompt; a sampled one seeded by its prompt's index."""
    return [
        GenerationRequest(
            request_id=f"{tag}-{i}",
            prompt_ids=tuple(prompt),
            sampling=SamplingParams(
                max_new_tokens=new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=None if temperature == 0 else i,
            ),
        )
        for i, prompt in enumerate(asks)
    ]


async def complete(engine: VLLMEngine, asks: list[GenerationRequest]) -> list[GenerationResult]:
    results = await asyncio.gather(*(engine.generate(request) for request in asks))
    failed = [r.error for r in results if r.finish_reason == "error"]
    if failed:
        raise RuntimeError(f"generation failed: {failed[0]}")
    return list(results)


def reference_scores(
    reference: PreTrainedModel, prompt: list[int], tokens: list[int], temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` (plain logits when greedy) at every completion position."""
    device = next(reference.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logits = reference(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


def score(
    reference: PreTrainedModel,
    asks: list[GenerationRequest],
    results: list[GenerationResult],
    top_p: float = 1.0,
) -> list[dict[str, float]]:
    """Per completion: the largest gap between the engine's log-probs and the reference's, the
    share of tokens that are the reference's greedy choice, and the share inside its top-p
    nucleus (the tokens more likely than it hold less than ``top_p`` of the mass)."""
    scored = []
    for ask, result in zip(asks, results, strict=True):
        tokens = list(result.token_ids)
        scores = reference_scores(reference, list(ask.prompt_ids), tokens, ask.sampling.temperature)
        picked = torch.tensor(tokens, device=scores.device)
        chosen = scores.gather(1, picked[:, None])
        engine = torch.tensor(result.logprobs, device=scores.device)
        probs = scores.exp()
        before = (probs * (probs > chosen.exp())).sum(-1)
        scored.append(
            {
                "max_logprob_diff": float((chosen[:, 0] - engine).abs().max()),
                "greedy_share": float((scores.argmax(-1) == picked).float().mean()),
                "nucleus_share": float((before < top_p + 1e-2).float().mean()),
            }
        )
    return scored


def verdict(
    scored: list[dict[str, float]], *, tolerance: float, expect_match: bool, greedy: bool = True
) -> dict[str, Any]:
    """Whether completions are the reference's (every log-prob within ``tolerance``, and for
    greedy ones at least 90% greedy choices) or clearly are not (a log-prob off by over 5x
    ``tolerance``)."""
    worst = max(s["max_logprob_diff"] for s in scored)
    share = sum(s["greedy_share"] for s in scored) / len(scored)
    nucleus = min(s["nucleus_share"] for s in scored)
    matches = worst <= tolerance and (share >= 0.9 or not greedy)
    return {
        "max_logprob_diff": worst,
        "greedy_share": share,
        "nucleus_share": nucleus,
        "passed": matches if expect_match else worst > 5 * tolerance,
    }


def sync_figures(engine: VLLMEngine) -> dict[str, Any]:
    stats = engine.last_sync
    assert stats is not None
    return {**stats.model_dump(), "gb_per_s": stats.bytes / max(stats.seconds, 1e-9) / 1e9}


class Checker:
    """One engine, its reference model and the prompts: what every check needs."""

    def __init__(self, args: argparse.Namespace, engine: VLLMEngine, checkpoint: Path) -> None:
        self.args = args
        self.engine = engine
        original = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
        self.weights = {name: t.detach() for name, t in original.state_dict().items()}
        self.reference = original.float().cuda().eval()  # type: ignore[no-untyped-call]
        self.asks = prompts(args.prompts, args.prompt_tokens, self.reference.config.vocab_size)

    def hold(self, weights: dict[str, torch.Tensor]) -> None:
        """Make the reference hold ``weights`` (what the engine should hold now)."""
        self.reference.load_state_dict({k: v.float() for k, v in weights.items()})

    async def greedy(self, tag: str) -> list[GenerationResult]:
        return await complete(self.engine, requests(self.asks, self.args.new_tokens, tag))

    def judge(self, results: list[GenerationResult], *, expect_match: bool = True) -> Any:
        asks = requests(self.asks, self.args.new_tokens, "judged")
        scored = score(self.reference, asks, results)
        return verdict(scored, tolerance=self.args.tolerance, expect_match=expect_match)

    async def sync(self, weights: Any, version: str) -> dict[str, Any]:
        await self.engine.update_weights(weights, version=version)
        return sync_figures(self.engine)

    async def sleep_cycle(self, first: list[GenerationResult]) -> dict[str, Any]:
        """sleep(2): generate and a sync without one v_proj refused; a whole sync of the
        checkpoint's weights and wake_up() bring its completions back."""
        engine, report = self.engine, dict[str, Any]()
        before = torch.cuda.mem_get_info()[0]
        await engine.sleep(2)
        report["freed_gib"] = (torch.cuda.mem_get_info()[0] - before) / 2**30
        asleep = await engine.generate(requests(self.asks, 1, "asleep")[0])
        report["generate_refused"] = asleep.finish_reason == "error" and "asleep" in (
            asleep.error or ""
        )
        left_out = attention_parts(0)[2]
        try:
            await engine.update_weights(without(self.weights, [left_out]), version="partial")
            report["partial_sync_refused"] = False
        except RuntimeError as refusal:
            report["partial_sync_refused"] = "qkv_proj.weight[v_proj]" in str(refusal)
            report["refusal"] = str(refusal)
        report["sync"] = await self.sync(self.weights.items(), version="checkpoint")
        await engine.wake_up()
        again = await self.greedy("again")
        self.hold(self.weights)
        report["checkpoint_weights"] = self.judge(again)
        report["same_completions"] = [r.token_ids for r in again] == [r.token_ids for r in first]
        report["versions"] = sorted({str(r.weights_version) for r in again})
        report["passed"] = (
            report["freed_gib"] > 0
            and report["generate_refused"]
            and report["partial_sync_refused"]
            and report["checkpoint_weights"]["passed"]
            and report["versions"] == ["checkpoint"]
        )
        return report


def engine_for(args: argparse.Namespace, checkpoint: Path, logprobs_mode: Any) -> VLLMEngine:
    return VLLMEngine(
        VLLMEngineConfig(
            model=str(checkpoint),
            weight_bucket_mb=args.bucket_mb,
            logprobs_mode=logprobs_mode,
            engine_args={
                "enable_sleep_mode": True,
                "gpu_memory_utilization": args.gpu_memory,
                "skip_tokenizer_init": True,
                "dtype": "bfloat16",
                "max_model_len": args.prompt_tokens + args.new_tokens + 16,
                "enforce_eager": not args.cuda_graphs,
                "seed": 0,
            },
        )
    )


async def untied_checks(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    """Checks 1-5 on the untied checkpoint, its engine reporting processed log-probs."""
    engine = engine_for(args, checkpoint, logprobs_mode_for(SAMPLED_T, 1.0))
    check = Checker(args, engine, checkpoint)
    other = redraw(checkpoint, seed=1, head_std=args.head_std)
    report: dict[str, Any] = {"parameters": sum(t.numel() for t in check.weights.values())}
    started = time.perf_counter()
    await engine.start()
    report["start_s"] = time.perf_counter() - started
    try:
        first = await check.greedy("first")
        report["generation"] = check.judge(first)

        sampled = [
            await complete(
                engine, requests(check.asks, args.new_tokens, f"t{run}", temperature=SAMPLED_T)
            )
            for run in range(2)
        ]
        asks = requests(check.asks, args.new_tokens, "judged", temperature=SAMPLED_T)
        judged = verdict(
            score(check.reference, asks, sampled[0]),
            tolerance=args.tolerance,
            expect_match=True,
            greedy=False,
        )
        same = [r.token_ids for r in sampled[0]] == [r.token_ids for r in sampled[1]]
        report["sampled"] = {**judged, "same_tokens": same, "passed": judged["passed"] and same}

        full: dict[str, Any] = {"sync": await check.sync(other.items(), version="other")}
        changed = await check.greedy("other")
        check.hold(other)
        full["new_weights"] = check.judge(changed)
        check.hold(check.weights)
        full["old_weights_gone"] = check.judge(changed, expect_match=False)
        full["versions"] = sorted({str(r.weights_version) for r in changed})
        full["passed"] = (
            full["new_weights"]["passed"]
            and full["old_weights_gone"]["passed"]
            and full["versions"] == ["other"]
        )
        report["full_sync"] = full

        layer = check.reference.config.num_hidden_layers // 2
        limit = round(args.bucket_mb * 2**20)
        split: dict[str, Any] = {}
        mixed = {**other, **{n: check.weights[n] for n in attention_parts(layer)}}
        split["sync"] = await check.sync(fused_split(check.weights, other, layer, limit), "split")
        check.hold(mixed)
        split["one_call"] = check.judge(await check.greedy("split"))
        q, k, v = attention_parts(layer)
        await check.sync([(q, other[q])], version="q-only")
        check.hold({**mixed, q: other[q]})
        split["q_only"] = check.judge(await check.greedy("q-only"))
        await check.sync([(k, other[k]), (v, other[v])], version="k-v")
        check.hold(other)
        split["two_calls"] = check.judge(await check.greedy("k-v"))
        split["passed"] = all(split[key]["passed"] for key in ("one_call", "q_only", "two_calls"))
        report["fused_split"] = split

        report["sleep_wake"] = await check.sleep_cycle(first)
        report["timed_sync"] = await check.sync(check.weights.items(), version="timed")
    finally:
        await engine.close()
    return report


async def tied_checks(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Check 6: a tied-embedding checkpoint through the same cycle; its engine reports raw
    log-probs, which a top_p run at T = 1 needs."""
    checkpoint = build_checkpoint(folder, tiny=args.tiny, tied=True, seed=2, head_std=args.head_std)
    engine = engine_for(args, checkpoint, logprobs_mode_for(1.0, TOP_P))
    check = Checker(args, engine, checkpoint)
    report: dict[str, Any] = {"logprobs_mode": engine.config.logprobs_mode}
    await engine.start()
    try:
        first = await check.greedy("first")
        report["generation"] = check.judge(first)
        asks = requests(check.asks, args.new_tokens, "top-p", temperature=1.0, top_p=TOP_P)
        nucleus = await complete(engine, asks)
        judged = verdict(
            score(check.reference, asks, nucleus, top_p=TOP_P),
            tolerance=args.tolerance,
            expect_match=True,
            greedy=False,
        )
        report["top_p"] = {**judged, "passed": judged["passed"] and judged["nucleus_share"] >= 0.95}
        other = redraw(checkpoint, seed=3, head_std=args.head_std)
        report["full_sync"] = {"sync": await check.sync(other.items(), version="other")}
        check.hold(other)
        report["full_sync"]["new_weights"] = check.judge(await check.greedy("other"))
        report["full_sync"]["passed"] = report["full_sync"]["new_weights"]["passed"]
        report["sleep_wake"] = await check.sleep_cycle(first)
    finally:
        await engine.close()
    report["passed"] = all(report[key]["passed"] for key in ("generation", "top_p", "full_sync"))
    report["passed"] = report["passed"] and report["sleep_wake"]["passed"]
    return report


UNTIED_CHECKS = ["generation", "sampled", "full_sync", "fused_split", "sleep_wake"]


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    import vllm

    started = time.perf_counter()
    checkpoint = (
        Path(args.model)
        if args.model
        else build_checkpoint(
            folder / "untied", tiny=args.tiny, tied=False, seed=0, head_std=args.head_std
        )
    )
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "checkpoint": str(checkpoint) if args.model else f"random {shape_name(args)}",
        "cuda_graphs": args.cuda_graphs,
        "bucket_mb": args.bucket_mb,
    }
    report["untied"] = await untied_checks(args, checkpoint)
    report["tied"] = await tied_checks(args, folder / "tied")
    report["seconds"] = time.perf_counter() - started
    report["passed"] = (
        all(report["untied"][key]["passed"] for key in UNTIED_CHECKS) and (report["tied"]["passed"])
    )
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("vllm_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        report = asyncio.run(run(args, Path(folder)))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
