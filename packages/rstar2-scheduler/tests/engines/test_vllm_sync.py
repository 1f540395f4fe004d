"""VLLMEngine's weight sync, sleep and wake against a stand-in for vLLM's AsyncLLM.

The stand-in (tests/helpers/vllm_standin.py) applies vLLM's rules as read in its source: the
RPC arguments cross vLLM's msgpack encoder (the real one where the extra is installed), each
tensor-parallel rank keeps its shard of fused, sharded layers through ``load_weights``, a tied
alias must come with the weight it is tied to, sleeping memory cannot be written, wake-up
answers whether everything is back, and waking into too little GPU memory fails. The real worker
extension runs in each stand-in worker; only CUDA IPC is replaced, by host memory. Every test
runs on the stand-in's own model and, where vLLM is installed, on one built from vLLM's own
layers that loads through vLLM's own ``AutoWeightsLoader``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm_standin import HostMemory, ModelKind, StandInAsyncLLM, expected_shards

from rstar2_scheduler.engine import GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig
from rstar2_scheduler.engines.vllm_sync import fused_members, fusion_key, plan_buckets
from rstar2_scheduler.engines.vllm_wire import WeightBucket

pytestmark = pytest.mark.asyncio

CONFIG = Qwen2Config(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
BUCKET_MB = 0.05  # about 52 KB: the 0.2 MB model goes in several buckets
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="generate builds vLLM's sampling parameters")


@pytest.fixture(
    params=[
        "stand-in",
        pytest.param("vllm", marks=pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM")),
    ]
)
def kind(request: pytest.FixtureRequest) -> ModelKind:
    """Whose model the stand-in workers hold: its own, or one of vLLM's own layers."""
    kind: ModelKind = request.param
    return kind


def trainer_weights(seed: int) -> dict[str, torch.Tensor]:
    """A trainer's full state dict (HF names; lm_head.weight listed beside the tied embedding)."""
    torch.manual_seed(seed)
    return {name: t.detach().clone() for name, t in Qwen2ForCausalLM(CONFIG).state_dict().items()}


def engine_on(llm: StandInAsyncLLM, **config: object) -> VLLMEngine:
    settings = {"model": "stand-in", "weight_bucket_mb": BUCKET_MB, **config}
    return VLLMEngine(
        VLLMEngineConfig.model_validate(settings), llm=llm, transport=llm.memory.engine()
    )


def assert_ranks_hold(llm: StandInAsyncLLM, full: dict[str, torch.Tensor]) -> None:
    for rank, model in enumerate(llm.models()):
        expected = expected_shards(full, rank, len(llm.workers))
        params = model.params()
        assert sorted(params) == sorted(expected)
        for name, value in expected.items():
            torch.testing.assert_close(params[name], value, rtol=0, atol=0, msg=name)


def request(request_id: str = "r") -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt_ids=(1, 2), sampling=SamplingParams(max_new_tokens=2)
    )


async def test_one_sync_loads_every_rank_shard_in_one_cycle(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items(), version="7")

    assert_ranks_hold(llm, full)
    methods = llm.methods()
    loads = methods.count("rstar2_load_weights")
    assert loads > 2
    assert methods == [
        "rstar2_worker_info",
        "pause_generation",
        *["rstar2_load_weights"] * loads,
        "rstar2_release_memory",
        "reset_prefix_cache",
        "update_weight_version",
        "resume_generation",
    ]
    assert ("pause_generation", "keep", False) in llm.calls
    assert ("reset_prefix_cache", True) in llm.calls
    assert llm.version == engine.weights_version == "7"

    buckets = [WeightBucket.model_validate(payload) for payload in llm.payloads]
    sent = [slot.name for bucket in buckets for slot in bucket.tensors]
    assert sent == list(full)  # every tensor exactly once, in order
    members = fused_members(llm.models()[0].packed_modules_mapping)
    home: dict[str, int] = {}
    for bucket in buckets:
        for slot in bucket.tensors:
            key = fusion_key(slot.name, members)
            assert home.setdefault(key, bucket.index) == bucket.index, f"{key} split"
    assert any(key.endswith("qkv_proj") for key in home)
    # the rule mattered: cut by size alone, some fused layer would straddle two buckets
    limit = round(BUCKET_MB * 2**20)
    naive = list(plan_buckets(full.items(), limit_bytes=limit, members={}))
    straddling = {
        fusion_key(name, members)
        for before, after in itertools.pairwise(naive)
        for name in (before[-1][0], after[0][0])
    }
    assert len(straddling) < 2 * (len(naive) - 1)

    # one buffer per worker GPU per bucket, each opened by the worker on that GPU only
    assert all(sorted(bucket.buffers) == ["GPU-0", "GPU-1"] for bucket in buckets)
    opened = {uuid: {key for who, key in llm.memory.opened if who == uuid} for uuid in llm.uuids}
    for bucket in buckets:
        for uuid, handle in bucket.buffers.items():
            assert handle.handle in opened[uuid]
            assert all(handle.handle not in opened[other] for other in llm.uuids if other != uuid)
    assert len(llm.memory.shared) == 2 * len(buckets)
    assert llm.memory.alive() == 0  # released once every worker had loaded them
    assert engine.last_sync is not None
    assert (engine.last_sync.buckets, engine.last_sync.ranks, engine.last_sync.gpus) == (
        len(buckets),
        2,
        2,
    )
    assert engine.last_sync.tensors == len(full)


async def test_partial_updates_keep_the_rest_and_fused_parts_load_apart(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    first, second = trainer_weights(1), trainer_weights(2)
    await engine.update_weights(first.items())
    q = "model.layers.1.self_attn.q_proj.weight"
    kv = ["model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"]
    await engine.update_weights([(q, second[q])])  # one part of a fused layer, alone
    await engine.update_weights([(name, second[name]) for name in kv])
    mixed = {**first, q: second[q], **{name: second[name] for name in kv}}
    assert_ranks_hold(llm, mixed)


async def test_a_tied_alias_alone_loads_into_the_weight_it_is_tied_to(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items())
    head = trainer_weights(3)["lm_head.weight"]
    alone = [("lm_head.weight", head)]
    with pytest.raises(ValueError, match="tied weight is uninitialized"):
        llm.models()[0].load_weights(alone)  # vLLM's rule, which the stand-in applies
    await engine.update_weights(alone)
    assert_ranks_hold(llm, {**full, "model.embed_tokens.weight": head, "lm_head.weight": head})


async def test_colocated_cycle_sleeps_level_2_wakes_weights_then_kv_cache(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    await engine.update_weights(trainer_weights(1).items(), version="1")
    llm.calls.clear()

    await engine.sleep(2)
    assert engine.asleep == {"weights", "kv_cache"}
    full = trainer_weights(2)
    await engine.update_weights(full.items(), version="2")
    assert engine.asleep == {"kv_cache"}
    await engine.wake_up()
    assert engine.asleep == frozenset()

    loads = llm.methods().count("rstar2_load_weights")
    assert llm.calls == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        *[("collective_rpc", "rstar2_load_weights")] * loads,
        ("collective_rpc", "rstar2_release_memory"),
        ("reset_prefix_cache", True),
        ("update_weight_version", "2"),
        ("wake_up", ["kv_cache"]),
    ]
    assert not llm.paused
    assert not llm.sleeping
    assert_ranks_hold(llm, full)  # nothing left of the discarded (NaN) memory


async def test_discarded_weights_refuse_generation_until_a_whole_sync(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items())
    await engine.sleep(2)
    result = await engine.generate(request())
    assert result.finish_reason == "error"
    assert result.error is not None
    assert "asleep" in result.error

    await engine.wake_up()  # woken before the sync: the weights are garbage
    assert math.isnan(float(llm.models()[0].model.norm.weight[0]))
    result = await engine.generate(request())
    assert result.error is not None
    assert "discarded the weights" in result.error

    partial = [(n, t) for n, t in full.items() if not n.startswith("model.layers.1.")]
    with pytest.raises(RuntimeError, match=r"without weights: model\.layers\.1\."):
        await engine.update_weights(partial)
    result = await engine.generate(request())
    assert result.error is not None
    assert "discarded the weights" in result.error

    await engine.update_weights(full.items())
    assert engine._refusal() is None
    assert_ranks_hold(llm, full)


async def held(
    engine: VLLMEngine, llm: StandInAsyncLLM, request_id: str
) -> asyncio.Task[GenerationResult]:
    """A request vLLM holds (it has started and not finished)."""
    running = asyncio.create_task(engine.generate(request(request_id)))
    await llm.held.wait()
    return running


async def assert_broken_until_a_whole_sync(
    engine: VLLMEngine, llm: StandInAsyncLLM, full: dict[str, torch.Tensor], first: int
) -> None:
    """The engine refuses to generate, takes no partial sync, and is mended by a whole one."""
    assert engine.weights_version is None  # neither the old weights nor the new
    result = await engine.generate(request("refused"))
    assert result.finish_reason == "error"
    assert result.error is not None
    assert f"a weight sync failed in bucket {first}" in result.error
    layer = [(n, t) for n, t in full.items() if n.startswith("model.layers.1.")]
    with pytest.raises(RuntimeError, match=r"without weights: model\.(embed_tokens|layers\.0)"):
        await engine.update_weights(layer, version="partial")
    assert (await engine.generate(request("still"))).finish_reason == "error"
    await engine.update_weights(full.items(), version="whole")
    assert_ranks_hold(llm, full)
    assert (await generated(engine, llm, "mended")).weights_version == "whole"


@needs_vllm
async def test_a_failure_in_the_first_bucket_aborts_held_requests_and_refuses_generation(
    kind: ModelKind,
) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm, weight_bucket_mb=4)  # the whole model in one bucket
    old, new = trainer_weights(1), trainer_weights(2)
    await engine.update_weights(old.items(), version="1")
    running = await held(engine, llm, "paused")
    embedding = "model.embed_tokens.weight"
    unknown = ("model.layers.9.mlp.down_proj.weight", torch.zeros(64, 128))
    rest = [(n, t) for n, t in old.items() if n != embedding]
    broken = [(embedding, new[embedding]), unknown, *rest]
    with pytest.raises(ValueError, match=r"no module or parameter named '(model\.)?layers\.9"):
        await engine.update_weights(broken, version="2")
    assert len(llm.payloads) == 2  # one bucket each
    # rank 0 had loaded the new embedding (the stand-in's rank 1 never ran): weights are mixed
    torch.testing.assert_close(
        llm.models()[0].params()[embedding], expected_shards(new, 0, 2)[embedding], rtol=0, atol=0
    )
    result = await asyncio.wait_for(running, timeout=30)  # aborted, not left running
    assert result.finish_reason == "error"
    assert result.error is not None
    assert "while the request ran; it was aborted" in result.error
    assert llm.calls[-2:] == [("abort", ["paused"]), ("resume_generation",)]
    await assert_broken_until_a_whole_sync(engine, llm, new, first=0)


@needs_vllm
async def test_a_failure_in_a_later_bucket_aborts_held_requests_and_refuses_generation(
    kind: ModelKind,
) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    old, new = trainer_weights(1), trainer_weights(2)
    await engine.update_weights(old.items(), version="1")
    running = await held(engine, llm, "paused")
    llm.payloads.clear()
    shape = torch.zeros(64, 64)  # down_proj is 64 x 128
    broken = [
        *((n, shape if n == "model.layers.1.mlp.down_proj.weight" else t) for n, t in new.items())
    ]
    with pytest.raises(Exception, match=r"shape|size"):
        await engine.update_weights(broken, version="2")
    failed = len(llm.payloads) - 1
    assert failed > 1
    result = await asyncio.wait_for(running, timeout=30)  # aborted, not left running
    assert result.error is not None
    assert "while the request ran; it was aborted" in result.error
    assert ("abort", ["paused"]) in llm.calls
    await assert_broken_until_a_whole_sync(engine, llm, new, first=failed)


@needs_vllm
async def test_a_failure_before_anything_is_sent_leaves_the_weights_whole(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items(), version="1")
    running = await held(engine, llm, "kept")
    sent = len(llm.payloads)
    with pytest.raises(TypeError, match=r"not a torch\.Tensor"):
        await engine.update_weights([("model.norm.weight", [1.0])], version="2")  # type: ignore[list-item]
    assert len(llm.payloads) == sent
    llm.release()
    assert (await running).finish_reason == "stop"  # resumed, not aborted
    assert (await generated(engine, llm, "after")).weights_version == "1"
    assert_ranks_hold(llm, full)


async def test_a_tensor_no_loader_reads_fails_the_sync(
    kind: ModelKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    dropped = "model.layers.0.mlp.down_proj.weight"
    for model in llm.models():
        load = model.load_weights
        monkeypatch.setattr(
            model, "load_weights", lambda ws, load=load: load((n, t) for n, t in ws if n != dropped)
        )
    with pytest.raises(RuntimeError, match=rf"handed 1 tensor\(s\) of bucket \d+ .*: {dropped}$"):
        await engine.update_weights(full.items())
    assert "a weight sync failed" in str(engine._refusal())


async def test_a_tensor_read_by_one_rank_only_passes(
    kind: ModelKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a pipeline stage reads only its own layers: every tensor reached some rank."""
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    for rank, model in enumerate(llm.models()):
        load = model.load_weights
        other = f"model.layers.{1 - rank}."
        monkeypatch.setattr(
            model,
            "load_weights",
            lambda ws, load=load, other=other: load(
                (n, t) for n, t in ws if not n.startswith(other)
            ),
        )
    await engine.update_weights(trainer_weights(1).items())
    assert engine._refusal() is None


async def test_weights_travel_in_the_engines_dtype(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind, dtype=torch.bfloat16)
    engine = engine_on(llm)
    full = trainer_weights(1)  # float32, as a trainer's master weights
    await engine.update_weights(full.items())
    slots = [slot for p in llm.payloads for slot in WeightBucket.model_validate(p).tensors]
    assert {slot.dtype for slot in slots} == {"bfloat16"}
    assert engine.last_sync is not None
    assert engine.last_sync.source_bytes == sum(t.numel() * 4 for t in full.values())
    assert engine.last_sync.bytes * 2 == engine.last_sync.source_bytes
    assert_ranks_hold(llm, {name: t.to(torch.bfloat16) for name, t in full.items()})
    staged = sum(WeightBucket.model_validate(p).nbytes for p in llm.payloads)
    assert staged < 0.6 * engine.last_sync.source_bytes  # the buffers hold bf16 only


async def test_wake_up_checks_what_vllm_answers(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    await engine.sleep(1)
    await llm.wake_up(["weights"])  # behind the engine's back
    with pytest.raises(RuntimeError, match="fully_awake=False"):
        await engine.wake_up()  # vLLM wakes nothing when a tag is not asleep


async def test_sleep_refusals(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    with pytest.raises(ValueError, match="level must be 1 or 2"):
        await engine.sleep(3)
    await engine.sleep(1)
    with pytest.raises(RuntimeError, match="already asleep"):
        await engine.sleep(1)
    await engine.wake_up()
    assert llm.calls[-1] == ("wake_up", ["kv_cache", "weights"])


async def test_level_1_sleep_keeps_weights_and_sync_writes_after_waking_them(
    kind: ModelKind,
) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items())
    await engine.sleep(1)
    await engine.wake_up()
    assert_ranks_hold(llm, full)
    await engine.sleep(1)
    q = "model.layers.0.self_attn.q_proj.weight"
    fresh = trainer_weights(4)[q]
    await engine.update_weights([(q, fresh)])  # a partial update is fine: nothing was lost
    await engine.wake_up()
    assert_ranks_hold(llm, {**full, q: fresh})


async def test_reset_prefix_cache_preempts_running_requests(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    llm.requests["busy"] = __import__("vllm_standin").Request("busy")
    assert not await llm.reset_prefix_cache()  # vLLM's rule: blocks in use
    await engine.reset_prefix_cache()
    assert llm.calls[-1] == ("reset_prefix_cache", True)
    assert llm.preempted == 1


async def test_a_worker_gpu_this_process_cannot_see_is_named(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind, memory=HostMemory(["GPU-0"]))
    engine = engine_on(llm)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] run on device\(s\) \['GPU-1'\]"):
        await engine.update_weights(trainer_weights(1).items())


async def test_a_quantized_model_is_refused(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind, quantization="fp8")
    engine = engine_on(llm)
    with pytest.raises(Exception, match="fp8-quantized"):
        await engine.update_weights(trainer_weights(1).items())


async def test_workers_without_the_extension_are_named(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind, extension=object)
    engine = engine_on(llm)
    with pytest.raises(RuntimeError, match="worker_extension_cls="):
        await engine.update_weights(trainer_weights(1).items())


async def test_a_name_twice_in_one_sync_is_refused(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    name = "model.norm.weight"
    with pytest.raises(ValueError, match="appears more than once"):
        await engine.update_weights([*full.items(), (name, full[name])])


async def test_after_sleep_2_every_part_of_every_fused_parameter_must_come(kind: ModelKind) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.update_weights(full.items())
    await engine.sleep(2)
    left_out = [
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.v_proj.bias",
        "model.layers.0.mlp.up_proj.weight",
    ]
    partial = [(name, tensor) for name, tensor in full.items() if name not in left_out]
    with pytest.raises(RuntimeError) as refused:
        await engine.update_weights(partial)
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "sleep(level=2) discarded the weights, and this sync left 3 parameter(s) or part(s) "
        in (message)
    )
    for part in (
        "model.layers.0.mlp.gate_up_proj.weight[up_proj]",
        "model.layers.1.self_attn.qkv_proj.bias[v_proj]",
        "model.layers.1.self_attn.qkv_proj.weight[v_proj]",
    ):
        assert part in message
    await engine.wake_up()
    result = await engine.generate(request())
    assert result.error is not None
    assert "discarded the weights" in result.error

    # The parts of one fused layer may come in different buckets of one sync.
    attention = "model.layers.1.self_attn."
    first = [f"{attention}q_proj.weight", f"{attention}q_proj.bias"]
    last = [f"{attention}{p}_proj.{t}" for p in ("k", "v") for t in ("weight", "bias")]
    split = [
        *((name, full[name]) for name in first),
        *((name, t) for name, t in full.items() if name not in first + last),
        *((name, full[name]) for name in last),
    ]
    llm.payloads.clear()
    await engine.update_weights(split)
    homes = {
        slot.name: WeightBucket.model_validate(payload).index
        for payload in llm.payloads
        for slot in WeightBucket.model_validate(payload).tensors
    }
    assert homes[first[0]] < homes[last[0]]
    assert engine._refusal() is None
    assert_ranks_hold(llm, full)


async def test_staging_memory_goes_back_to_the_driver_before_the_kv_cache_wakes(
    kind: ModelKind,
) -> None:
    kv = 2**18
    margin = 2**14  # less than the largest bucket staged on each GPU (the 64 KiB embedding)
    weights = StandInAsyncLLM(CONFIG, tp=2, model=kind).weight_bytes(0)
    memory = HostMemory(["GPU-0", "GPU-1"], capacity=weights + kv + margin)
    llm = StandInAsyncLLM(CONFIG, tp=2, model=kind, memory=memory, kv_bytes=kv)
    engine = engine_on(llm)
    full = trainer_weights(1)
    await engine.sleep(2)
    await engine.update_weights(full.items(), version="1")
    await engine.wake_up()  # the KV cache fits only if the staged buckets went back
    assert not llm.sleeping

    assert engine.last_sync is not None
    phases = {phase.name: phase for phase in engine.last_sync.phases}
    assert list(phases) == ["start", "woken", "loaded", "released"]
    for gpu in ("GPU-0", "GPU-1"):
        free = {name: phase.free_bytes[gpu] for name, phase in phases.items()}
        assert free["start"] - free["woken"] == weights  # the weights woke
        assert free["released"] - free["loaded"] >= 2**16  # the staging went back
        assert free["released"] >= kv
    assert sorted(memory.emptied, key=str) == ["GPU-0", "GPU-1", None]  # engine and workers
    released = llm.calls.index(("collective_rpc", "rstar2_release_memory"))
    assert released < llm.calls.index(("wake_up", ["kv_cache"]))
    assert_ranks_hold(llm, full)


async def generated(engine: VLLMEngine, llm: StandInAsyncLLM, request_id: str) -> GenerationResult:
    running = asyncio.create_task(engine.generate(request(request_id)))
    await llm.held.wait()
    llm.release()
    return await running


@pytest.mark.skipif(not HAS_VLLM, reason="generate builds vLLM's sampling parameters")
async def test_results_carry_the_version_of_the_weights_they_started_under(
    kind: ModelKind,
) -> None:
    llm = StandInAsyncLLM(CONFIG, tp=1, model=kind)
    engine = engine_on(llm)
    await engine.update_weights(trainer_weights(1).items(), version="7")
    assert (await generated(engine, llm, "a")).weights_version == "7"

    running = asyncio.create_task(engine.generate(request("b")))
    await llm.held.wait()
    await engine.update_weights(trainer_weights(2).items(), version="8")
    assert llm.preempted == 1  # it goes on under the new weights, recomputed
    llm.release()
    overtaken = await running
    assert overtaken.finish_reason == "stop"
    assert overtaken.weights_version == "7"  # the oldest weights any of its tokens came from
    assert (await generated(engine, llm, "c")).weights_version == "8"

    await engine.update_weights(trainer_weights(3).items())  # new weights, no label
    assert engine.weights_version is None
    assert (await generated(engine, llm, "d")).weights_version is None
