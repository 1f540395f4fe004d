"""What crosses vLLM's ``collective_rpc`` during a weight sync, and how buffers are shared.

``AsyncLLM.collective_rpc`` sends its arguments to the engine-core process with vLLM's own
msgpack encoder (``vllm.v1.serial_utils.MsgpackEncoder``). Without
``VLLM_ALLOW_INSECURE_SERIALIZATION`` it accepts plain data only (str, int, float, bool, bytes,
lists, dicts) and raises ``TypeError`` for anything else. torch's CUDA-IPC arguments
(``torch.multiprocessing.reductions.reduce_tensor``) hold a tensor class, a storage class and a
``torch.dtype``, so they cannot cross as they are: here they travel as a ``CudaIpcHandle`` of
strings, integers and bytes, and the worker turns it back into ``rebuild_cuda_tensor``'s
arguments. Everything in this module is plain pydantic over plain data, so what the engine sends
is validated again where the worker receives it.

A sync moves weights in buckets. For each bucket the engine packs the tensors into one flat
``uint8`` buffer per GPU that a vLLM worker runs on (a worker can only open memory of its own
GPU), and sends one handle per GPU, keyed by the GPU's UUID, with each tensor's name, dtype,
shape and byte offset in the buffer.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Self

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ALIGNMENT = 256
"""Byte alignment of each tensor in a bucket's buffer (any dtype can view it; CUDA's own)."""

_REBUILD_ARGUMENTS = 15
"""``rebuild_cuda_tensor``'s parameter count, the length of ``reduce_tensor``'s CUDA arguments."""


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the next multiple of ``ALIGNMENT``."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``bfloat16``, ``float32``, ...)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype (e.g. 'bfloat16', 'float32')")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, as vLLM's encoder writes dtypes."""
    return str(dtype).removeprefix("torch.")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CudaIpcHandle(_Record):
    """One flat ``uint8`` CUDA buffer shared by torch's CUDA IPC, as plain data.

    The fields are ``rebuild_cuda_tensor``'s arguments less those that are fixed for a flat byte
    buffer (tensor and storage classes, dtype ``uint8``, stride 1, offset 0).
    """

    nbytes: int = Field(gt=0, description="Length of the buffer in bytes.")
    device: int = Field(ge=0, description="The sharing process's device index (informative).")
    handle: bytes = Field(description="cudaIpcMemHandle of the allocation holding the buffer.")
    storage_size_bytes: int = Field(ge=0)
    storage_offset_bytes: int = Field(ge=0, description="Offset of the storage in its allocation.")
    ref_counter_handle: bytes
    ref_counter_offset: int = Field(ge=0)
    event_handle: bytes
    event_sync_required: bool

    @classmethod
    def from_reduce_args(cls, args: tuple[Any, ...]) -> Self:
        """From the arguments ``reduce_tensor`` returns for a flat ``uint8`` CUDA tensor."""
        if len(args) != _REBUILD_ARGUMENTS:
            raise ValueError(
                f"expected torch's {_REBUILD_ARGUMENTS} rebuild_cuda_tensor arguments, "
                f"got {len(args)}"
            )
        (
            tensor_cls,
            size,
            stride,
            tensor_offset,
            storage_cls,
            dtype,
            device,
            handle,
            storage_size_bytes,
            storage_offset_bytes,
            requires_grad,
            ref_counter_handle,
            ref_counter_offset,
            event_handle,
            event_sync_required,
        ) = args
        if tensor_cls is not torch.Tensor or storage_cls is not torch.storage.TypedStorage:
            raise ValueError(
                f"expected a plain tensor over a TypedStorage, got {tensor_cls} over {storage_cls}"
            )
        if dtype != torch.uint8 or len(size) != 1 or tuple(stride) != (1,) or tensor_offset:
            raise ValueError(
                "only flat, contiguous uint8 buffers are shared; got "
                f"dtype {dtype}, size {tuple(size)}, stride {tuple(stride)}, offset {tensor_offset}"
            )
        if requires_grad:
            raise ValueError("a shared weight buffer must not require grad")
        return cls(
            nbytes=int(size[0]),
            device=int(device),
            handle=bytes(handle),
            storage_size_bytes=int(storage_size_bytes),
            storage_offset_bytes=int(storage_offset_bytes),
            ref_counter_handle=bytes(ref_counter_handle),
            ref_counter_offset=int(ref_counter_offset),
            event_handle=bytes(event_handle),
            event_sync_required=bool(event_sync_required),
        )

    def rebuild_args(self, device_index: int) -> tuple[Any, ...]:
        """``rebuild_cuda_tensor``'s arguments, opening the buffer on ``device_index``: the
        receiving process's index of the same physical GPU (indices differ between processes)."""
        return (
            torch.Tensor,
            torch.Size([self.nbytes]),
            (1,),
            0,
            torch.storage.TypedStorage,
            torch.uint8,
            device_index,
            self.handle,
            self.storage_size_bytes,
            self.storage_offset_bytes,
            False,
            self.ref_counter_handle,
            self.ref_counter_offset,
            self.event_handle,
            self.event_sync_required,
        )


class TensorSlot(_Record):
    """Where one named tensor lies in a bucket's buffer."""

    name: str = Field(min_length=1)
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0, description="Byte offset in the buffer (a multiple of ALIGNMENT).")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        torch_dtype(value)
        return value

    @field_validator("shape")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if any(size < 0 for size in value):
            raise ValueError(f"negative size in shape {value}")
        return value

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch_dtype(self.dtype).itemsize

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        """This tensor, as a view into ``buffer`` (no copy)."""
        dtype = torch_dtype(self.dtype)
        return buffer[self.offset : self.offset + self.nbytes].view(dtype).view(self.shape)


class WeightBucket(_Record):
    """One bucket of a weight sync: the tensors' slots and the buffer's handle on each GPU."""

    index: int = Field(ge=0, description="Position of the bucket in its sync.")
    nbytes: int = Field(gt=0, description="Size of the buffer.")
    tensors: list[TensorSlot] = Field(min_length=1)
    buffers: dict[str, CudaIpcHandle] = Field(
        min_length=1, description="GPU UUID -> the buffer's copy on that GPU."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [slot.name for slot in self.tensors]
        if len(set(names)) != len(names):
            repeated = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"bucket {self.index}: tensors named more than once: {repeated}")
        end = 0
        for slot in self.tensors:
            if slot.offset % ALIGNMENT or slot.offset < end:
                raise ValueError(
                    f"bucket {self.index}: {slot.name!r} at byte {slot.offset} overlaps the "
                    f"previous tensor or is not aligned to {ALIGNMENT}"
                )
            end = slot.offset + slot.nbytes
        if end > self.nbytes:
            raise ValueError(f"bucket {self.index}: tensors end at {end} > {self.nbytes} bytes")
        for gpu, buffer in self.buffers.items():
            if buffer.nbytes != self.nbytes:
                raise ValueError(
                    f"bucket {self.index}: the buffer on GPU {gpu} has {buffer.nbytes} bytes, "
                    f"expected {self.nbytes}"
                )
        return self


class WorkerInfo(_Record):
    """What a vLLM worker tells the engine before the first sync."""

    rank: int = Field(ge=0)
    device_uuid: str = Field(min_length=1)
    parameters: list[str] = Field(description="The model's parameter names (vLLM's, fused).")
    packed_modules: dict[str, list[str]] = Field(
        default_factory=dict,
        description="The model's packed_modules_mapping (qkv_proj -> [q_proj, k_proj, v_proj]).",
    )
    tied: dict[str, str] = Field(
        default_factory=dict, description="Parameter name -> the name it is tied to."
    )
    quantization: str | None = None


class BucketReport(_Record):
    """What a vLLM worker loaded from one bucket."""

    rank: int = Field(ge=0)
    bucket: int = Field(ge=0)
    received: int = Field(ge=0, description="Tensors read from the bucket.")
    loaded: list[str] | None = Field(
        description="Parameters the model's load_weights reports it wrote; None when it "
        "reports nothing."
    )
    shards: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Fused parameter -> the indices of its parts (in packed_modules order) its "
        "weight loader wrote; all of them for a tensor that came fused.",
    )
    unknown_shards: list[str] = Field(
        default_factory=list,
        description="Fused parameters written by a loader call whose shard this worker cannot "
        "tell (or that bypassed the parameter's weight loader).",
    )


class Transport(Protocol):
    """How buffers are shared between the engine's process and its vLLM workers."""

    def device_uuid(self, device: torch.device) -> str:
        """The physical GPU behind ``device``."""
        ...

    def local_devices(self) -> dict[str, torch.device]:
        """The GPUs this process can use, by UUID."""
        ...

    def share(self, buffer: torch.Tensor) -> CudaIpcHandle:
        """A handle another process of this node can open ``buffer`` with."""
        ...

    def open(self, handle: CudaIpcHandle, device: torch.device) -> torch.Tensor:
        """The buffer behind ``handle``, on ``device`` (the same physical GPU)."""
        ...

    def synchronize(self, device: torch.device) -> None:
        """Wait for the work queued on ``device``."""
        ...

    def collect(self) -> None:
        """Free shared buffers whose consumers have let them go."""
        ...

    def empty_cache(self) -> None:
        """Hand this process's cached, unused GPU memory back to the driver (torch's caching
        allocator keeps freed blocks for reuse, out of reach of other processes)."""
        ...

    def free_bytes(self, device: torch.device) -> int:
        """Free memory of the GPU behind ``device``, as its driver reports it (all processes)."""
        ...


class CudaIpcTransport:
    """torch's CUDA IPC (``reduce_tensor`` / ``rebuild_cuda_tensor``): processes of one node."""

    def device_uuid(self, device: torch.device) -> str:
        return str(torch.cuda.get_device_properties(device).uuid)

    def local_devices(self) -> dict[str, torch.device]:
        devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        return {self.device_uuid(device): device for device in devices}

    def share(self, buffer: torch.Tensor) -> CudaIpcHandle:
        from torch.multiprocessing.reductions import reduce_tensor

        args: tuple[Any, ...] = reduce_tensor(buffer)[1]  # type: ignore[no-untyped-call]
        return CudaIpcHandle.from_reduce_args(args)

    def open(self, handle: CudaIpcHandle, device: torch.device) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        index = device.index if device.index is not None else torch.cuda.current_device()
        tensor: torch.Tensor = rebuild_cuda_tensor(*handle.rebuild_args(index))  # type: ignore[no-untyped-call]
        return tensor

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def collect(self) -> None:
        torch.cuda.ipc_collect()  # type: ignore[no-untyped-call,unused-ignore]

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def free_bytes(self, device: torch.device) -> int:
        return int(torch.cuda.mem_get_info(device)[0])
