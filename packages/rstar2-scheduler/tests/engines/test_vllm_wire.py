"""The weight-sync payload: CUDA-IPC arguments as plain records, checked against torch's
``rebuild_cuda_tensor`` and encoded with vLLM's own msgpack encoder (where the extra is
installed), without VLLM_ALLOW_INSECURE_SERIALIZATION.

No GPU here: the payload is built from CPU tensors standing in for CUDA ones, with the
arguments torch's ``reduce_tensor`` gives a CUDA tensor (its driver handles made up).
"""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
from pydantic import ValidationError
from vllm_standin import HostMemory, cuda_reduce_args

from rstar2_scheduler.engines.vllm_sync import stage_bucket
from rstar2_scheduler.engines.vllm_wire import (
    ALIGNMENT,
    BucketReport,
    CudaIpcHandle,
    TensorSlot,
    WeightBucket,
    WorkerInfo,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra")

WEIGHTS = [
    ("model.embed_tokens.weight", torch.randn(10, 6, dtype=torch.bfloat16)),
    ("model.layers.0.self_attn.q_proj.bias", torch.randn(5)),
    ("model.norm.weight", torch.randn(3, dtype=torch.float16)),
    ("model.scale", torch.tensor(2.5, dtype=torch.float64)),  # 0-d
    ("model.ids", torch.arange(7)),
    ("model.empty", torch.empty(0, 4)),
    ("model.strided", torch.randn(4, 6).t()),  # not contiguous
]


def staged(gpus: tuple[str, ...] = ("GPU-a", "GPU-b")) -> tuple[WeightBucket, list[torch.Tensor]]:
    memory = HostMemory(gpus)
    targets = memory.engine().local_devices()
    result = stage_bucket(3, list(WEIGHTS), targets, memory.engine())
    return result.payload, result.buffers


def test_handle_round_trips_torch_rebuild_arguments() -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    buffer = torch.zeros(4096, dtype=torch.uint8)
    args = cuda_reduce_args(buffer, handle=b"h" * 64)
    assert len(args) == len(inspect.signature(rebuild_cuda_tensor).parameters)
    handle = CudaIpcHandle.from_reduce_args(args)
    rebuilt = handle.rebuild_args(5)
    assert rebuilt[:6] == args[:6]
    assert rebuilt[7:] == args[7:]
    assert rebuilt[6] == 5  # opened on the receiver's own index of the GPU
    assert rebuilt[0] is torch.Tensor
    assert rebuilt[4] is torch.storage.TypedStorage
    assert rebuilt[5] is torch.uint8


def test_handle_refuses_what_is_not_a_flat_byte_buffer() -> None:
    with pytest.raises(ValueError, match="only flat, contiguous uint8"):
        CudaIpcHandle.from_reduce_args(cuda_reduce_args(torch.zeros(4, 4), handle=b"h"))
    with pytest.raises(ValueError, match="15 rebuild_cuda_tensor arguments"):
        CudaIpcHandle.from_reduce_args(("too", "short"))
    parameter = torch.nn.Parameter(torch.zeros(8, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ValueError, match="plain tensor"):
        CudaIpcHandle.from_reduce_args(cuda_reduce_args(parameter, handle=b"h"))


def test_staged_views_read_back_every_tensor_exactly() -> None:
    payload, buffers = staged()
    assert sorted(payload.buffers) == ["GPU-a", "GPU-b"]
    assert [slot.name for slot in payload.tensors] == [name for name, _ in WEIGHTS]
    assert all(slot.offset % ALIGNMENT == 0 for slot in payload.tensors)
    for buffer in buffers:
        for slot, (_, tensor) in zip(payload.tensors, WEIGHTS, strict=True):
            view = slot.view(buffer)
            assert view.dtype == tensor.dtype
            assert view.shape == tensor.shape
            assert torch.equal(view, tensor)


def test_bucket_validation_names_the_problem() -> None:
    payload, _ = staged()
    record = payload.model_dump()
    overlapping = {
        **record,
        "tensors": [record["tensors"][0], {**record["tensors"][1], "offset": 0}],
    }
    with pytest.raises(ValidationError, match="overlaps"):
        WeightBucket.model_validate(overlapping)
    repeated = {**record, "tensors": [record["tensors"][0], record["tensors"][0]]}
    with pytest.raises(ValidationError, match="named more than once"):
        WeightBucket.model_validate(repeated)
    with pytest.raises(ValidationError, match="not a torch dtype"):
        TensorSlot(name="x", dtype="float99", shape=[1], offset=0)
    short = {**record, "nbytes": 512}
    with pytest.raises(ValidationError, match=r"tensors end at \d+ > 512"):
        WeightBucket.model_validate(short)


@needs_vllm
def test_payload_encodes_with_vllms_own_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``AsyncLLM.collective_rpc`` sends to the engine core: its utility-call tuple."""
    import vllm.envs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    assert not vllm.envs.VLLM_ALLOW_INSECURE_SERIALIZATION
    payload, _ = staged()
    kwargs = {"bucket": payload.model_dump()}
    message = (0, 12345, "collective_rpc", ("rstar2_load_weights", 600.0, (), kwargs))
    frames = MsgpackEncoder().encode(message)
    client, call, method, (rpc, timeout, args, received) = MsgpackDecoder().decode(frames)
    assert (client, call, method, rpc, timeout, args) == (
        0,
        12345,
        "collective_rpc",
        "rstar2_load_weights",
        600.0,
        [],
    )
    assert WeightBucket.model_validate(received["bucket"]) == payload

    # and the workers' answers come back the same way
    info = WorkerInfo(rank=1, device_uuid="GPU-b", parameters=["a.weight"], tied={"b": "a"})
    report = BucketReport(
        rank=1,
        bucket=3,
        elements=7,
        loaded=["a.weight"],
        unknown_shards={"e": "shard id 'index_q'"},
    )
    answers = MsgpackDecoder().decode(
        MsgpackEncoder().encode([info.model_dump(), report.model_dump()])
    )
    assert WorkerInfo.model_validate(answers[0]) == info
    assert BucketReport.model_validate(answers[1]) == report


@needs_vllm
def test_torch_ipc_arguments_do_not_pass_vllms_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the arguments are rewritten: ``reduce_tensor``'s own tuple, as vLLM's IPC weight
    transfer sends it (one dict per tensor, GPU UUID -> arguments), is refused."""
    from vllm.v1.serial_utils import MsgpackEncoder

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    args = cuda_reduce_args(torch.zeros(16, dtype=torch.bfloat16), handle=b"h" * 64)
    update_info = {
        "names": ["w"],
        "dtype_names": ["bfloat16"],
        "shapes": [[16]],
        "ipc_handles": [{"GPU-a": args}],
    }
    with pytest.raises(TypeError, match="is not serializable"):
        MsgpackEncoder().encode((0, 1, "collective_rpc", ("update_weights", None, (), update_info)))
