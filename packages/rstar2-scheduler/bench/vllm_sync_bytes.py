"""What one vLLM weight sync moves on the engine's side for a model of a given shape, by the
dtype the weights come in and the dtype they travel in, on a CPU (no vLLM needed).

    python packages/rstar2-scheduler/bench/vllm_sync_bytes.py                # Qwen2.5-14B shape
    python packages/rstar2-scheduler/bench/vllm_sync_bytes.py --layers 4     # a slice, seconds

It runs ``VLLMEngine``'s own staging path, ``plan_buckets`` then ``stage_bucket``, over every
tensor of the shape (uninitialised, made one at a time and dropped once staged, so the whole
model is never held) into buckets of ``--bucket-mb`` in the node's shared memory
(``SharedMemoryTransport``, what CPU workers read), for three cases:

- ``fp32 as fp32``: float32 weights staged as they come (the engine before it cast; a float32
  engine);
- ``fp32 as bf16``: float32 weights (a trainer's master weights) cast to the engine's bf16 as they
  are copied into the buffer;
- ``bf16 as bf16``: weights the trainer cast before sending.

For each it prints the bytes given to ``update_weights`` (what crosses a process or node boundary
before the engine: Ray's object store for a remote engine), the bytes staged (one copy per worker
device; each worker reads them once), the buckets and the seconds spent staging. Seconds on a
CPU say what the copies and casts cost here, not what a GPU's would.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rstar2_scheduler.engines.vllm_sync import fused_members, plan_buckets, stage_bucket
from rstar2_scheduler.engines.vllm_transport import SharedMemoryTransport

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@dataclass(frozen=True)
class Shape:
    """A Qwen2-style decoder's sizes (defaults: Qwen2.5-14B's config.json)."""

    vocab: int = 152064
    hidden: int = 5120
    intermediate: int = 13824
    layers: int = 48
    heads: int = 40
    kv_heads: int = 8
    tied: bool = False


def shapes(shape: Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the model's state dict (HF names), in order."""
    head = shape.hidden // shape.heads
    kv = shape.kv_heads * head
    yield "model.embed_tokens.weight", (shape.vocab, shape.hidden)
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}"
        yield f"{prefix}.input_layernorm.weight", (shape.hidden,)
        for name, rows in (("q_proj", shape.hidden), ("k_proj", kv), ("v_proj", kv)):
            yield f"{prefix}.self_attn.{name}.weight", (rows, shape.hidden)
            yield f"{prefix}.self_attn.{name}.bias", (rows,)
        yield f"{prefix}.self_attn.o_proj.weight", (shape.hidden, shape.hidden)
        yield f"{prefix}.post_attention_layernorm.weight", (shape.hidden,)
        yield f"{prefix}.mlp.gate_proj.weight", (shape.intermediate, shape.hidden)
        yield f"{prefix}.mlp.up_proj.weight", (shape.intermediate, shape.hidden)
        yield f"{prefix}.mlp.down_proj.weight", (shape.hidden, shape.intermediate)
    yield "model.norm.weight", (shape.hidden,)
    if not shape.tied:
        yield "lm_head.weight", (shape.vocab, shape.hidden)


def weights(shape: Shape, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for name, size in shapes(shape):
        yield name, torch.empty(size, dtype=dtype)


def run(shape: Shape, given: torch.dtype, sent: torch.dtype, bucket_mb: float) -> dict[str, object]:
    transport = SharedMemoryTransport()
    targets = transport.local_devices()
    cast = None if sent == given else sent
    limit = round(bucket_mb * 2**20)
    given_bytes = staged_bytes = buckets = 0
    seconds = 0.0
    plan = plan_buckets(
        weights(shape, given), limit_bytes=limit, members=fused_members(PACKED), dtype=cast
    )
    for bucket in plan:
        started = time.perf_counter()
        staged = stage_bucket(buckets, bucket, targets, transport, dtype=cast)
        seconds += time.perf_counter() - started
        given_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
        staged_bytes += sum(slot.nbytes for slot in staged.payload.tensors)
        buckets += 1
        del staged, bucket
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    return {
        "case": f"{name[given]} as {name[sent]}",
        "given_gb": round(given_bytes / 1e9, 2),
        "staged_gb": round(staged_bytes / 1e9, 2),
        "buckets": buckets,
        "staging_s": round(seconds, 1),
        "staging_gb_per_s": round(staged_bytes / 1e9 / max(seconds, 1e-9), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--layers", type=int, default=Shape.layers, help="Decoder layers (48: the 14B shape)."
    )
    parser.add_argument(
        "--bucket-mb", type=float, default=512, help="VLLMEngineConfig.weight_bucket_mb."
    )
    args = parser.parse_args()
    if args.layers < 1 or args.bucket_mb <= 0:
        parser.error("--layers must be at least 1 and --bucket-mb positive")
    shape = Shape(layers=args.layers)
    cases = [
        (torch.float32, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
    ]
    results = [run(shape, given, sent, args.bucket_mb) for given, sent in cases]
    print(json.dumps({"shape": shape.__dict__, "results": results}, indent=1))


if __name__ == "__main__":
    main()
