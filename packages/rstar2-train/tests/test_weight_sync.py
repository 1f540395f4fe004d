"""sync_weights without Ray: one update_weights call per engine per sync, and in colocated
training each engine takes its weights before it wakes the rest (verl's and TRL's order)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from rstar2_scheduler import Engine, GenerationRequest, GenerationResult, KVStats
from rstar2_scheduler.engine import NamedTensors
from rstar2_train.placement.engines import sync_weights


class Recorder(Engine):
    """An engine that records the calls a sync makes."""

    capabilities = frozenset({"update_weights", "sleep"})

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name = name
        self.log = log

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise AssertionError("no generation during a sync")

    def kv_stats(self) -> KVStats:
        return KVStats(capacity_tokens=0, used_tokens=0)

    async def update_weights(self, weights: NamedTensors, *, version: str | None = None) -> None:
        names = [name for name, _ in weights]
        self.log.append((self.name, "update_weights", ",".join(names), str(version)))

    async def wake_up(self) -> None:
        self.log.append((self.name, "wake_up"))


class Trainer:
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from {"a": torch.zeros(2), "b": torch.ones(3)}.items()


@pytest.mark.asyncio
@pytest.mark.parametrize("colocated", [False, True])
async def test_one_call_per_engine_and_weights_before_waking(colocated: bool) -> None:
    log: list[tuple[str, ...]] = []
    engines = [Recorder("e0", log), Recorder("e1", log)]
    await sync_weights(Trainer(), engines, version="5", wake=colocated)
    woken = [("e0", "wake_up")] if colocated else []
    second = [("e1", "wake_up")] if colocated else []
    assert log == [
        ("e0", "update_weights", "a,b", "5"),
        *woken,
        ("e1", "update_weights", "a,b", "5"),
        *second,
    ]
