"""How a weight bucket's buffers are shared between a process and vLLM's workers on its node.

- ``CudaIpcTransport``: a buffer on each worker's GPU, shared by torch's CUDA IPC
  (``reduce_tensor`` / ``rebuild_cuda_tensor``), for workers on GPUs. Any process of the node
  that can see the GPU can share one: the engine's own process, or a trainer rank on the same GPU.
- ``SharedMemoryTransport``: a buffer in a file of the node's shared memory (``/dev/shm``),
  mapped by both sides without a copy, for workers on CPUs (vLLM's CPU backend), which have no
  CUDA IPC. Its device id names the node's shared memory, so a worker on another node (or in a
  container with its own ``/dev/shm``) is told apart and refused rather than sent a path it
  cannot open.

``transport_for(device_type)`` picks the one for a worker's device.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any, Protocol

import torch

from rstar2_scheduler.engines.vllm_wire import BufferHandle, CudaIpcHandle, SharedMemoryHandle


class Transport(Protocol):
    """How buffers are shared between a process and the vLLM workers of its node."""

    def device_uuid(self, device: torch.device) -> str:
        """The device id behind ``device`` (a GPU's UUID; a CPU's node shared memory)."""
        ...

    def local_devices(self) -> dict[str, torch.device]:
        """The devices this process can stage buffers on, by id."""
        ...

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A flat ``uint8`` buffer of ``nbytes`` on ``device`` that ``share`` accepts."""
        ...

    def share(self, buffer: torch.Tensor) -> BufferHandle:
        """A handle another process of this node can open ``buffer`` with."""
        ...

    def open(self, handle: BufferHandle, device: torch.device) -> torch.Tensor:
        """The buffer behind ``handle``, on ``device`` (the same physical device)."""
        ...

    def synchronize(self, device: torch.device) -> None:
        """Wait for the work queued on ``device``."""
        ...

    def collect(self) -> None:
        """Free shared buffers whose consumers have let them go."""
        ...

    def empty_cache(self) -> None:
        """Hand this process's cached, unused device memory back (torch's caching allocator
        keeps freed blocks for reuse, out of reach of other processes)."""
        ...

    def free_bytes(self, device: torch.device) -> int:
        """Free memory of the device behind ``device``, as its driver (or the kernel) reports
        it, for every process."""
        ...


class CudaIpcTransport:
    """torch's CUDA IPC (``reduce_tensor`` / ``rebuild_cuda_tensor``): processes of one node."""

    def device_uuid(self, device: torch.device) -> str:
        return str(torch.cuda.get_device_properties(device).uuid)

    def local_devices(self) -> dict[str, torch.device]:
        devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        return {self.device_uuid(device): device for device in devices}

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def share(self, buffer: torch.Tensor) -> BufferHandle:
        from torch.multiprocessing.reductions import reduce_tensor

        args: tuple[Any, ...] = reduce_tensor(buffer)[1]  # type: ignore[no-untyped-call]
        return CudaIpcHandle.from_reduce_args(args)

    def open(self, handle: BufferHandle, device: torch.device) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        if not isinstance(handle, CudaIpcHandle):
            raise ValueError(f"a worker on {device} cannot open a {handle.kind} buffer")
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


SHARED_MEMORY = Path("/dev/shm")
"""Where ``SharedMemoryTransport`` keeps its buffers by default: Linux's shared-memory tmpfs."""


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SharedMemoryTransport:
    """Buffers in files of the node's shared memory, for vLLM workers on CPUs.

    ``allocate`` makes a file (mode 0600) of the buffer's size and maps it; ``open`` maps the
    same file in the worker, so the worker reads the very bytes the engine wrote. The file is
    removed when the engine's buffer is freed (after every worker has loaded the bucket) or, at
    the latest, when the engine's process exits; the memory goes once no process maps it.
    """

    def __init__(self, directory: Path = SHARED_MEMORY) -> None:
        self.directory = directory
        self._paths: dict[int, str] = {}  # buffer address -> its file

    def node_id(self) -> str:
        """This node's shared memory: its kernel's boot id and the filesystem holding the
        buffers (a container with its own ``/dev/shm`` has another)."""
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"shm:{boot}:{os.stat(self.directory).st_dev}"

    def device_uuid(self, device: torch.device) -> str:
        if device.type != "cpu":
            raise ValueError(f"shared memory reaches CPU workers only, not {device}")
        return self.node_id()

    def local_devices(self) -> dict[str, torch.device]:
        return {self.node_id(): torch.device("cpu")}

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            raise ValueError(f"shared memory holds CPU buffers only, not {device}")
        descriptor, path = tempfile.mkstemp(prefix="rstar2-weights-", dir=self.directory)
        try:
            os.ftruncate(descriptor, nbytes)
        finally:
            os.close(descriptor)
        buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        address = buffer.data_ptr()
        self._paths[address] = path
        weakref.finalize(buffer, self._release, address, path)
        return buffer

    def _release(self, address: int, path: str) -> None:
        self._paths.pop(address, None)
        _remove(path)

    def share(self, buffer: torch.Tensor) -> BufferHandle:
        path = self._paths.get(buffer.data_ptr())
        if path is None:
            raise ValueError("only buffers this transport allocated can be shared")
        return SharedMemoryHandle(path=path, nbytes=buffer.numel())

    def open(self, handle: BufferHandle, device: torch.device) -> torch.Tensor:
        if not isinstance(handle, SharedMemoryHandle):
            raise ValueError(f"a worker on {device} cannot open a {handle.kind} buffer")
        # torch.from_file would create a missing file: a worker would load zeros
        try:
            size = os.stat(handle.path).st_size
        except OSError as missing:
            raise RuntimeError(
                f"cannot open the weight buffer {handle.path} ({missing.strerror}); the engine's "
                "process and its CPU workers must share one /dev/shm"
            ) from missing
        if size != handle.nbytes:
            raise RuntimeError(
                f"the weight buffer {handle.path} holds {size} bytes, expected {handle.nbytes}"
            )
        return torch.from_file(handle.path, shared=True, size=handle.nbytes, dtype=torch.uint8)

    def synchronize(self, device: torch.device) -> None:
        pass  # CPU copies are done when they return

    def collect(self) -> None:
        pass  # files go with their buffers (see allocate)

    def empty_cache(self) -> None:
        pass  # no caching allocator holds CPU memory back

    def free_bytes(self, device: torch.device) -> int:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("/proc/meminfo has no MemAvailable line")


def transport_for(device_type: str) -> Transport:
    """The transport that reaches a vLLM worker on a ``device_type`` device."""
    if device_type == "cuda":
        return CudaIpcTransport()
    if device_type == "cpu":
        return SharedMemoryTransport()
    raise ValueError(f"no weight-sync transport reaches a vLLM worker on a {device_type!r} device")
