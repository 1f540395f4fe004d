"""The worker extension ``VLLMEngine`` loads into every vLLM worker (``worker_extension_cls``).

vLLM adds this class to its worker's bases, so these methods run in each worker process (one per
tensor- and pipeline-parallel rank) and ``AsyncLLM.collective_rpc("rstar2_...")`` reaches all of
them. Every attribute is prefixed ``rstar2_``: vLLM refuses an extension whose names clash with
the worker's.

A bucket is loaded through the model's own ``load_weights``, as at start-up from a checkpoint:
each rank reads the full tensors from the buffer on its own GPU and keeps its shard, fused
layers take each part at its offset, and a bucket may hold any subset of the weights. vLLM skips
a tied alias (``lm_head.weight`` tied to ``model.embed_tokens.weight``) and raises when the
parameter it is tied to is not in the same call; the alias is therefore loaded under the tied
parameter's name when that is not in the bucket.

vLLM's ``load_weights`` names a fused parameter (``qkv_proj.weight``) as loaded once any one of
its parts is, so the extension also records, per fused parameter, which parts its weight loader
wrote (the shard id vLLM passes to ``param.weight_loader``): after ``sleep(2)`` the engine checks
that every part of every fused parameter came back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, cast

import torch

from rstar2_scheduler.engines.vllm_sync import packed_parts
from rstar2_scheduler.engines.vllm_wire import (
    BucketReport,
    CudaIpcTransport,
    Transport,
    WeightBucket,
    WorkerInfo,
)

WORKER_EXTENSION = "rstar2_scheduler.engines.vllm_worker.WeightSyncExtension"
"""The qualified name ``VLLMEngine`` passes as ``worker_extension_cls``."""


class _Model(Protocol):
    """A vLLM model: ``load_weights`` takes checkpoint-named tensors, returns what it wrote."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[str] | None: ...


class _Worker(Protocol):
    """The parts of vLLM's GPU worker the extension uses."""

    rank: int
    device: torch.device
    vllm_config: Any

    def get_model(self) -> Any: ...


def tied_parameters(model: _Model) -> dict[str, str]:
    """Each parameter name that aliases another parameter -> the first name it was seen under
    (module order, as vLLM resolves ties)."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        canonical = first.setdefault(id(parameter), name)
        if canonical != name:
            tied[name] = canonical
    return tied


_QKV_SHARDS = {"q": 0, "k": 1, "v": 2}
"""vLLM's shard ids of ``QKVParallelLinear`` and their places in ``[q_proj, k_proj, v_proj]``."""


def shard_indices(shard: object, parts: int) -> set[int] | None:
    """Which of a fused parameter's ``parts`` one weight-loader call wrote, from vLLM's shard id:
    None (the whole fused tensor), ``"q"``/``"k"``/``"v"``, an index, or a span of indices.
    Returns None for anything else (the call cannot be read)."""
    if shard is None:
        return set(range(parts))
    if isinstance(shard, str):
        index = _QKV_SHARDS.get(shard)
        return None if index is None else {index}
    if isinstance(shard, int) and not isinstance(shard, bool):
        return {shard} if 0 <= shard < parts else None
    if isinstance(shard, tuple) and shard and all(isinstance(i, int) for i in shard):
        return set(shard) if all(0 <= i < parts for i in shard) else None
    return None


class ShardRecord:
    """The parts of each fused parameter that weight loaders wrote during one load."""

    def __init__(self) -> None:
        self.written: dict[str, set[int]] = {}
        self.unknown: set[str] = set()

    def recorder(self, name: str, parts: int, loader: Callable[..., Any]) -> Callable[..., Any]:
        """``loader``, noting which parts of ``name`` each call writes. vLLM calls a fused
        parameter's loader as ``loader(param, tensor, shard_id)``."""

        def record(param: Any, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            result = loader(param, loaded, *args, **kwargs)
            indices = shard_indices(shard, parts)
            if indices is None:
                self.unknown.add(name)
            else:
                self.written.setdefault(name, set()).update(indices)
            return result

        return record


@contextmanager
def recording_shards(model: _Model, packed: dict[str, list[str]]) -> Iterator[ShardRecord]:
    """Wrap the weight loader of every fused parameter of ``model`` (by ``packed``, the model's
    ``packed_modules_mapping``) for the duration, recording which parts each call writes."""
    record = ShardRecord()
    wrapped: list[tuple[Any, Any]] = []
    try:
        for name, parameter in model.named_parameters():
            parts = packed_parts(name, packed)
            loader = getattr(parameter, "weight_loader", None)
            if parts is not None and callable(loader):
                setattr(parameter, "weight_loader", record.recorder(name, len(parts), loader))  # noqa: B010 - a property on vLLM's parameters
                wrapped.append((parameter, loader))
        yield record
    finally:
        for parameter, loader in wrapped:
            setattr(parameter, "weight_loader", loader)  # noqa: B010


def _packed_modules(model: Any) -> dict[str, list[str]]:
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return {str(key): [str(part) for part in parts] for key, parts in packed.items()}


def _current_config(worker: _Worker) -> AbstractContextManager[Any]:
    """vLLM's config made current while loading, as its own weight-update path does (a worker
    without one, as in tests, loads without)."""
    if worker.vllm_config is None:
        return nullcontext()
    from vllm.config import set_current_vllm_config

    context: AbstractContextManager[Any] = set_current_vllm_config(worker.vllm_config)
    return context


class WeightSyncExtension:
    """Loads weight buckets shared by ``VLLMEngine`` into this worker's model."""

    rstar2_transport: Transport = CudaIpcTransport()
    """How shared buffers are opened (CUDA IPC; tests substitute host memory)."""

    def rstar2_worker_info(self) -> dict[str, Any]:
        """This rank, its GPU, and the model facts a sync plan needs."""
        worker = cast(_Worker, self)
        model: _Model = worker.get_model()
        model_config = getattr(worker.vllm_config, "model_config", None)
        info = WorkerInfo(
            rank=worker.rank,
            device_uuid=self.rstar2_transport.device_uuid(worker.device),
            parameters=[name for name, _ in model.named_parameters()],
            packed_modules=_packed_modules(model),
            tied=tied_parameters(model),
            quantization=getattr(model_config, "quantization", None),
        )
        return info.model_dump()

    def rstar2_load_weights(self, bucket: dict[str, Any]) -> dict[str, Any]:
        """Open ``bucket``'s buffer on this worker's GPU and load its tensors into the model."""
        worker = cast(_Worker, self)
        payload = WeightBucket.model_validate(bucket)
        transport = self.rstar2_transport
        gpu = transport.device_uuid(worker.device)
        handle = payload.buffers.get(gpu)
        if handle is None:
            raise ValueError(
                f"rank {worker.rank}: bucket {payload.index} has no buffer on this worker's GPU "
                f"{gpu}; it has {sorted(payload.buffers)}"
            )
        buffer = transport.open(handle, worker.device)
        model: _Model = worker.get_model()
        tied = tied_parameters(model)
        names = {slot.name for slot in payload.tensors}
        weights: list[tuple[str, torch.Tensor]] = []
        for slot in payload.tensors:
            name = tied.get(slot.name, slot.name)
            if name != slot.name and name in names:
                continue  # the tensor it is tied to comes in this bucket
            weights.append((name, slot.view(buffer)))
        with (
            recording_shards(model, _packed_modules(model)) as shards,
            _current_config(worker),
            torch.no_grad(),
        ):
            loaded = model.load_weights(weights)
        transport.synchronize(worker.device)  # the copies out of the shared buffer are done
        del weights, buffer
        report = BucketReport(
            rank=worker.rank,
            bucket=payload.index,
            received=len(payload.tensors),
            loaded=None if loaded is None else sorted(str(name) for name in loaded),
            shards={name: sorted(parts) for name, parts in sorted(shards.written.items())},
            unknown_shards=sorted(shards.unknown),
        )
        return report.model_dump()

    def rstar2_release_memory(self) -> None:
        """Hand this worker's cached, unused GPU memory back to the driver after a sync (the
        loaders' temporaries), so that the KV cache can wake into it."""
        worker = cast(_Worker, self)
        self.rstar2_transport.synchronize(worker.device)
        self.rstar2_transport.empty_cache()
