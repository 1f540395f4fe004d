"""A recording stand-in for vLLM's ``AsyncLLM`` that applies vLLM's rules, on a CPU.

What it models, each as read in vLLM 0.32/0.33's source:

- ``collective_rpc``: the arguments cross the engine client's msgpack encoder and the engine
  core's decoder (vLLM's own ``MsgpackEncoder``/``MsgpackDecoder`` when vLLM is installed, else a
  check for the plain data that encoder accepts without ``VLLM_ALLOW_INSECURE_SERIALIZATION``),
  then every worker runs the method (``run_method``: a missing one raises NotImplementedError).
- Workers: vLLM mixes the extension into its worker class after checking that no attribute
  clashes; each rank holds its tensor-parallel shard of a Qwen2-shaped model. With
  ``model="vllm"`` (vLLM installed) the model is built from vLLM's own layers
  (``QKVParallelLinear``, ``MergedColumnParallelLinear``, ``RowParallelLinear``,
  ``VocabParallelEmbedding``, ``ParallelLMHead``) for each rank and loads through vLLM's own
  ``AutoWeightsLoader`` with Qwen2's weight mapper. With ``model="stand-in"`` its
  ``load_weights`` follows vLLM's: q/k/v and gate/up load into fused ``qkv_proj`` and
  ``gate_up_proj`` at their shard offsets through each parameter's ``weight_loader(param,
  tensor, shard_id)``, column-, row- and vocab-parallel layers keep their rank's slice, shapes
  must match, an unknown name raises, and a tied alias is skipped and raises when the parameter
  it is tied to is not in the same call. Either way a fused parameter is reported loaded once
  any one of its parts is.
- GPU memory (``HostMemory``): each GPU holds the model's weights and KV cache while they are
  awake, and the engine's process keeps what it staged in its caching allocator (the most it held
  at once) until it empties the cache; waking weights or the KV cache into less free memory than
  they need fails as CUDA would.
- ``sleep``: pauses scheduling (aborting requests), clears the prefix cache, then frees the
  weights (level 1 keeps a host copy, level 2 discards them: garbage after waking) and the KV
  cache; memory that sleeps cannot be written (vLLM would fault). ``wake_up(tags)``: a tag that
  is not asleep makes it wake nothing; it returns whether all memory is back, and only then
  resumes scheduling.
- ``reset_prefix_cache``: False while requests hold KV blocks, unless they are preempted.
- ``pause_generation``/``resume_generation``: resuming while memory sleeps is refused (the next
  step would run on unmapped memory).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal
from unittest import mock

import torch
from torch import nn
from transformers import Qwen2Config

from rstar2_scheduler.engines.vllm_wire import BufferHandle, CudaIpcHandle
from rstar2_scheduler.engines.vllm_worker import WeightSyncExtension

try:  # vLLM's own serializer when the extra is installed
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
except ImportError:
    MsgpackEncoder = MsgpackDecoder = None


def plain(value: Any, where: str = "arguments") -> None:
    """Raise TypeError as vLLM's encoder does for anything but plain data."""
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            plain(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            plain(key, f"{where} key")
            plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"Object of type {type(value)} is not serializable (at {where}). Set "
        "VLLM_ALLOW_INSECURE_SERIALIZATION=1 to allow fallback to pickle-based serialization."
    )


def wire(message: Any) -> Any:
    """``message`` after the trip from the engine client to the engine core."""
    if MsgpackEncoder is None:
        plain(message)
        return message
    return MsgpackDecoder().decode(MsgpackEncoder().encode(message))


class HostMemory:
    """Stands in for CUDA IPC on a CPU: sharing registers a buffer under a fresh handle (held
    weakly, as the producer owns it) and opening returns that very buffer.

    It also keeps the books of each GPU's memory: ``capacity`` bytes, less what the model holds
    awake there (``resident``, kept by the stand-in LLM), less what the engine's process reserved
    for staging (as torch's caching allocator does: the most it held at once, per GPU, until
    ``empty_cache``)."""

    def __init__(self, visible: Iterable[str], *, capacity: int = 2**40) -> None:
        self.visible = list(visible)
        self._buffers: weakref.WeakValueDictionary[bytes, torch.Tensor] = (
            weakref.WeakValueDictionary()
        )
        self._keys = itertools.count()
        self.shared: list[bytes] = []
        self.opened: list[tuple[str, bytes]] = []
        self.collected = 0
        self.capacity = capacity
        self.resident: dict[str, int] = {}
        self.reserved = 0
        self.emptied: list[str | None] = []  # whose cache was emptied: None is the engine's

    def staged_per_gpu(self) -> int:
        """Bytes the engine's live staging buffers hold on each GPU (each bucket is staged once
        on every GPU)."""
        live = sum(buffer.numel() for buffer in self._buffers.values())
        return live // max(1, len(self.visible))

    def free(self, uuid: str) -> int:
        return self.capacity - self.resident.get(uuid, 0) - self.reserved

    def engine(self) -> HostTransport:
        return HostTransport(self, None)

    def worker(self, uuid: str) -> HostTransport:
        return HostTransport(self, uuid)

    def alive(self) -> int:
        return len(self._buffers)


@dataclass
class HostTransport:
    memory: HostMemory
    uuid: str | None

    def device_uuid(self, device: torch.device) -> str:
        assert self.uuid is not None, "the engine's process asked for a worker's GPU"
        return self.uuid

    def local_devices(self) -> dict[str, torch.device]:
        return {uuid: torch.device("cpu", i) for i, uuid in enumerate(self.memory.visible)}

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def share(self, buffer: torch.Tensor) -> CudaIpcHandle:
        key = f"ipc-{next(self.memory._keys)}".encode()
        self.memory._buffers[key] = buffer
        self.memory.shared.append(key)
        self.memory.reserved = max(self.memory.reserved, self.memory.staged_per_gpu())
        return CudaIpcHandle.from_reduce_args(cuda_reduce_args(buffer, handle=key))

    def open(self, handle: BufferHandle, device: torch.device) -> torch.Tensor:
        assert self.uuid is not None
        assert isinstance(handle, CudaIpcHandle)
        assert len(handle.rebuild_args(0)) == 15
        buffer = self.memory._buffers.get(handle.handle)
        if buffer is None:
            raise RuntimeError("CUDA IPC: the shared buffer was freed before a worker opened it")
        assert buffer.numel() == handle.nbytes
        self.memory.opened.append((self.uuid, handle.handle))
        return buffer

    def synchronize(self, device: torch.device) -> None:
        pass

    def collect(self) -> None:
        self.memory.collected += 1

    def empty_cache(self) -> None:
        self.memory.emptied.append(self.uuid)
        if self.uuid is None:
            self.memory.reserved = self.memory.staged_per_gpu()

    def free_bytes(self, device: torch.device) -> int:
        return self.memory.free(self.memory.visible[device.index or 0])


def cuda_reduce_args(tensor: torch.Tensor, *, handle: bytes) -> tuple[Any, ...]:
    """What ``torch.multiprocessing.reductions.reduce_tensor`` returns for a CUDA tensor (its
    CUDA branch), built from a CPU tensor: the CUDA driver's handles are made-up bytes."""
    storage = tensor._typed_storage()
    return (
        type(tensor),
        tensor.size(),
        tensor.stride(),
        tensor.storage_offset(),
        type(storage),
        tensor.dtype,
        0,
        handle,
        tensor.numel() * tensor.element_size(),
        0,
        tensor.requires_grad,
        b"ref-counter-" + handle,
        0,
        b"event-" + handle,
        True,
    )


SMALLEST = Qwen2Config(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
"""A one-layer model for tests that generate through the stand-in and load no weights."""


STACKED = {
    ".q_proj": (".qkv_proj", "q"),
    ".k_proj": (".qkv_proj", "k"),
    ".v_proj": (".qkv_proj", "v"),
    ".gate_proj": (".gate_up_proj", 0),
    ".up_proj": (".gate_up_proj", 1),
}


class ShardModel(nn.Module):
    """One tensor-parallel rank of a Qwen2 model as vLLM lays it out (fused, sharded)."""

    packed_modules_mapping = {  # noqa: RUF012 - vLLM's class attribute
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, config: Qwen2Config, rank: int, tp: int) -> None:
        super().__init__()
        self.config, self.rank, self.tp = config, rank, tp
        hidden, inter = config.hidden_size, config.intermediate_size
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head = hidden // heads
        self.q_size, self.kv_size = heads * head // tp, kv_heads * head // tp
        self.inter = inter // tp
        self.mapped = True

        def parameter(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(*shape), requires_grad=False)

        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = parameter(config.vocab_size // tp, hidden)
        self.model.layers = nn.ModuleList()
        for _ in range(config.num_hidden_layers):
            layer = nn.Module()
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = nn.Module()
            layer.self_attn.qkv_proj.weight = parameter(self.q_size + 2 * self.kv_size, hidden)
            layer.self_attn.qkv_proj.bias = parameter(self.q_size + 2 * self.kv_size)
            layer.self_attn.o_proj = nn.Module()
            layer.self_attn.o_proj.weight = parameter(hidden, self.q_size)
            layer.mlp = nn.Module()
            layer.mlp.gate_up_proj = nn.Module()
            layer.mlp.gate_up_proj.weight = parameter(2 * self.inter, hidden)
            layer.mlp.down_proj = nn.Module()
            layer.mlp.down_proj.weight = parameter(hidden, self.inter)
            layer.input_layernorm = nn.Module()
            layer.input_layernorm.weight = parameter(hidden)
            layer.post_attention_layernorm = nn.Module()
            layer.post_attention_layernorm.weight = parameter(hidden)
            self.model.layers.append(layer)
        self.model.norm = nn.Module()
        self.model.norm.weight = parameter(hidden)
        self.lm_head = nn.Module()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self.lm_head.weight = parameter(config.vocab_size // tp, hidden)
        self.aliased = (
            {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}
        )
        for name, param in self.named_parameters():
            param.weight_loader = self._loader(name)  # vLLM's set_weight_attrs

    def params(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters())

    def _loader(self, name: str) -> Callable[..., None]:
        """Parameter ``name``'s weight loader: ``(param, tensor)``, or ``(param, tensor,
        shard_id)`` for one part of a fused parameter."""

        def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | int | None = None) -> None:
            destination, source = self._shard(name, param, tensor, shard)
            if destination.shape != source.shape:
                raise AssertionError(
                    f"{name}: shard shape {tuple(source.shape)} != {tuple(destination.shape)}"
                )
            destination.copy_(source)

        return load

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = self.params()
        loaded: set[str] = set()
        skipped: dict[str, str] = {}
        for name, tensor in weights:
            if name in self.aliased:
                skipped[name] = self.aliased[name]
                continue
            target, shard = name, None
            for part, (fused, shard_id) in STACKED.items():
                if part in name:
                    target, shard = name.replace(part, fused, 1), shard_id
                    break
            param = params.get(target)
            if param is None:
                raise ValueError(f"There is no module or parameter named {target!r} in Qwen2")
            if not self.mapped:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            if shard is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
            loaded.add(target)  # vLLM's rule: a fused parameter is loaded after any one part
        for alias, canonical in skipped.items():
            if canonical not in loaded:
                raise ValueError(
                    f"{alias!r} was skipped because it is tied to {canonical!r} in Qwen2, but "
                    f"{canonical!r} was not found in the checkpoint, so the tied weight is "
                    "uninitialized."
                )
        return loaded

    def _shard(
        self, target: str, param: torch.Tensor, tensor: torch.Tensor, shard: str | int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rank = self.rank
        if shard is not None and ".qkv_proj" in target:
            offsets = {"q": (0, self.q_size), "k": (self.q_size, self.kv_size)}
            offsets["v"] = (self.q_size + self.kv_size, self.kv_size)
            start, size = offsets[str(shard)]
            return param.narrow(0, start, size), tensor.narrow(0, rank * size, size)
        if shard is not None:  # gate_up_proj
            size = self.inter
            return param.narrow(0, int(shard) * size, size), tensor.narrow(0, rank * size, size)
        if target.endswith(("o_proj.weight", "down_proj.weight")):  # row parallel
            size = param.shape[1]
            return param, tensor.narrow(1, rank * size, size)
        if target.endswith(("embed_tokens.weight", "lm_head.weight")):  # vocab parallel
            size = param.shape[0]
            return param, tensor.narrow(0, rank * size, size)
        return param, tensor


class VLLMShardModel(nn.Module):
    """One tensor-parallel rank of a Qwen2 model built from vLLM's own layers, loading through
    vLLM's own ``AutoWeightsLoader`` and Qwen2's weight mapper (needs vLLM; no GPU: the layers'
    weights are plain CPU tensors, and vLLM's tensor-parallel group is this rank's for the
    build)."""

    packed_modules_mapping = ShardModel.packed_modules_mapping

    def __init__(self, config: Qwen2Config, rank: int, tp: int) -> None:
        super().__init__()
        from vllm.distributed import parallel_state
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear,
            QKVParallelLinear,
            RowParallelLinear,
        )
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            VocabParallelEmbedding,
        )
        from vllm.model_executor.models.qwen2 import Qwen2Model
        from vllm.model_executor.models.utils import AutoWeightsLoader

        self.mapped = True
        hidden, heads = config.hidden_size, config.num_attention_heads
        group = SimpleNamespace(rank_in_group=rank, world_size=tp)

        def norm() -> nn.Module:
            module = nn.Module()
            module.weight = nn.Parameter(torch.zeros(hidden), requires_grad=False)
            return module

        class Layers(nn.Module):
            def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
                return AutoWeightsLoader(self).load_weights(
                    weights, mapper=Qwen2Model.hf_to_vllm_mapper
                )

        with mock.patch.object(parallel_state, "get_tp_group", return_value=group):
            self.model = Layers()
            self.model.embed_tokens = VocabParallelEmbedding(config.vocab_size, hidden)
            self.model.layers = nn.ModuleList()
            for index in range(config.num_hidden_layers):
                prefix = f"model.layers.{index}"
                layer = nn.Module()
                layer.self_attn = nn.Module()
                layer.self_attn.qkv_proj = QKVParallelLinear(
                    hidden,
                    hidden // heads,
                    heads,
                    config.num_key_value_heads,
                    bias=True,
                    prefix=f"{prefix}.self_attn.qkv_proj",
                )
                layer.self_attn.o_proj = RowParallelLinear(
                    hidden, hidden, bias=False, prefix=f"{prefix}.self_attn.o_proj"
                )
                layer.mlp = nn.Module()
                layer.mlp.gate_up_proj = MergedColumnParallelLinear(
                    hidden,
                    [config.intermediate_size] * 2,
                    bias=False,
                    prefix=f"{prefix}.mlp.gate_up_proj",
                )
                layer.mlp.down_proj = RowParallelLinear(
                    config.intermediate_size, hidden, bias=False, prefix=f"{prefix}.mlp.down_proj"
                )
                layer.input_layernorm = norm()
                layer.post_attention_layernorm = norm()
                self.model.layers.append(layer)
            self.model.norm = norm()
            self.lm_head = ParallelLMHead(config.vocab_size, hidden, prefix="lm_head")
            if config.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        for param in self.parameters():
            with torch.no_grad():
                param.zero_()
        self._loader = AutoWeightsLoader

    def params(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if not self.mapped:
            weights = list(weights)
            if weights:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
        loaded: set[str] = self._loader(self).load_weights(weights)
        return loaded


ModelKind = Literal["stand-in", "vllm"]


def shard_model(kind: ModelKind, config: Qwen2Config, rank: int, tp: int) -> nn.Module:
    """Rank ``rank`` of ``tp``: the stand-in's own model, or one built from vLLM's layers."""
    if kind == "vllm":
        return VLLMShardModel(config, rank, tp)
    return ShardModel(config, rank, tp)


def expected_shards(full: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s vLLM parameters computed directly from a full HF state dict."""
    out: dict[str, torch.Tensor] = {}

    def chunk(tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return tensor.chunk(tp, dim)[rank]

    for name, tensor in full.items():
        if name == "lm_head.weight" and "model.embed_tokens.weight" in full:
            continue
        if ".q_proj." in name:
            k, v = (full[name.replace(".q_proj.", p)] for p in (".k_proj.", ".v_proj."))
            fused = name.replace(".q_proj.", ".qkv_proj.")
            out[fused] = torch.cat([chunk(tensor), chunk(k), chunk(v)])
        elif ".gate_proj." in name:
            up = full[name.replace(".gate_proj.", ".up_proj.")]
            out[name.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat(
                [chunk(tensor), chunk(up)]
            )
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = chunk(tensor, 1)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            out[name] = chunk(tensor)
        elif not any(p in name for p in (".k_proj.", ".v_proj.", ".up_proj.")):
            out[name] = tensor
    return out


class StandInWorker:
    """vLLM's GPU worker as far as the extension sees it."""

    def __init__(self, rank: int, model: Any) -> None:
        self.rank = rank
        self.device = torch.device("cpu")
        self.vllm_config = None
        self.model = model

    def get_model(self) -> Any:
        return self.model

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass


def extended_worker_class(extension: type) -> type:
    """vLLM's ``init_worker``: refuse clashing names, then add the extension to the bases."""
    for attribute in dir(extension):
        if attribute.startswith("__"):
            continue
        assert not hasattr(StandInWorker, attribute), f"{attribute} clashes with the worker"
    return type("ExtendedWorker", (StandInWorker, extension), {})


@dataclass
class Request:
    """A request the stand-in holds: it holds KV blocks until released or aborted."""

    request_id: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False


def sampling_mask(token_ids: list[list[int]]) -> Any:
    """vLLM's own ``SamplingMask`` where vLLM is installed (0.32 and later), else its shape."""
    try:
        from vllm.outputs import SamplingMask
    except ImportError:
        return SimpleNamespace(token_ids=token_ids)
    return SamplingMask(token_ids=token_ids)


class StandInAsyncLLM:
    """The ``AsyncLLM`` calls ``VLLMEngine`` makes, recorded, with vLLM's rules (see module)."""

    def __init__(
        self,
        config: Qwen2Config,
        *,
        tp: int = 1,
        memory: HostMemory | None = None,
        extension: type = WeightSyncExtension,
        quantization: str | None = None,
        model: ModelKind = "stand-in",
        kv_bytes: int = 0,
        dtype: torch.dtype | None = None,
        sampling_masks: list[list[int]] | None = None,
    ) -> None:
        self.sampling_masks = sampling_masks  # per answered token, as return_sampling_mask gives
        self.uuids = [f"GPU-{rank}" for rank in range(tp)]
        self.memory = memory if memory is not None else HostMemory(self.uuids)
        self.kv_bytes = kv_bytes  # each rank's KV cache
        worker_class = extended_worker_class(extension)
        self.workers = [
            worker_class(rank, shard_model(model, config, rank, tp)) for rank in range(tp)
        ]
        for worker, uuid in zip(self.workers, self.uuids, strict=True):
            if isinstance(worker, WeightSyncExtension):
                worker.rstar2_transport = self.memory.worker(uuid)
        model_config = SimpleNamespace(quantization=quantization, dtype=dtype)
        for worker in self.workers:
            if dtype is not None:
                worker.model.to(dtype)
            worker.vllm_config = (
                None
                if quantization is None and dtype is None
                else SimpleNamespace(model_config=model_config)
            )
        self.vllm_config = SimpleNamespace(
            cache_config=SimpleNamespace(num_gpu_blocks=64, block_size=16),
            scheduler_config=SimpleNamespace(max_num_seqs=32),
        )
        self.calls: list[tuple[Any, ...]] = []
        self.payloads: list[dict[str, Any]] = []
        self.sleeping: set[str] = set()
        self.level = 0
        self.paused = False
        self.cached_prefixes = 5
        self.requests: dict[str, Request] = {}
        self.held = asyncio.Event()  # set while a request is held
        self.preempted = 0
        self.version: str | None = None
        self._saved: list[dict[str, torch.Tensor]] = []
        self._account()

    def models(self) -> list[Any]:
        return [worker.model for worker in self.workers]

    def weight_bytes(self, rank: int) -> int:
        params = self.workers[rank].model.params().values()
        return sum(p.numel() * p.element_size() for p in params)

    def _needs(self, rank: int, tags: Iterable[str]) -> int:
        return sum(self.weight_bytes(rank) if tag == "weights" else self.kv_bytes for tag in tags)

    def _account(self) -> None:
        """What each GPU holds awake, for the memory's books."""
        awake = {"weights", "kv_cache"} - self.sleeping
        for rank, uuid in enumerate(self.uuids):
            self.memory.resident[uuid] = self._needs(rank, awake)

    def methods(self) -> list[str]:
        return [call[0] if call[0] != "collective_rpc" else call[1] for call in self.calls]

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,  # noqa: ASYNC109 - AsyncLLM's signature
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        self.calls.append(("collective_rpc", method))
        _, _, _, (method, timeout, args, kwargs) = wire(
            (0, 1, "collective_rpc", (method, timeout, args, kwargs))
        )
        if method == "rstar2_load_weights":
            self.payloads.append(kwargs["bucket"])
        results = []
        for worker in self.workers:
            function = getattr(worker, method, None)
            if function is None:
                raise NotImplementedError(f"Method {method!r} is not implemented.")
            results.append(function(*args, **(kwargs or {})))
        return list(wire(results))

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level))
        self._pause("abort")
        if "weights" in self.sleeping:
            return  # vLLM's executor: "already sleeping", nothing happens
        for model in self.models():
            model.mapped = False
        self._saved = [
            {name: p.detach().clone() for name, p in model.params().items()} if level == 1 else {}
            for model in self.models()
        ]
        self.sleeping = {"weights", "kv_cache"}
        self.level = level
        self._account()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", None if tags is None else list(tags)))
        if tags is not None:
            tags = [tag for tag in tags if tag != "scheduling"]
        if tags is None or tags:
            self._wake_executor(tags)
        fully_awake = not self.sleeping
        if fully_awake:
            self.paused = False
        return fully_awake

    def _wake_executor(self, tags: list[str] | None) -> None:
        if not self.sleeping:
            return  # "Executor is not sleeping."
        if tags and any(tag not in self.sleeping for tag in tags):
            return  # "Tag ... is not in sleeping tags": nothing wakes
        waking = set(self.sleeping) if tags is None else set(tags)
        for rank, uuid in enumerate(self.uuids):
            needed, free = self._needs(rank, waking), self.memory.free(uuid)
            if needed > free:
                raise RuntimeError(
                    f"CUDA error: out of memory (waking {sorted(waking)} needs {needed} bytes on "
                    f"{uuid}, {free} are free)"
                )
        if "weights" in waking:
            for model, saved in zip(self.models(), self._saved, strict=True):
                model.mapped = True
                with torch.no_grad():
                    for name, param in model.params().items():
                        param.copy_(saved[name] if saved else torch.full_like(param, math.nan))
        self.sleeping -= waking
        self._account()

    async def is_sleeping(self) -> bool:
        return self.paused or bool(self.sleeping)

    def _pause(self, mode: str) -> None:
        if mode == "abort":
            for request in self.requests.values():
                request.aborted = True
                request.done.set()
            self.requests.clear()
        self.paused = True
        self.cached_prefixes = 0

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause_generation", mode, clear_cache))
        self.paused = True
        if mode == "abort":
            self._pause(mode)
        if clear_cache:
            assert await self.reset_prefix_cache(reset_running_requests=True)

    async def resume_generation(self) -> None:
        self.calls.append(("resume_generation",))
        assert not self.sleeping, "scheduling resumed while memory sleeps"
        self.paused = False

    async def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        if self.requests and not reset_running_requests:
            return False  # blocks still in use
        if reset_running_requests:
            self.preempted += len(self.requests)
        self.cached_prefixes = 0
        return True

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        """Ends the requests: each answers what it has with finish_reason "abort"."""
        self.calls.append(
            ("abort", [request_id] if isinstance(request_id, str) else list(request_id))
        )
        for name in self.calls[-1][1]:
            request = self.requests.pop(name, None)
            if request is not None:
                request.aborted = True
                request.done.set()

    async def update_weight_version(self, new_version: str) -> None:
        self.calls.append(("update_weight_version", new_version))
        self.version = new_version

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """Holds the request (and its KV blocks) until ``release``; answers token 1, then 2."""
        if self.paused or self.sleeping:
            raise RuntimeError("Generation is paused. Please retry after it resumes.")
        request = Request(request_id)
        self.requests[request_id] = request
        self.held.set()
        await request.done.wait()
        self.held.clear()
        self.requests.pop(request_id, None)
        logprob = SimpleNamespace(logprob=-0.25)
        completion = SimpleNamespace(
            token_ids=[1, 2],
            logprobs=[{1: logprob}, {2: logprob}],
            finish_reason="abort" if request.aborted else "stop",
            sampling_mask=None
            if self.sampling_masks is None
            else sampling_mask(self.sampling_masks),
        )
        yield SimpleNamespace(outputs=[completion])

    def release(self) -> None:
        for request in list(self.requests.values()):
            request.done.set()


class ExpertLayer(nn.Module):
    """An MoE layer's experts as vLLM's ``FusedMoE`` holds them: ``w13_weight`` (gate and up
    of each local expert), ``w2_weight`` (down), loaded through ``weight_loader(param, tensor,
    weight_name, shard_id, expert_id)`` with the global expert id, which maps to a local one
    (-1: another rank's expert, not written)."""

    def __init__(self, experts: list[int], hidden: int, inter: int) -> None:
        super().__init__()
        self.experts, self.inter = experts, inter
        self.w13_weight = nn.Parameter(torch.zeros(len(experts), 2 * inter, hidden), False)
        self.w2_weight = nn.Parameter(torch.zeros(len(experts), hidden, inter), False)
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader

    def _map_global_expert_id_to_local_expert_id(self, expert_id: int) -> int:
        return self.experts.index(expert_id) if expert_id in self.experts else -1

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
        return_success: bool = False,
    ) -> bool | None:
        local = self._map_global_expert_id_to_local_expert_id(expert_id)
        if local == -1:
            return False if return_success else None
        if shard_id not in ("w1", "w2", "w3"):
            raise ValueError(f"shard_id must be ['w1','w2','w3'] but got {shard_id}.")
        rows = {"w1": slice(0, self.inter), "w3": slice(self.inter, None), "w2": slice(None)}
        param.data[local, rows[shard_id]].copy_(loaded)
        return True if return_success else None


class ExpertModel(nn.Module):
    """A one-layer MoE model (the rank holds ``experts`` of ``total``) beside a fused layer
    whose loader takes shard ids ``fused_shards`` (``q``/``k``: ones rstar2 reads)."""

    packed_modules_mapping = {"fused_qk": ["q_part", "k_part"]}  # noqa: RUF012

    def __init__(
        self, experts: list[int], *, total: int = 4, fused_shards: tuple[str, str] = ("q", "k")
    ) -> None:
        super().__init__()
        self.mapped, self.total, self.fused_shards = True, total, fused_shards
        self.model = nn.Module()
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.zeros(8), requires_grad=False)
        self.model.norm.weight.weight_loader = lambda p, t: p.data.copy_(t)
        self.model.fused_qk = nn.Module()
        self.model.fused_qk.weight = nn.Parameter(torch.zeros(8, 8), requires_grad=False)
        self.model.fused_qk.weight.weight_loader = self._fused
        self.model.experts = ExpertLayer(experts, hidden=8, inter=4)

    def _fused(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        index = self.fused_shards.index(shard)
        param.data[4 * index : 4 * index + 4].copy_(loaded)

    def params(self) -> dict[str, nn.Parameter]:
        return dict(self.named_parameters())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = self.params()
        loaded: set[str] = set()
        for name, tensor in weights:
            if not self.mapped:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            parts = name.split(".")
            if parts[:2] == ["model", "experts"]:  # model.experts.<e>.<w1|w2|w3>.weight
                stem = "w2" if parts[3] == "w2" else "w13"
                target = f"model.experts.{stem}_weight"
                param = params[target]
                param.weight_loader(param, tensor, name, shard_id=parts[3], expert_id=int(parts[2]))
            elif name.startswith("model.fused_qk."):  # model.fused_qk.<q|k>_part.weight
                target = "model.fused_qk.weight"
                shard = self.fused_shards["qk".index(parts[2][0])]
                params[target].weight_loader(params[target], tensor, shard)
            else:
                target = name
                params[target].weight_loader(params[target], tensor)
            loaded.add(target)
        return loaded


def expert_weights(total: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint of ``ExpertModel``: one tensor per expert and shard, as MoE checkpoints
    store them."""
    generator = torch.Generator().manual_seed(seed)
    weights = {
        "model.norm.weight": torch.randn(8, generator=generator),
        "model.fused_qk.q_part.weight": torch.randn(4, 8, generator=generator),
        "model.fused_qk.k_part.weight": torch.randn(4, 8, generator=generator),
    }
    for expert in range(total):
        for shard, shape in (("w1", (4, 8)), ("w3", (4, 8)), ("w2", (8, 4))):
            weights[f"model.experts.{expert}.{shard}.weight"] = torch.randn(
                *shape, generator=generator
            )
    return weights
