"""VLLMEngine against the installed vLLM's own classes: the engine arguments it starts vLLM
with, the worker extension as vLLM loads it, and generation and sleep through ``AsyncLLM``'s
calls (a stand-in answers them; no GPU here). The argument checks run without vLLM too."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest
import vllm_standin
from vllm_standin import SMALLEST, StandInAsyncLLM

from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig, engine_arguments
from rstar2_scheduler.engines.vllm_worker import WORKER_EXTENSION, WeightSyncExtension

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra")


class CustomExtension(WeightSyncExtension):
    """A user's extension on top of rstar2's."""


def test_engine_arguments_add_what_weight_sync_needs() -> None:
    single = engine_arguments(VLLMEngineConfig(model="m", engine_args={"seed": 3}))
    assert single == {
        "logprobs_mode": "processed_logprobs",
        "seed": 3,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    parallel = engine_arguments(
        VLLMEngineConfig(model="m", engine_args={"tensor_parallel_size": 2})
    )
    assert parallel["distributed_executor_backend"] == "mp"
    chosen = engine_arguments(
        VLLMEngineConfig(
            model="m",
            engine_args={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
        )
    )
    assert chosen["distributed_executor_backend"] == "ray"  # the user's choice stands
    subclass = f"{__name__}.CustomExtension"
    custom = engine_arguments(
        VLLMEngineConfig(model="m", engine_args={"worker_extension_cls": subclass})
    )
    assert custom["worker_extension_cls"] == subclass


@pytest.mark.parametrize(
    ("extension", "message"),
    [
        ("json.JSONDecoder", "or a subclass of it"),
        ("no_such_module.Extension", "cannot import"),
        ("NoDots", "or a subclass of it"),
    ],
)
def test_a_foreign_worker_extension_is_refused(extension: str, message: str) -> None:
    config = VLLMEngineConfig(model="m", engine_args={"worker_extension_cls": extension})
    with pytest.raises(ValueError, match=rf"worker_extension_cls: .*{message}"):
        engine_arguments(config)


@needs_vllm
def test_installed_vllm_takes_the_engine_arguments() -> None:
    from vllm import AsyncEngineArgs

    arguments = engine_arguments(
        VLLMEngineConfig(model="m", engine_args={"tensor_parallel_size": 2})
    )
    args = AsyncEngineArgs(model="m", **arguments)
    assert args.worker_extension_cls == WORKER_EXTENSION
    assert args.logprobs_mode == "processed_logprobs"
    assert args.distributed_executor_backend == "mp"


@needs_vllm
def test_vllm_loads_the_extension_into_its_worker_without_clashes() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu_worker import Worker

    assert resolve_obj_by_qualname(WORKER_EXTENSION) is WeightSyncExtension
    names = [name for name in dir(WeightSyncExtension) if not name.startswith("__")]
    assert names
    assert all(name.startswith("rstar2_") for name in names)
    assert [name for name in names if hasattr(Worker, name)] == []  # vLLM's clash rule


@needs_vllm
def test_the_stand_in_uses_vllms_encoder() -> None:
    from vllm.v1.serial_utils import MsgpackEncoder

    assert vllm_standin.MsgpackEncoder is MsgpackEncoder


@needs_vllm
@pytest.mark.asyncio
async def test_generate_and_sleep_through_async_llm_calls() -> None:
    llm = StandInAsyncLLM(SMALLEST)
    engine = VLLMEngine(VLLMEngineConfig(model="m"), llm=llm, transport=llm.memory.engine())
    ask = GenerationRequest(
        request_id="a", prompt_ids=(5, 6), sampling=SamplingParams(max_new_tokens=2)
    )
    running = asyncio.create_task(engine.generate(ask))
    await llm.held.wait()
    with pytest.raises(RuntimeError, match="1 requests in flight"):
        await engine.sleep(1)  # vLLM would abort the request
    llm.release()
    result = await running
    assert (result.token_ids, result.logprobs, result.finish_reason) == (
        (1, 2),
        (-0.25, -0.25),
        "stop",
    )
    await engine.sleep(1)
    assert (await engine.generate(ask)).error == (
        "engine 'vllm' is asleep (['kv_cache', 'weights']); call wake_up() first"
    )
    await engine.wake_up()
    llm.release()
    again = asyncio.create_task(engine.generate(ask))
    await llm.held.wait()
    llm.release()
    assert (await again).finish_reason == "stop"
    stats = engine.kv_stats()
    assert stats.capacity_tokens == 64 * 16
    assert stats.max_running == 32  # the scheduler's max_num_seqs
    assert json.loads(stats.model_dump_json())["capacity_tokens"] == 1024
