"""Turn-synchronous rollouts: the baseline the rStar2-Agent paper measured its scheduler against.

Before its load balancer, rStar2-Agent split a batch evenly across engines and ran each engine's
share turn by turn: every rollout of the engine generates its turn, the engine waits for the last
of them, the turn's tool calls run, and the next turn starts once every tool response is back.
``TurnBarrier`` is that lockstep for one engine's rollouts; ``Workload.run_rollout`` follows it
when given one barrier per engine.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class LockstepError(RuntimeError):
    """A rollout joined an engine's lockstep after its first turn ended."""


class TurnBarrier:
    """The rollouts of one engine; each waits at a round until every member has arrived.

    Members join before the first round ends (the static split places every rollout up front)
    and leave when they make their last turn, so a round waits only for rollouts still running.
    """

    def __init__(self) -> None:
        self.members = 0
        self.arrived = 0
        self.rounds = 0
        self._release = asyncio.Event()

    def join(self) -> None:
        if self.rounds:
            raise LockstepError(
                "a rollout joined its engine's lockstep after the first round ended; turn-"
                "synchronous rollouts need every rollout placed up front (the static policy "
                "without max_concurrency)"
            )
        self.members += 1

    def leave(self) -> None:
        self.members -= 1
        self._maybe_release()

    async def wait(self) -> None:
        """Arrive at the current round and wait until every member has."""
        release = self._release
        self.arrived += 1
        self._maybe_release()
        await release.wait()

    def _maybe_release(self) -> None:
        if self.arrived and self.arrived >= self.members:
            self.rounds += 1
            self.arrived = 0
            self._release.set()
            self._release = asyncio.Event()


def engine_barriers() -> defaultdict[str, TurnBarrier]:
    """One barrier per engine name, created as rollouts reach the engine."""
    return defaultdict(TurnBarrier)
