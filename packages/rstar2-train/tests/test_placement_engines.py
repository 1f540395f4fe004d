"""Engine proxies' weight versions and the vLLM engine spec, without a Ray cluster: the engine
actors are stand-ins answering ``handle.method.remote(...)`` as Ray's awaitable refs do, and one
of them dies as a Ray actor does (its calls raise ``ActorDiedError``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch
from ray.exceptions import ActorDiedError

from rstar2_scheduler import (
    GenerationRequest,
    GenerationResult,
    KVStats,
    RolloutConfig,
    SamplingParams,
    VLLMEngine,
)
from rstar2_train.config.schema import EnginesConfig
from rstar2_train.placement import DistributedActor
from rstar2_train.placement.engines import EngineGroup, EngineSpec, RayEngine, sync_weights
from rstar2_train.rl.resources import make_engines

STATS = KVStats(capacity_tokens=64, used_tokens=0)


class Actor:
    """An engine actor: records syncs, answers requests; once ``dead``, every call raises as a
    dead Ray actor's does. ``label`` is what its engine puts on results (None: nothing)."""

    def __init__(self, label: str | None = None) -> None:
        self.dead = False
        self.label = label
        self.synced: list[str | None] = []

    def __getattr__(self, method: str) -> SimpleNamespace:
        body: Callable[..., Any] = getattr(self, f"_{method}")

        async def call(*args: Any) -> Any:
            if self.dead:
                raise ActorDiedError()
            return body(*args)

        return SimpleNamespace(remote=call)

    def _update_weights(self, buckets: list[Any], version: str | None) -> None:
        self.synced.append(version)

    def _wake_up(self) -> None:
        pass

    def _generate(self, request: GenerationRequest) -> tuple[GenerationResult, KVStats]:
        result = GenerationResult(
            request_id=request.request_id,
            token_ids=(1,),
            logprobs=(-0.5,),
            finish_reason="stop",
            weights_version=self.label,
        )
        return result, STATS


def proxies(*actors: Actor) -> tuple[EngineGroup, list[RayEngine]]:
    names = [f"engine-{i}" for i in range(len(actors))]
    group = EngineGroup(list(actors), names)
    return group, [RayEngine(group, i, ["update_weights"]) for i in range(len(actors))]


def ask(engine: RayEngine, request_id: str) -> GenerationResult:
    request = GenerationRequest(
        request_id=request_id, prompt_ids=(1, 2), sampling=SamplingParams(max_new_tokens=1)
    )
    return asyncio.run(engine.generate(request))


WEIGHTS = {"w": torch.zeros(2)}


def test_an_actor_that_dies_during_its_sync_keeps_its_old_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray, "put", lambda value: value)  # no object store here
    actors = Actor(), Actor()
    group, engines = proxies(*actors)
    for engine in engines:
        asyncio.run(engine.update_weights(WEIGHTS.items(), version="1"))
    actors[1].dead = True
    for engine in engines:
        asyncio.run(engine.update_weights(WEIGHTS.items(), version="2"))
    assert [engine.weights_version for engine in engines] == ["2", "1"]
    assert list(group.dead) == [1]
    assert actors[1].synced == ["1"]


class Trainer(DistributedActor):
    """A trainer whose weights go out as (no) buckets."""

    def __init__(self) -> None:  # no ranks to start
        pass

    def weight_buckets(self) -> list[Any]:
        return []


def test_a_group_sync_records_the_version_on_the_actors_that_acknowledged_it() -> None:
    actors = Actor(), Actor(), Actor()
    group, engines = proxies(*actors)
    asyncio.run(sync_weights(Trainer(), engines, version="1", wake=True))
    assert [engine.weights_version for engine in engines] == ["1", "1", "1"]
    actors[2].dead = True
    asyncio.run(sync_weights(Trainer(), engines, version="2", wake=True))
    assert [engine.weights_version for engine in engines] == ["2", "2", "1"]
    assert list(group.dead) == [2]


def test_every_result_carries_the_version_of_the_weights_that_sampled_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray, "put", lambda value: value)
    actors = Actor(), Actor(label="own-label")
    group, engines = proxies(*actors)
    assert ask(engines[0], "before").weights_version is None  # never synced
    for engine in engines:
        asyncio.run(engine.update_weights(WEIGHTS.items(), version="3"))
    assert ask(engines[0], "a").weights_version == "3"  # the acknowledged version
    assert ask(engines[1], "b").weights_version == "own-label"  # the engine's own label wins
    asyncio.run(engines[0].update_weights(WEIGHTS.items(), version="4"))
    actors[1].dead = True
    rerouted = ask(engines[1], "c")  # engine-1's request runs on engine-0, under its weights
    assert list(group.dead) == [1]
    assert rerouted.weights_version == "4"


def test_a_vllm_engine_reports_the_log_probs_the_trainer_recomputes() -> None:
    def spec(temperature: float, top_p: float, **more: Any) -> EngineSpec:
        return EngineSpec(
            kind="vllm",
            name="engine-0",
            seed=0,
            vllm_model="/ckpt",
            vllm_args={"gpu_memory_utilization": 0.5},
            rollout=RolloutConfig(temperature=temperature, top_p=top_p, **more),
        )

    config = spec(1.0, 1.0).vllm_config()
    assert (config.model, config.name, config.logprobs_mode) == (
        "/ckpt",
        "engine-0",
        "processed_logprobs",
    )
    assert config.engine_args == {"gpu_memory_utilization": 0.5}
    assert spec(0.6, 1.0).vllm_config().logprobs_mode == "processed_logprobs"
    assert spec(1.0, 0.95).vllm_config().logprobs_mode == "raw_logprobs"
    with pytest.raises(ValueError, match=r"rl.rollout with rl.engines.kind=vllm: .*top_p 0\.95"):
        spec(0.6, 0.95)  # in the driver, before any actor starts
    # Supports make vLLM's processed log-probs the trainer's at any nucleus.
    masked = spec(0.6, 0.95, top_k=50, return_support=True).vllm_config()
    assert masked.logprobs_mode == "processed_logprobs"
    assert masked.engine_args == {"gpu_memory_utilization": 0.5, "return_sampling_mask": True}
    with pytest.raises(ValueError, match=r"temperature > 0 and top_k > 0.*top_k 0"):
        spec(0.6, 0.95, return_support=True)


def test_the_in_process_vllm_engine_uses_the_same_log_prob_mode() -> None:
    """An RL stage without Ray builds its vLLM engine with the mode placement gives its actors."""

    def engine(temperature: float, top_p: float) -> VLLMEngine:
        rollout = RolloutConfig(temperature=temperature, top_p=top_p)
        config = EnginesConfig(kind="vllm", vllm={"gpu_memory_utilization": 0.5})
        policy: Any = object()  # vLLM loads model_path: the policy's module is not touched
        (made,) = make_engines(config, policy, model_path="/ckpt", seed=0, rollout=rollout)
        assert isinstance(made, VLLMEngine)
        return made

    settings = engine(1.0, 0.95).config
    assert (settings.model, settings.logprobs_mode) == ("/ckpt", "raw_logprobs")
    assert settings.engine_args == {"gpu_memory_utilization": 0.5}
    assert engine(0.6, 1.0).config.logprobs_mode == "processed_logprobs"
    with pytest.raises(ValueError, match=r"rl.rollout with rl.engines.kind=vllm: .*top_p 0\.95"):
        engine(0.6, 0.95)
