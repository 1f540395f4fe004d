"""An RL stage's actors on a Ray cluster: trainer ranks, engines, sandbox processes and graders
in one placement group, created from the stage config's ``placement`` section and torn down with
it."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel

from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler import Engine
from rstar2_train.config.schema import PlacementConfig, StageConfig
from rstar2_train.devices import stage_placement as stage_placement  # re-exported
from rstar2_train.placement.distributed import DistributedActor
from rstar2_train.placement.engines import EngineGroup, EngineHost, EngineSpec, RayEngine
from rstar2_train.placement.grading import GraderHost, RayGrading, actor_grader_config
from rstar2_train.placement.sandbox import SandboxProcess, sandbox_commands
from rstar2_train.precision import Precision

logger = logging.getLogger(__name__)


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {key: value for key, value in (("CPU", cpus), ("GPU", gpus)) if value > 0}


@dataclass
class PlacedStage:
    actor: DistributedActor
    engines: list[Engine]
    group: EngineGroup
    sandbox: Sandbox
    grader: RayGrading


@asynccontextmanager
async def placed_stage(
    config: StageConfig,
    placement: PlacementConfig,
    model: PreTrainedModel,
    *,
    model_path: str | None,
    total_steps: int,
) -> AsyncIterator[PlacedStage]:
    """Join (or start) the Ray cluster, place every actor, and remove them all on exit."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    rl = config.rl
    assert rl is not None
    if rl.engines.kind == "vllm" and model_path is None:
        raise ValueError("vLLM engines load a checkpoint: set model.path")
    started = False
    if not ray.is_initialized():
        address = placement.ray_address or os.environ.get("RAY_ADDRESS")
        ray.init(address=address, num_cpus=None if address else placement.local_cpus)
        started = True
    trainer, engines = placement.trainer, placement.engines
    count = rl.engines.count
    colocated = placement.mode == "colocated"
    commands = (
        []
        if rl.sandbox.url is not None
        else sandbox_commands(
            placement.sandbox.servers, placement.sandbox.workers, placement.sandbox.redis_url
        )
    )
    if colocated:
        shared = _bundle(trainer.cpus + engines.cpus, trainer.gpus + engines.gpus)
        bundles = [shared for _ in range(trainer.ranks)]
        engine_bundles = list(range(trainer.ranks))
    else:
        bundles = [_bundle(trainer.cpus, trainer.gpus) for _ in range(trainer.ranks)]
        engine_bundles = list(range(len(bundles), len(bundles) + count))
        bundles += [_bundle(engines.cpus, engines.gpus) for _ in range(count)]
    sandbox_bundles = list(range(len(bundles), len(bundles) + len(commands)))
    bundles += [_bundle(placement.sandbox.cpus, 0) for _ in commands]
    graders = placement.grader
    grader_bundles = list(range(len(bundles), len(bundles) + graders.actors))
    bundles += [_bundle(graders.cpus, 0) for _ in range(graders.actors)]
    group = placement_group(bundles, strategy=placement.strategy, name=f"{config.name}-stage")
    await group.ready()

    def at(index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

    handles: list[Any] = []
    actor: DistributedActor | None = None
    try:
        sandbox_actors: list[Any] = [
            ray.remote(SandboxProcess)
            .options(num_cpus=placement.sandbox.cpus, scheduling_strategy=at(bundle))
            .remote(command)
            for bundle, command in zip(sandbox_bundles, commands, strict=True)
        ]
        handles += sandbox_actors
        urls = ray.get([a.ready.remote() for a in sandbox_actors])
        sandbox_url = rl.sandbox.url or urls[0]
        actor = DistributedActor(
            model,
            config.optimizer,
            config.schedule,
            total_steps=total_steps,
            placement=trainer,
            scheduling=[at(i) for i in range(trainer.ranks)],
            name=config.name,
            memory=config.memory,
            precision=Precision.of(config),
        )
        shared_model = ray.put(model) if rl.engines.kind == "transformers" else None
        names = [f"engine-{i}" for i in range(count)]
        host: Any = ray.remote(EngineHost)
        engine_actors: list[Any] = [
            host.options(
                num_cpus=engines.cpus,
                num_gpus=engines.gpus,
                scheduling_strategy=at(bundle),
                name=f"{config.name}-{name}",
                max_concurrency=1000,
            ).remote(
                EngineSpec(
                    kind=rl.engines.kind,
                    name=name,
                    seed=config.seed + index,
                    kv_budget_tokens=rl.engines.kv_budget_tokens,
                    max_batch_size=rl.engines.max_batch_size,
                    vllm_model=model_path,
                    vllm_args=dict(rl.engines.vllm),
                    rollout=rl.rollout,
                ),
                shared_model,
                max(1, int(engines.cpus)),
            )
            for index, (name, bundle) in enumerate(zip(names, engine_bundles, strict=True))
        ]
        handles += engine_actors
        grader_names = [f"grader-{i}" for i in range(graders.actors)]
        grader_config = actor_grader_config(rl.grader, graders)
        grader_actors: list[Any] = [
            ray.remote(GraderHost)
            .options(
                num_cpus=graders.cpus, scheduling_strategy=at(bundle), name=f"{config.name}-{name}"
            )
            .remote(grader_config)
            for name, bundle in zip(grader_names, grader_bundles, strict=True)
        ]
        handles += grader_actors
        capabilities = ray.get([a.capabilities.remote() for a in engine_actors])
        engine_group = EngineGroup(engine_actors, names)
        proxies: list[Engine] = [RayEngine(engine_group, i, capabilities[i]) for i in range(count)]
        logger.info(
            "placed %s: %d trainer ranks, %d engines, %d sandbox processes, %d graders (%s, %s)",
            config.name,
            trainer.ranks,
            count,
            len(commands),
            graders.actors,
            placement.mode,
            placement.strategy,
        )
        yield PlacedStage(
            actor,
            proxies,
            engine_group,
            SandboxClient(sandbox_url),
            RayGrading(grader_actors, grader_names, grader_config),
        )
    finally:
        if actor is not None:
            actor.close()
        try:
            ray.get([handle.stop.remote() for handle in handles[: len(commands)]])
        except ray.exceptions.RayError as error:
            logger.warning("stopping the sandbox processes: %s", error)
        for handle in handles:
            ray.kill(handle)
        remove_placement_group(group)
        if started:
            ray.shutdown()
