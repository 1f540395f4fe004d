"""What crosses vLLM's ``collective_rpc`` during a weight sync.

``AsyncLLM.collective_rpc`` sends its arguments to the engine-core process with vLLM's own
msgpack encoder (``vllm.v1.serial_utils.MsgpackEncoder``). Without
``VLLM_ALLOW_INSECURE_SERIALIZATION`` it accepts plain data only (str, int, float, bool, bytes,
lists, dicts) and raises ``TypeError`` for anything else. torch's CUDA-IPC arguments
(``torch.multiprocessing.reductions.reduce_tensor``) hold a tensor class, a storage class and a
``torch.dtype``, so they cannot cross as they are: here they travel as a ``CudaIpcHandle`` of
strings, integers and bytes, and the worker turns it back into ``rebuild_cuda_tensor``'s
arguments. Workers on CPUs (vLLM's CPU backend) open a file in the node's shared memory
instead (``SharedMemoryHandle``). Everything in this module is plain pydantic over plain data,
so what the engine sends is validated again where the worker receives it.

A sync moves weights in buckets. For each bucket the engine packs the tensors into one flat
``uint8`` buffer per device that a vLLM worker runs on (a worker can only open memory of its own
GPU), and sends one handle per device, keyed by the device's id (a GPU's UUID; for CPU workers
the node's shared memory), with each tensor's name, dtype, shape and byte offset in the buffer.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

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

    kind: Literal["cuda_ipc"] = "cuda_ipc"
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


class SharedMemoryHandle(_Record):
    """One flat byte buffer in a file of the node's shared memory (a tmpfs such as
    ``/dev/shm``), which a process of the same node maps as it is: no copy is made. The sharing
    process removes the file once every worker has loaded the bucket."""

    kind: Literal["shared_memory"] = "shared_memory"
    path: str = Field(min_length=1, description="The file holding the buffer.")
    nbytes: int = Field(gt=0, description="Length of the buffer in bytes.")


BufferHandle = Annotated[CudaIpcHandle | SharedMemoryHandle, Field(discriminator="kind")]
"""How a worker opens one copy of a bucket's buffer."""


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
    buffers: dict[str, BufferHandle] = Field(
        min_length=1, description="Device id -> the buffer's copy on that device."
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
                    f"bucket {self.index}: the buffer on {gpu} has {buffer.nbytes} bytes, "
                    f"expected {self.nbytes}"
                )
        return self


class WorkerInfo(_Record):
    """What a vLLM worker tells the engine before the first sync."""

    rank: int = Field(ge=0)
    device_uuid: str = Field(
        min_length=1,
        description="The device's id: a GPU's UUID, or for a CPU worker its node's shared "
        "memory (SharedMemoryTransport.node_id).",
    )
    device_type: Literal["cuda", "cpu"] = Field(
        default="cuda", description="Which transport reaches the worker."
    )
    dtype: str | None = Field(
        default=None, description="The model's weight dtype (vLLM's model_config.dtype)."
    )
    parameters: list[str] = Field(description="The model's parameter names (vLLM's, fused).")
    packed_modules: dict[str, list[str]] = Field(
        default_factory=dict,
        description="The model's packed_modules_mapping (qkv_proj -> [q_proj, k_proj, v_proj]).",
    )
    parts: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Parameter loaded in parts -> its parts, in the order BucketReport.shards "
        "indexes them: a fused layer's (q_proj, k_proj, v_proj), or an MoE layer's experts "
        "and their w1/w3 (w13_weight) or w2 (w2_weight) on this rank.",
    )
    tied: dict[str, str] = Field(
        default_factory=dict, description="Parameter name -> the name it is tied to."
    )
    quantization: str | None = None
    packed: bool = Field(
        default=False,
        description="vLLM's CPU backend packed linear weights and emptied them (vllm_cpu): the "
        "first sync must bring every weight.",
    )


class BucketReport(_Record):
    """What a vLLM worker loaded from one bucket."""

    rank: int = Field(ge=0)
    bucket: int = Field(ge=0)
    elements: int = Field(
        ge=0,
        description="Elements of the bucket's tensors that reached a parameter's weight loader "
        "(counted per loader call as the model's load_weights makes it; less than the bucket "
        "where the model drops a tensor, or holds part of the layers: a pipeline stage).",
    )
    skipped: list[str] = Field(
        default_factory=list,
        description="Tied aliases not loaded because the weight they are tied to came in the "
        "same bucket.",
    )
    unread: list[str] = Field(
        default_factory=list,
        description="When elements fall short: the bucket's tensors no weight loader was seen "
        "reading (by buffer address; a loader handed a converted copy is not seen).",
    )
    loaded: list[str] | None = Field(
        description="Parameters the model's load_weights reports it wrote; None when it "
        "reports nothing."
    )
    shards: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Parameter loaded in parts -> the indices of the parts (WorkerInfo.parts) "
        "its weight loader wrote; all of them for a tensor that came whole.",
    )
    unknown_shards: dict[str, str] = Field(
        default_factory=dict,
        description="Parameter loaded in parts -> a shard id its weight loader was called with "
        "that names no part this worker can tell (e.g. a shard id this version of rstar2 does "
        "not know).",
    )
