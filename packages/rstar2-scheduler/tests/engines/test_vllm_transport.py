"""How weight buckets reach vLLM's workers on one node: shared memory for CPU workers (mapped by
another process, removed with its buffer, a sync through it end to end), the transport for each
device type, and workers that die with the process that started them."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm_standin import StandInAsyncLLM, expected_shards

from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig
from rstar2_scheduler.engines.vllm_transport import (
    CudaIpcTransport,
    SharedMemoryTransport,
    transport_for,
)
from rstar2_scheduler.engines.vllm_wire import CudaIpcHandle, SharedMemoryHandle

CPU = torch.device("cpu")


def test_a_shared_memory_buffer_is_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path)
    buffer = transport.allocate(4096, CPU)
    buffer[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    handle = transport.share(buffer)
    assert isinstance(handle, SharedMemoryHandle)
    assert handle.nbytes == 4096
    assert (os.stat(handle.path).st_mode & 0o777) == 0o600
    script = textwrap.dedent(
        f"""
        import torch
        from rstar2_scheduler.engines.vllm_transport import SharedMemoryTransport
        from rstar2_scheduler.engines.vllm_wire import SharedMemoryHandle
        handle = SharedMemoryHandle.model_validate_json({handle.model_dump_json()!r})
        buffer = SharedMemoryTransport().open(handle, torch.device("cpu"))
        assert buffer[:4].tolist() == [1, 2, 3, 4], buffer[:4]
        buffer[4:8] = 9
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert buffer[4:8].tolist() == [9, 9, 9, 9]  # the worker wrote into this very buffer
    path = handle.path
    del buffer
    gc.collect()
    assert not Path(path).exists()  # removed with the engine's buffer


def test_shared_memory_refuses_what_it_cannot_reach(tmp_path: Path) -> None:
    transport = SharedMemoryTransport(tmp_path)
    with pytest.raises(ValueError, match="CPU workers only"):
        transport.device_uuid(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="only buffers this transport allocated"):
        transport.share(torch.zeros(8, dtype=torch.uint8))
    foreign = CudaIpcHandle(
        nbytes=8,
        device=0,
        handle=b"h",
        storage_size_bytes=8,
        storage_offset_bytes=0,
        ref_counter_handle=b"r",
        ref_counter_offset=0,
        event_handle=b"e",
        event_sync_required=True,
    )
    with pytest.raises(ValueError, match="cannot open a cuda_ipc buffer"):
        transport.open(foreign, CPU)
    gone = SharedMemoryHandle(path=str(tmp_path / "gone"), nbytes=8)
    with pytest.raises(RuntimeError, match="must share one /dev/shm"):
        transport.open(gone, CPU)
    assert not (tmp_path / "gone").exists()  # not created: a worker would have loaded zeros
    (tmp_path / "short").write_bytes(b"1234")
    short = SharedMemoryHandle(path=str(tmp_path / "short"), nbytes=8)
    with pytest.raises(RuntimeError, match="holds 4 bytes, expected 8"):
        transport.open(short, CPU)


def test_each_device_type_gets_its_transport() -> None:
    assert isinstance(transport_for("cuda"), CudaIpcTransport)
    assert isinstance(transport_for("cpu"), SharedMemoryTransport)
    with pytest.raises(
        ValueError, match="no weight-sync transport reaches a vLLM worker on a 'xpu'"
    ):
        transport_for("xpu")


def weight_files() -> set[Path]:
    return set(Path("/dev/shm").glob("rstar2-weights-*"))


@pytest.mark.asyncio
async def test_a_sync_reaches_cpu_workers_through_shared_memory() -> None:
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    llm = StandInAsyncLLM(config, tp=2)
    for worker in llm.workers:
        worker.rstar2_transport = None  # each picks the transport for its device: a CPU
    engine = VLLMEngine(VLLMEngineConfig(model="stand-in", weight_bucket_mb=0.004), llm=llm)
    before = weight_files()
    torch.manual_seed(0)
    full = {n: t.detach().clone() for n, t in Qwen2ForCausalLM(config).state_dict().items()}
    await engine.update_weights(full.items())
    assert engine.last_sync is not None
    assert engine.last_sync.buckets > 1
    assert engine.last_sync.gpus == 1  # one copy of each bucket: the node's shared memory
    for rank, model in enumerate(llm.models()):
        for name, value in expected_shards(full, rank, 2).items():
            assert torch.equal(model.params()[name], value), name
    gc.collect()
    assert weight_files() == before  # nothing left behind


def test_a_worker_dies_with_the_process_that_started_it() -> None:
    parent = textwrap.dedent(
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", (
            "import time\\n"
            "from rstar2_scheduler.engines.vllm_worker import die_with_parent\\n"
            "die_with_parent()\\n"
            "print('bound', flush=True)\\n"
            "time.sleep(120)\\n"
        )], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "bound\\n"
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        child = int(process.stdout.readline())
        assert _alive(child)
        process.send_signal(signal.SIGKILL)  # no clean-up of any kind runs
        process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        process.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has died)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
