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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, cast

import torch

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
        packed = getattr(model, "packed_modules_mapping", None) or {}
        info = WorkerInfo(
            rank=worker.rank,
            device_uuid=self.rstar2_transport.device_uuid(worker.device),
            parameters=[name for name, _ in model.named_parameters()],
            packed_modules={str(k): [str(part) for part in v] for k, v in packed.items()},
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
        with _current_config(worker), torch.no_grad():
            loaded = model.load_weights(weights)
        transport.synchronize(worker.device)  # the copies out of the shared buffer are done
        del weights, buffer
        report = BucketReport(
            rank=worker.rank,
            bucket=payload.index,
            received=len(payload.tensors),
            loaded=None if loaded is None else sorted(str(name) for name in loaded),
        )
        return report.model_dump()
