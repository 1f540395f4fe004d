"""How a weight sync is cut into buckets and staged for vLLM's workers.

A sync streams ``(name, tensor)`` pairs into buckets of about ``limit_bytes``. The parts of one
fused vLLM parameter (q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``: the model's
``packed_modules_mapping``) stay in one bucket when they come one after another, as they do in a
``state_dict``; the model's ``load_weights`` would also take them apart, but one bucket keeps a
fused layer from ever holding old and new parts at once. Each name may appear once per sync.

Staging copies a bucket into one flat buffer per target device and shares each by handle; the
buffers must stay alive until every worker has loaded the bucket. Floating-point tensors travel
in the engine's dtype: a tensor that comes in another (a trainer's float32 master weights) is
cast as it is copied into the buffer, once, so the buffers, the workers' reads and the memory
a bucket takes are those of the engine's dtype.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from rstar2_scheduler.engine import NamedTensors
from rstar2_scheduler.engines.vllm_transport import Transport
from rstar2_scheduler.engines.vllm_wire import (
    TensorSlot,
    WeightBucket,
    aligned,
    dtype_name,
)

Bucket = list[tuple[str, torch.Tensor]]


def fused_members(packed_modules: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each part's module name -> its packed module (``q_proj`` -> ``qkv_proj``)."""
    return {part: packed for packed, parts in packed_modules.items() for part in parts}


def packed_parts(name: str, packed_modules: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The parts fused parameter ``name`` loads from, in vLLM's shard order, or None when it is
    not fused: ``model.layers.0.self_attn.qkv_proj.weight`` -> ``[q_proj, k_proj, v_proj]``. A
    module packed from one part (a checkpoint that stores it fused) is not fused here."""
    owner = name.split(".")[-2:-1]
    parts = packed_modules.get(owner[0]) if owner else None
    return list(parts) if parts is not None and len(parts) > 1 else None


def fusion_key(name: str, members: Mapping[str, str]) -> str:
    """The fused module ``name`` loads into (``name`` itself when it is not part of one): names
    with one key belong to one fused layer, whose weights and biases come interleaved.

    ``model.layers.0.self_attn.k_proj.bias`` -> ``model.layers.0.self_attn.qkv_proj``.
    """
    parts = name.split(".")
    for position, part in enumerate(parts):
        if part in members:
            return ".".join([*parts[:position], members[part]])
    return name


def plan_buckets(
    weights: NamedTensors,
    *,
    limit_bytes: int,
    members: Mapping[str, str],
    dtype: torch.dtype | None = None,
) -> Iterator[Bucket]:
    """``weights`` in buckets of at most ``limit_bytes`` (aligned sizes), never splitting
    consecutive parts of one fused parameter; a larger tensor or fused group gets a bucket of
    its own; sizes are those of the tensors in ``dtype`` (``wire_dtype``). Raises
    ``ValueError`` on a name seen twice and ``TypeError`` on a non-tensor."""
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    seen: set[str] = set()
    bucket: Bucket = []
    size = 0
    last_key: str | None = None
    for item in weights:
        name, tensor = item
        if not isinstance(name, str) or not name:
            raise TypeError(f"update_weights: expected (name, tensor) pairs, got name {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"update_weights: {name!r} is a {type(tensor).__name__}, not a torch.Tensor"
            )
        if name in seen:
            raise ValueError(f"update_weights: {name!r} appears more than once in one sync")
        seen.add(name)
        key = fusion_key(name, members)
        nbytes = aligned(tensor.numel() * wire_dtype(tensor, dtype).itemsize)
        if bucket and size + nbytes > limit_bytes and key != last_key:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
        last_key = key
    if bucket:
        yield bucket


@dataclass
class StagedBucket:
    """A bucket's wire form and the buffers it points to (keep them until it is loaded)."""

    payload: WeightBucket
    buffers: list[torch.Tensor]

    @property
    def names(self) -> list[str]:
        return [slot.name for slot in self.payload.tensors]


def wire_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``tensor`` travels in: ``dtype`` (the engine's) for a floating-point tensor,
    its own otherwise or without one."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def stage_bucket(
    index: int,
    bucket: Bucket,
    targets: Mapping[str, torch.device],
    transport: Transport,
    *,
    dtype: torch.dtype | None = None,
) -> StagedBucket:
    """Copy ``bucket`` into one flat buffer on each target device (id -> this process's
    device), floating-point tensors cast to ``dtype`` on the way, and share each; the copies
    have landed when this returns."""
    if not bucket:
        raise ValueError("an empty bucket has nothing to stage")
    if not targets:
        raise ValueError("no device to stage the bucket on")
    slots: list[TensorSlot] = []
    offset = 0
    for name, tensor in bucket:
        slots.append(
            TensorSlot(
                name=name,
                dtype=dtype_name(wire_dtype(tensor, dtype)),
                shape=list(tensor.shape),
                offset=offset,
            )
        )
        offset += aligned(slots[-1].nbytes)
    nbytes = max(offset, 1)
    buffers: list[torch.Tensor] = []
    with torch.no_grad():
        for device in targets.values():
            buffer = transport.allocate(nbytes, device)
            for slot, (_, tensor) in zip(slots, bucket, strict=True):
                slot.view(buffer).copy_(tensor.detach(), non_blocking=True)
            buffers.append(buffer)
    for device in targets.values():
        transport.synchronize(device)  # the copies must land before a worker reads them
    handles = {gpu: transport.share(buffer) for gpu, buffer in zip(targets, buffers, strict=True)}
    payload = WeightBucket(index=index, nbytes=nbytes, tensors=slots, buffers=handles)
    return StagedBucket(payload=payload, buffers=buffers)
