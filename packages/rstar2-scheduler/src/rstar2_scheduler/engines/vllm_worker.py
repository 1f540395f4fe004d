"""The worker extension ``VLLMEngine`` loads into every vLLM worker (``worker_extension_cls``).

vLLM adds this class to its worker's bases, so these methods run in each worker process (one per
tensor- and pipeline-parallel rank) and ``AsyncLLM.collective_rpc("rstar2_...")`` reaches all of
them. Every attribute is prefixed ``rstar2_``: vLLM refuses an extension whose names clash with
the worker's.

A bucket is loaded through the model's own ``load_weights``, as at start-up from a checkpoint:
each rank reads the full tensors from the buffer on its own device and keeps its shard, fused
layers take each part at its offset, and a bucket may hold any subset of the weights. vLLM skips
a tied alias (``lm_head.weight`` tied to ``model.embed_tokens.weight``) and raises when the
parameter it is tied to is not in the same call; the alias is therefore loaded under the tied
parameter's name when that is not in the bucket.

Every parameter's weight loader is wrapped while a bucket loads, so the worker reports how many
of the bucket's elements reached a loader (a tensor the model's ``load_weights`` dropped is
named). vLLM's ``load_weights`` names a fused parameter (``qkv_proj.weight``) or an MoE layer's
experts (``w13_weight``) as loaded once any one of its parts is, so the extension also records
which parts each loader call wrote: the shard id vLLM passes to ``param.weight_loader`` (``q``,
``k``, ``v``, an index; for experts ``w1``/``w2``/``w3`` and the expert's id). After discarded
weights the engine checks that every part came back, and refuses a sync whose parts it cannot
tell (a shard id this module does not know).

The extension also asks the kernel to kill its worker when the process that started the worker
exits (``die_with_parent``), so that no vLLM worker outlives an engine that was killed.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, cast

import torch

from rstar2_scheduler.engines import vllm_cpu
from rstar2_scheduler.engines.vllm_sync import packed_parts
from rstar2_scheduler.engines.vllm_transport import Transport, transport_for
from rstar2_scheduler.engines.vllm_wire import BucketReport, WeightBucket, WorkerInfo, dtype_name

WORKER_EXTENSION = "rstar2_scheduler.engines.vllm_worker.WeightSyncExtension"
"""The qualified name ``VLLMEngine`` passes as ``worker_extension_cls``."""

_PARENT = os.getppid()
"""The process that started this one, as it was when this module was imported (in a vLLM
worker: when vLLM resolved the extension, at the worker's start)."""

_PR_SET_PDEATHSIG = 1
"""``prctl`` option of Linux: the signal this process gets when its parent exits."""


class _Model(Protocol):
    """A vLLM model: ``load_weights`` takes checkpoint-named tensors, returns what it wrote."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[str] | None: ...


class _Worker(Protocol):
    """The parts of vLLM's worker the extension uses."""

    rank: int
    device: torch.device
    vllm_config: Any

    def get_model(self) -> Any: ...


def die_with_parent(parent: int = _PARENT) -> None:
    """Have the kernel kill this process (SIGKILL) when its parent exits: Linux's
    ``PR_SET_PDEATHSIG``. The parent is the thread that started this process, so the process
    that starts vLLM must start it from a thread that lives as long as the engine (the main
    thread, or an event loop's). If ``parent`` has exited already, this process exits now."""
    if not sys.platform.startswith("linux"):
        raise OSError(f"PR_SET_PDEATHSIG is Linux's; this is {sys.platform}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:  # the parent went before the request reached the kernel
        os.kill(os.getpid(), signal.SIGKILL)


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

EXPERT_SHARDS = {
    "w13_weight": ("w1", "w3"),
    "w13_bias": ("w1", "w3"),
    "w2_weight": ("w2",),
    "w2_bias": ("w2",),
}
"""The parameters of vLLM's ``FusedMoE`` (one row per local expert) and the shard ids its
weight loader writes each with: gate (w1) and up (w3) projections, down (w2)."""


def expert_parts(name: str, parameter: torch.Tensor) -> list[str] | None:
    """The parts of an MoE layer's expert parameter, ``expert{i}.{shard}`` for each local
    expert ``i``, or None for another parameter."""
    shards = EXPERT_SHARDS.get(name.rsplit(".", 1)[-1])
    if shards is None or parameter.dim() < 2:
        return None
    return [f"expert{i}.{shard}" for i in range(parameter.shape[0]) for shard in shards]


def parameter_parts(model: _Model, packed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each parameter of ``model`` that loads in parts -> its parts: fused layers (by
    ``packed``, the model's ``packed_modules_mapping``) and MoE experts."""
    parts: dict[str, list[str]] = {}
    for name, parameter in model.named_parameters():
        found = packed_parts(name, packed) or expert_parts(name, parameter)
        if found is not None:
            parts[name] = found
    return parts


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


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, *names: str) -> Any:
    if len(args) > position:
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def expert_indices(
    parts: list[str],
    loader: Callable[..., Any],
    loaded: torch.Tensor,
    param: torch.Tensor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> set[int] | None:
    """Which expert parts one call of ``FusedMoE.weight_loader(param, tensor, weight_name,
    shard_id, expert_id)`` wrote: the local expert's (vLLM maps the global id; an expert of
    another rank writes nothing), or that shard of every expert for a tensor holding all of
    them. None when the call cannot be read."""
    shard = _argument(args, kwargs, 1, "shard_id")
    expert = _argument(args, kwargs, 2, "expert_id")
    if not isinstance(shard, str):
        return None
    if loaded.dim() == param.dim():  # every expert at once
        found = {i for i, part in enumerate(parts) if part.endswith(f".{shard}")}
        return found or None
    if not isinstance(expert, int):
        return None
    local = getattr(
        getattr(loader, "__self__", None), "_map_global_expert_id_to_local_expert_id", None
    )
    index = int(local(expert)) if callable(local) else expert
    if index < 0:
        return set()  # another rank's expert
    label = f"expert{index}.{shard}"
    return {parts.index(label)} if label in parts else None


class LoadRecord:
    """What weight loaders were handed during one load: elements, tensors' addresses, and the
    parts of each parameter loaded in parts they wrote."""

    def __init__(self) -> None:
        self.elements = 0
        self.addresses: list[int] = []
        self.written: dict[str, set[int]] = {}
        self.unknown: dict[str, str] = {}
        self._depth = 0  # a loader may call another wrapped one: the outer call counts

    def recorder(
        self, name: str, parts: list[str] | None, loader: Callable[..., Any]
    ) -> Callable[..., Any]:
        """``loader``, counting what each call is handed and, for a parameter loaded in
        ``parts``, which parts it writes. vLLM calls a loader as ``loader(param, tensor)``,
        ``loader(param, tensor, shard_id)`` for a fused layer, and ``loader(param, tensor,
        weight_name, shard_id, expert_id)`` for experts."""
        experts = parts is not None and name.rsplit(".", 1)[-1] in EXPERT_SHARDS

        def record(param: Any, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            outer = self._depth == 0
            self._depth += 1
            try:
                result = loader(param, loaded, *args, **kwargs)
            finally:
                self._depth -= 1
            if not outer:
                return result
            self.elements += loaded.numel()
            self.addresses.append(loaded.data_ptr())
            if parts is not None:
                if experts:
                    indices = expert_indices(parts, loader, loaded, param, args, kwargs)
                    shard: object = _argument(args, kwargs, 1, "shard_id")
                else:
                    shard = _argument(args, kwargs, 0, "loaded_shard_id", "shard_id")
                    indices = shard_indices(shard, len(parts))
                if indices is None:
                    self.unknown.setdefault(name, f"shard id {shard!r}")
                else:
                    self.written.setdefault(name, set()).update(indices)
            return result

        return record


def _default_loader() -> Callable[..., Any] | None:
    """vLLM's loader for parameters that set none (None without vLLM)."""
    try:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    except ImportError:
        return None
    loader: Callable[..., Any] = default_weight_loader
    return loader


@contextmanager
def recording_loads(model: _Model, parts: dict[str, list[str]]) -> Iterator[LoadRecord]:
    """Wrap the weight loader of every parameter of ``model`` for the duration (vLLM's default
    loader where a parameter sets none, as vLLM's ``load_weights`` falls back to), recording
    what each call is handed; ``parts``: the parameters loaded in parts."""
    record = LoadRecord()
    default = _default_loader()
    wrapped: list[tuple[Any, Any]] = []
    try:
        for name, parameter in model.named_parameters():
            loader = getattr(parameter, "weight_loader", None)
            own = callable(loader)
            if not own:
                loader = default
            if callable(loader):
                recorder = record.recorder(name, parts.get(name), loader)
                setattr(parameter, "weight_loader", recorder)  # noqa: B010 - a property on vLLM's parameters
                wrapped.append((parameter, loader if own else None))
        yield record
    finally:
        for parameter, loader in wrapped:
            if loader is None:
                delattr(parameter, "weight_loader")
            else:
                setattr(parameter, "weight_loader", loader)  # noqa: B010


def _packed_modules(model: Any) -> dict[str, list[str]]:
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return {str(key): [str(part) for part in parts] for key, parts in packed.items()}


def _current_config(worker: _Worker) -> AbstractContextManager[Any]:
    """vLLM's config made current while loading, as its own weight-update path does (a worker
    without one, as in tests, loads without)."""
    if worker.vllm_config is None:
        return nullcontext()
    try:
        from vllm.config import set_current_vllm_config
    except ImportError:  # a stand-in worker outside vLLM (tests) has no config to make current
        return nullcontext()

    context: AbstractContextManager[Any] = set_current_vllm_config(worker.vllm_config)
    return context


def _unread(
    payload: WeightBucket, buffer: torch.Tensor, skipped: set[str], addresses: list[int]
) -> list[str]:
    """The bucket's tensors (less ``skipped``) whose bytes no loader was handed a view of."""
    base = buffer.data_ptr()
    seen = sorted(addresses)
    unread = []
    for slot in payload.tensors:
        start = base + slot.offset
        first = bisect.bisect_left(seen, start)
        read = first < len(seen) and seen[first] < start + max(slot.nbytes, 1)
        if slot.name not in skipped and not read:
            unread.append(slot.name)
    return unread


class WeightSyncExtension:
    """Loads weight buckets shared by ``VLLMEngine`` into this worker's model."""

    rstar2_transport: Transport | None = None
    """How shared buffers are opened; None: by this worker's device (``transport_for``)."""

    def rstar2_device_transport(self) -> Transport:
        """The transport that opens buffers on this worker's device."""
        worker = cast(_Worker, self)
        if self.rstar2_transport is None:
            self.rstar2_transport = transport_for(worker.device.type)
        return self.rstar2_transport

    def rstar2_die_with_parent(self) -> None:
        """Have this worker killed when the process that started it exits (``die_with_parent``)."""
        die_with_parent()

    def rstar2_worker_info(self) -> dict[str, Any]:
        """This rank, its device, and the model facts a sync plan needs."""
        worker = cast(_Worker, self)
        model: _Model = worker.get_model()
        model_config = getattr(worker.vllm_config, "model_config", None)
        dtype = getattr(model_config, "dtype", None)
        packed = _packed_modules(model)
        info = WorkerInfo(
            rank=worker.rank,
            device_uuid=self.rstar2_device_transport().device_uuid(worker.device),
            device_type=worker.device.type,
            dtype=dtype_name(dtype) if isinstance(dtype, torch.dtype) else None,
            parameters=[name for name, _ in model.named_parameters()],
            packed_modules=packed,
            parts=parameter_parts(model, packed),
            tied=tied_parameters(model),
            quantization=getattr(model_config, "quantization", None),
            packed=bool(vllm_cpu.packed_layers(cast(torch.nn.Module, model))),
        )
        return info.model_dump()

    def rstar2_load_weights(self, bucket: dict[str, Any]) -> dict[str, Any]:
        """Open ``bucket``'s buffer on this worker's device and load its tensors into the
        model."""
        worker = cast(_Worker, self)
        payload = WeightBucket.model_validate(bucket)
        transport = self.rstar2_device_transport()
        device = transport.device_uuid(worker.device)
        handle = payload.buffers.get(device)
        if handle is None:
            raise ValueError(
                f"rank {worker.rank}: bucket {payload.index} has no buffer on this worker's "
                f"device {device}; it has {sorted(payload.buffers)}"
            )
        buffer = transport.open(handle, worker.device)
        model: _Model = worker.get_model()
        cpu = worker.device.type == "cpu"
        if cpu:
            vllm_cpu.unpack(cast(torch.nn.Module, model))
        tied = tied_parameters(model)
        names = {slot.name for slot in payload.tensors}
        weights: list[tuple[str, torch.Tensor]] = []
        skipped: set[str] = set()
        for slot in payload.tensors:
            name = tied.get(slot.name, slot.name)
            if name != slot.name and name in names:
                skipped.add(slot.name)  # the tensor it is tied to comes in this bucket
                continue
            weights.append((name, slot.view(buffer)))
        expected = sum(tensor.numel() for _, tensor in weights)
        packed = _packed_modules(model)
        try:
            with (
                recording_loads(model, parameter_parts(model, packed)) as record,
                _current_config(worker),
                torch.no_grad(),
            ):
                loaded = model.load_weights(weights)
        finally:
            if cpu:
                vllm_cpu.compute_unpacked(cast(torch.nn.Module, model))
        transport.synchronize(worker.device)  # the copies out of the shared buffer are done
        unread = (
            _unread(payload, buffer, skipped, record.addresses)
            if record.elements < expected
            else []
        )
        del weights, buffer
        report = BucketReport(
            rank=worker.rank,
            bucket=payload.index,
            elements=record.elements,
            skipped=sorted(skipped),
            unread=unread,
            loaded=None if loaded is None else sorted(str(name) for name in loaded),
            shards={name: sorted(parts) for name, parts in sorted(record.written.items())},
            unknown_shards=dict(sorted(record.unknown.items())),
        )
        return report.model_dump()

    def rstar2_release_memory(self) -> None:
        """Hand this worker's cached, unused device memory back after a sync (the loaders'
        temporaries), so that the KV cache can wake into it."""
        worker = cast(_Worker, self)
        transport = self.rstar2_device_transport()
        transport.synchronize(worker.device)
        transport.empty_cache()
