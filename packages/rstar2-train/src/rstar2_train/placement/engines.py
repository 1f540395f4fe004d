"""Inference engines in Ray actors, and the ``Engine`` proxies the driver's scheduler uses.

``RayEngine.generate`` awaits its actor (Ray object refs are awaitable), so ``RolloutScheduler``
and ``RolloutRunner`` run unchanged. When an engine actor dies, its proxy sends the requests it
still gets (the rest of its rollouts: every request carries the whole token prefix and its seed)
to a live actor of the same ``EngineGroup``; when none is left the step fails with
``EnginesLostError``.

Each proxy records the weight version its actor acknowledged (an actor that died during a sync
keeps the version it had), and every result carries the version of the weights that sampled it:
the actor's engine's own label, or else the version the actor had acknowledged when the request
went out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from rstar2_scheduler import (
    Engine,
    GenerationRequest,
    GenerationResult,
    KVStats,
    RolloutConfig,
    TransformersEngine,
    TransformersEngineConfig,
    VLLMEngine,
    VLLMEngineConfig,
)
from rstar2_scheduler.engine import Capability, NamedTensors
from rstar2_scheduler.engines import logprobs_mode_for

logger = logging.getLogger(__name__)


class EnginesLostError(RuntimeError):
    """Every engine actor died: no engine is left to re-run rollouts on."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine actor builds: a transformers engine over a model it is given, or vLLM.

    ``rollout`` holds the rollouts' sampling: a vLLM engine is started with the log-prob mode
    (and, for ``return_support``, the sampling masks) whose log-probs the trainer's
    recomputation matches for it.
    """

    kind: str
    name: str
    seed: int
    kv_budget_tokens: int = 65536
    max_batch_size: int = 64
    vllm_model: str | None = None
    vllm_args: dict[str, Any] = field(default_factory=dict)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        if self.kind == "vllm":
            self.vllm_config()  # a sampling vLLM cannot serve fails here, in the driver

    def vllm_config(self) -> VLLMEngineConfig:
        """The vLLM engine's config (see ``vllm_engine_config``)."""
        if self.vllm_model is None:
            raise ValueError(f"engine {self.name}: a vLLM engine needs vllm_model")
        return vllm_engine_config(
            self.vllm_model, name=self.name, engine_args=self.vllm_args, rollout=self.rollout
        )


def vllm_engine_config(
    model: str, *, name: str, engine_args: dict[str, Any], rollout: RolloutConfig
) -> VLLMEngineConfig:
    """A vLLM engine's config for RL, in a Ray actor or in this process: its model and
    arguments, with the log-prob mode whose behaviour log-probs the trainer's recomputation
    matches at the rollouts' sampling (``ValueError`` naming rl.rollout when no mode does), and
    vLLM's sampling masks on when the rollouts ask for supports."""
    try:
        mode = logprobs_mode_for(
            rollout.temperature,
            rollout.top_p,
            top_k=rollout.top_k,
            return_support=rollout.return_support,
        )
    except ValueError as impossible:
        raise ValueError(f"rl.rollout with rl.engines.kind=vllm: {impossible}") from None
    arguments = dict(engine_args)
    if rollout.return_support:
        if rollout.temperature == 0 or rollout.top_k == 0:
            raise ValueError(
                "rl.rollout.return_support with rl.engines.kind=vllm: vLLM returns sampling "
                "masks only for requests with temperature > 0 and top_k > 0 (its bound on a "
                f"mask's size); got temperature {rollout.temperature:g}, top_k {rollout.top_k}"
            )
        arguments["return_sampling_mask"] = True
    return VLLMEngineConfig(model=model, name=name, engine_args=arguments, logprobs_mode=mode)


class EngineHost:
    """The body of an engine actor: one ``Engine``, called from the driver's ``RayEngine``."""

    def __init__(self, spec: EngineSpec, model: PreTrainedModel | None, threads: int) -> None:
        torch.set_num_threads(max(1, threads))
        self.engine: Engine
        if spec.kind == "vllm":
            self.engine = VLLMEngine(spec.vllm_config())
        else:
            assert model is not None
            device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
            model.requires_grad_(False)
            self.engine = TransformersEngine(
                model.to(device),  # type: ignore[arg-type]  # transformers' stub of .to
                TransformersEngineConfig(
                    name=spec.name,
                    kv_budget_tokens=spec.kv_budget_tokens,
                    max_batch_size=spec.max_batch_size,
                    seed=spec.seed,
                ),
            )

    def capabilities(self) -> list[str]:
        return sorted(self.engine.capabilities)

    async def start(self) -> KVStats:
        await self.engine.start()
        return self.engine.kv_stats()

    async def generate(self, request: GenerationRequest) -> tuple[GenerationResult, KVStats]:
        result = await self.engine.generate(request)
        return result, self.engine.kv_stats()

    def kv_stats(self) -> KVStats:
        return self.engine.kv_stats()

    async def update_weights(self, buckets: list[Any], version: str | None) -> None:
        """One sync from Ray object refs of weight buckets (dicts of tensors), read one bucket
        at a time so that at most one is held here besides the engine's own copy. Reading a
        bucket blocks this actor's event loop briefly; nothing generates during a sync."""
        import ray

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for ref in buckets:
                yield from ray.get(ref).items()

        await self.engine.update_weights(stream(), version=version)

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def sleep(self, level: int) -> None:
        await self.engine.sleep(level)

    async def wake_up(self) -> None:
        await self.engine.wake_up()

    async def close(self) -> None:
        await self.engine.close()


def _is_actor_death(error: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(error, ActorDiedError | ActorUnavailableError | RayActorError)


class EngineGroup:
    """The engine actors of a stage: which are alive, and who stands in for a dead one."""

    def __init__(self, handles: Sequence[Any], names: Sequence[str]) -> None:
        self.handles = list(handles)
        self.names = list(names)
        self.dead: dict[int, str] = {}
        self.versions: dict[int, str | None] = dict.fromkeys(range(len(self.handles)))
        """Each actor's weight version: the label of its last acknowledged sync."""
        self._next = itertools.count()

    def alive(self) -> list[int]:
        return [i for i in range(len(self.handles)) if i not in self.dead]

    def mark_dead(self, index: int, error: BaseException) -> None:
        if index not in self.dead:
            self.dead[index] = f"{type(error).__name__}: {error}"
            logger.warning(
                "engine actor %s died (%s); its requests go to the live engines %s",
                self.names[index],
                str(error).splitlines()[0] if str(error) else type(error).__name__,
                [self.names[i] for i in self.alive()],
            )

    def stand_in(self, index: int) -> int | None:
        """``index`` while it lives, else a live engine (round robin), else None."""
        if index not in self.dead:
            return index
        alive = self.alive()
        return alive[next(self._next) % len(alive)] if alive else None

    def check(self) -> None:
        """Raise ``EnginesLostError`` when no engine actor is alive."""
        if not self.alive():
            causes = "; ".join(f"{self.names[i]}: {why}" for i, why in sorted(self.dead.items()))
            raise EnginesLostError(
                f"all {len(self.handles)} engine actors died ({causes}); the step cannot be "
                "finished: resume the stage from its last checkpoint"
            )

    async def call(self, method: str, *args: Any) -> list[int]:
        """``method`` on every live actor at once; actors found dead are marked. Returns the
        actors that answered."""
        alive = self.alive()
        refs = [getattr(self.handles[i], method).remote(*args) for i in alive]
        outcomes = await asyncio.gather(*refs, return_exceptions=True)
        answered = []
        for index, outcome in zip(alive, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not _is_actor_death(outcome):
                    raise outcome
                self.mark_dead(index, outcome)
            else:
                answered.append(index)
        self.check()
        return answered


class RayEngine(Engine):
    """An ``Engine`` whose work runs in engine actor ``index`` of ``group``."""

    def __init__(self, group: EngineGroup, index: int, capabilities: Sequence[str]) -> None:
        self.group = group
        self.index = index
        self.name = group.names[index]
        self._capabilities = frozenset(capabilities)
        self._stats = KVStats(capacity_tokens=0, used_tokens=0)

    @property
    def weights_version(self) -> str | None:
        """The version of the last sync this engine's actor acknowledged."""
        return self.group.versions[self.index]

    def supports(self, capability: Capability) -> bool:
        return capability in self._capabilities

    async def start(self) -> None:
        target = self.group.stand_in(self.index)
        if target is not None:
            try:
                self._stats = await self.group.handles[target].start.remote()
            except Exception as error:
                if not _is_actor_death(error):
                    raise
                self.group.mark_dead(target, error)

    def kv_stats(self) -> KVStats:
        """The last snapshot (refreshed with every result)."""
        return self._stats

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        while True:
            target = self.group.stand_in(self.index)
            if target is None:
                return GenerationResult.failed(
                    request.request_id, "every engine actor died; nothing can run the request"
                )
            version = self.group.versions[target]  # weights change only at a sync
            try:
                result, stats = await self.group.handles[target].generate.remote(request)
            except Exception as error:
                if not _is_actor_death(error):
                    raise
                self.group.mark_dead(target, error)
                continue
            if target == self.index:
                self._stats = stats
            assert isinstance(result, GenerationResult)
            if result.weights_version is None and version is not None:
                result = result.model_copy(update={"weights_version": version})
            return result

    async def _own(self, method: str, *args: Any) -> bool:
        """``method`` on this engine's actor; False when the actor is (found) dead."""
        if self.index in self.group.dead:
            return False
        try:
            await getattr(self.group.handles[self.index], method).remote(*args)
        except Exception as error:
            if not _is_actor_death(error):
                raise
            self.group.mark_dead(self.index, error)
            return False
        return True

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        import ray

        if await self._own("update_weights", [ray.put(dict(weights))], version):
            self.group.versions[self.index] = version

    async def reset_prefix_cache(self) -> None:
        await self._own("reset_prefix_cache")

    async def sleep(self, level: int = 1) -> None:
        await self._own("sleep", level)

    async def wake_up(self) -> None:
        await self._own("wake_up")

    async def close(self) -> None:
        await self._own("close")


def ray_engines(engines: Sequence[Engine]) -> EngineGroup | None:
    """The group behind ``engines`` when they are all ``RayEngine``s of one group."""
    groups = {id(e.group): e.group for e in engines if isinstance(e, RayEngine)}
    if len(groups) == 1 and all(isinstance(e, RayEngine) for e in engines):
        return next(iter(groups.values()))
    return None


COLOCATED_SLEEP_LEVEL: dict[str, int] = {"vllm": 2, "transformers": 1}
"""How deep engines of each kind sleep while a colocated trainer updates: vLLM discards its
weights (the sync replaces them all, as verl and TRL do); transformers has level 1 only."""


async def sync_weights(
    actor: Any, engines: Sequence[Engine], *, version: str, wake: bool = False
) -> None:
    """The trainer's full weights to every engine, one ``update_weights`` call (one sync) per
    engine. From a ``DistributedActor`` to engine actors they travel in buckets through the Ray
    object store (straight from rank 0 to each engine); otherwise through
    ``Engine.update_weights``.

    ``wake``: the engines sleep (colocated training); each takes its weights first, then wakes
    the rest (the KV cache), so the cache is not allocated while weights are written.
    """
    from rstar2_train.placement.distributed import DistributedActor

    group = ray_engines(engines)
    if group is None or not isinstance(actor, DistributedActor):
        for engine in engines:
            await engine.update_weights(actor.named_weights(), version=version)
            if wake:
                await engine.wake_up()
        return
    for index in await group.call("update_weights", actor.weight_buckets(), version):
        group.versions[index] = version  # only actors that acknowledged the sync
    if wake:
        await group.call("wake_up")
