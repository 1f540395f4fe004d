"""The rollout side of an RL stage: engines, the sandbox, grading."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from transformers import PreTrainedModel

from rstar2_eval import Grader
from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.local import LocalSandbox
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler import (
    Engine,
    ProcessEngine,
    ProcessEngineConfig,
    RolloutConfig,
    TransformersEngine,
    TransformersEngineConfig,
    VLLMEngine,
)
from rstar2_train.actor import Actor, TrainingActor
from rstar2_train.config.schema import EnginesConfig, SandboxConfig, StageConfig
from rstar2_train.modeling import resolve_device
from rstar2_train.placement.engines import vllm_engine_config
from rstar2_train.precision import Precision
from rstar2_train.rl.grading import Grading, LocalGrading

logger = logging.getLogger(__name__)


def make_engines(
    config: EnginesConfig,
    model: PreTrainedModel,
    *,
    model_path: str | None,
    seed: int,
    rollout: RolloutConfig,
) -> list[Engine]:
    """``config.count`` engines serving the policy's current weights.

    Transformers engines hold their own copy of ``model`` (the trainer's stays in training
    mode); vLLM loads ``model_path`` and then receives weights after every step, started in
    the log-prob mode that matches the trainer's recomputation at ``rollout``'s sampling.
    """
    if config.kind == "vllm":
        if config.count > 1:
            raise ValueError(
                "rl.engines.count > 1 with vllm needs one GPU per engine: run the stage with "
                "Ray placement, or use one engine (tensor_parallel_size in rl.engines.vllm)"
            )
        if model_path is None:
            raise ValueError("vLLM engines load a checkpoint: set model.path")
        vllm = vllm_engine_config(
            model_path, name="engine-0", engine_args=config.vllm, rollout=rollout
        )
        return [VLLMEngine(vllm)]
    device = resolve_device(config.device)
    engines: list[Engine] = []
    for index in range(config.count):
        replica = copy.deepcopy(model).to(device)  # type: ignore[arg-type]  # transformers' stub
        replica.requires_grad_(False)
        settings = TransformersEngineConfig(
            name=f"engine-{index}",
            kv_budget_tokens=config.kv_budget_tokens,
            max_batch_size=config.max_batch_size,
            seed=seed + index,
            torch_threads=config.torch_threads,
        )
        if config.process:
            cpus = tuple(config.cpus) if config.cpus is not None else None
            engines.append(ProcessEngine(replica, ProcessEngineConfig(engine=settings, cpus=cpus)))
        else:
            engines.append(TransformersEngine(replica, settings))
    return engines


def make_sandbox(config: SandboxConfig) -> Sandbox:
    """The configured sandbox service, or an embedded one."""
    if config.url is not None:
        return SandboxClient(config.url)
    return LocalSandbox(config.executor)


@dataclass
class RolloutResources:
    engines: list[Engine]
    sandbox: Sandbox
    grader: Grading


@asynccontextmanager
async def rollout_resources(
    engines: list[Engine],
    sandbox: Sandbox,
    grader: Grading,
    *,
    check: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[RolloutResources]:
    """Start everything, and stop it all however the stage ends.

    Grading warms up (its math-verify workers start and verify one answer) while ``check``
    (the sandbox's) runs and the engines start: a cold worker would otherwise hold up the first
    answer that needs it by seconds. The check comes before the engines, so a dead sandbox
    stops the stage before a long engine start.
    """
    async with AsyncExitStack() as stack:
        stack.push_async_callback(grader.aclose)
        stack.push_async_callback(sandbox.aclose)
        for engine in engines:
            stack.push_async_callback(engine.close)
        warming = asyncio.ensure_future(grader.warm_up())
        try:
            if check is not None:
                await check()
            for engine in engines:
                await engine.start()
        finally:
            await warming
        yield RolloutResources(engines, sandbox, grader)


@dataclass
class TrainingSide:
    """The trainer, its engines, the sandbox and grading: in this process, or placed on Ray."""

    actor: TrainingActor
    engines: list[Engine]
    sandbox: Sandbox
    grader: Grading
    mode: Literal["local", "split", "colocated"]


@asynccontextmanager
async def training_side(
    config: StageConfig, model: PreTrainedModel, *, model_path: str | None, total_steps: int
) -> AsyncIterator[TrainingSide]:
    """Every part of the stage, per its ``placement`` (or RAY_ADDRESS)."""
    from rstar2_train.placement.stage import placed_stage, stage_placement

    rl = config.rl
    assert rl is not None
    placement = stage_placement(config)
    if placement is None:
        actor = Actor(
            model,
            config.optimizer,
            config.schedule,
            total_steps=total_steps,
            precision=Precision.of(config),
        )
        engines = make_engines(
            rl.engines, model, model_path=model_path, seed=config.seed, rollout=rl.rollout
        )
        grader = LocalGrading(Grader(rl.grader))
        yield TrainingSide(actor, engines, make_sandbox(rl.sandbox), grader, "local")
        return
    async with placed_stage(
        config, placement, model, model_path=model_path, total_steps=total_steps
    ) as placed:
        yield TrainingSide(
            placed.actor, placed.engines, placed.sandbox, placed.grader, placement.mode
        )
