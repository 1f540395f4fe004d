"""The data-parallel trainer seen from the driver: the ``Actor`` surface over N Ray ranks.

Micro-batches are built in the driver as for one process and split across ranks (balanced by
model tokens). Loss functions are normalised by the caller over the whole step, and gradients
are summed over ranks, so the loss and the updated weights equal a single-process step on the
same micro-batches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from rstar2_train.actor import LossFn, MetricSums, UpdateStats
from rstar2_train.batching import MicroBatch
from rstar2_train.config.schema import (
    MemoryConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainerPlacement,
)
from rstar2_train.placement.ranks import RankSetup, RankUpdate, TrainerRank
from rstar2_train.precision import Precision

logger = logging.getLogger(__name__)


def assign(batches: Sequence[MicroBatch], ranks: int) -> list[list[int]]:
    """Micro-batch indices per rank: largest first onto the least loaded rank."""
    loads = [0] * ranks
    own: list[list[int]] = [[] for _ in range(ranks)]
    for index in sorted(range(len(batches)), key=lambda i: -batches[i].input_ids.numel()):
        rank = loads.index(min(loads))
        own[rank].append(index)
        loads[rank] += batches[index].input_ids.numel()
    return [sorted(indices) for indices in own]


class DistributedActor:
    """``Actor``'s surface over ``placement.ranks`` FSDP2 ranks in Ray actors.

    ``model`` is the policy at its starting point, in this process (on the CPU): ranks shard
    a copy of it (their master weights, in ``precision.master``); it is then kept in the
    compute dtype and receives the full weights again for each checkpoint.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        optimizer: OptimizerConfig,
        schedule: ScheduleConfig,
        *,
        total_steps: int,
        placement: TrainerPlacement,
        scheduling: Sequence[Any] | None = None,
        name: str = "trainer",
        memory: MemoryConfig | None = None,
        precision: Precision,
    ) -> None:
        import ray

        self._model = model
        self.placement = placement
        world = placement.ranks
        backend = placement.backend
        if backend == "auto":
            backend = "nccl" if placement.gpus > 0 else "gloo"
        remote: Any = ray.remote(TrainerRank)
        self.ranks: list[Any] = [
            remote.options(
                num_cpus=placement.cpus,
                num_gpus=placement.gpus,
                name=f"{name}-rank-{rank}",
                scheduling_strategy=None if scheduling is None else scheduling[rank],
            ).remote(rank, max(1, int(placement.cpus)))
            for rank in range(world)
        ]
        address, port = ray.get(self.ranks[0].address.remote())
        setup = RankSetup(
            world=world,
            master_addr=address,
            master_port=port,
            backend=backend,
            fsdp=placement.fsdp,
            optimizer=optimizer,
            schedule=schedule,
            total_steps=total_steps,
            precision=precision,
            memory=memory or MemoryConfig(),
        )
        shared = ray.put(model)
        self._all("setup", setup, shared)
        del shared
        model.to(precision.compute)  # type: ignore[arg-type]  # transformers' stub of .to
        self.precision = precision
        self._lr = float(ray.get(self.ranks[0].lr.remote()))
        logger.info("trainer: %d %s ranks (FSDP2)", world, backend)

    def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank at once (a collective) and wait for all."""
        import ray

        return list(ray.get([getattr(r, method).remote(*args, **kwargs) for r in self.ranks]))

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def lr(self) -> float:
        return self._lr

    def logprobs(self, batches: Sequence[MicroBatch], *, temperature: float) -> list[torch.Tensor]:
        import ray

        own = assign(batches, len(self.ranks))
        passes = max(len(indices) for indices in own)
        shared = ray.put(list(batches))
        found: dict[int, torch.Tensor] = {}
        calls = [
            rank.logprobs.remote(shared, mine, passes, temperature)
            for rank, mine in zip(self.ranks, own, strict=True)
        ]
        for part in ray.get(calls):
            found.update(part)
        return [found[i] for i in range(len(batches))]

    def update(
        self, batches: Sequence[MicroBatch], loss_fn: LossFn, *, temperature: float = 1.0
    ) -> UpdateStats:
        import ray

        own = assign(batches, len(self.ranks))
        passes = max(len(indices) for indices in own)
        shared = ray.put(list(batches))
        function = ray.put(loss_fn)
        parts: list[RankUpdate] = list(
            ray.get(
                [
                    rank.update.remote(shared, function, mine, passes, temperature)
                    for rank, mine in zip(self.ranks, own, strict=True)
                ]
            )
        )
        sums = MetricSums()
        for part in parts:
            sums.add(part.metric_sums)
        first = parts[0]
        metrics = sums.means(first.tokens)
        self._lr = float(ray.get(self.ranks[0].lr.remote()))
        return UpdateStats(
            grad_norm=first.grad_norm, lr=first.lr, skipped=first.skipped, metrics=metrics
        )

    def skip(self) -> None:
        import ray

        self._all("skip")
        self._lr = float(ray.get(self.ranks[0].lr.remote()))

    def weight_buckets(self) -> list[Any]:
        """The full weights gathered from the shards, as Ray object refs of buckets."""
        bucket_bytes = self.placement.bucket_mb * 2**20
        return list(self._all("weight_buckets", bucket_bytes)[0])

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        import ray

        for ref in self.weight_buckets():
            yield from ray.get(ref).items()

    def export_model(self) -> PreTrainedModel:
        weights = self._all("full_weights", self.precision.compute)[0]
        self._model.load_state_dict(weights)
        return self._model

    def optimizer_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._all("optimizer_state")[0]
        return state

    def load_optimizer_state(self, state: dict[str, Any], *, resume: bool) -> None:
        import ray

        self._all("load_optimizer_state", ray.put(state), resume=resume)
        self._lr = float(ray.get(self.ranks[0].lr.remote()))

    def close(self) -> None:
        """Leave the process group and end the rank actors."""
        import ray

        try:
            self._all("close")
        except ray.exceptions.RayError as error:  # a rank already gone: nothing to leave
            logger.warning("closing the trainer ranks: %s", error)
        finally:
            for rank in self.ranks:
                ray.kill(rank)
