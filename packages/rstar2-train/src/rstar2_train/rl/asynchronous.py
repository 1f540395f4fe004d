"""Bounded-staleness GRPO-RoC (``rl.max_staleness`` eta >= 1): rollouts overlap the update.

Three parts, beside the synchronous loop rather than threaded through it:

- **Producer.** rstar2-scheduler's ``produce`` admits prompt groups under the
  ``StalenessBuffer`` rule, (eta + 1) x B - (groups admitted and not yet consumed) > 0, and
  runs each step's groups through one ``RolloutScheduler`` on the ``TurnGate``'s engines:
  ``collect``, with the problems, seeds and grading of the synchronous loop. Up to eta + 1
  steps generate at once; a full buffer blocks admission, nothing is discarded.
- **Buffer.** Each step's groups wait there, complete, until the trainer takes them, oldest
  step first.
- **Consumer (the trainer).** For each step: the step's groups, all-equal filtering and RoC as
  in the synchronous loop, the update with the decoupled objective (the log-probs recomputed
  at its start are the proximal policy; each token's loss is weighted by
  min(pi_prox / pi_behav, loss.behaviour_cap)), then the weight sync: every engine finishes
  the generate calls it is running, takes the new weights, and the rollouts' next turns
  prefill on them. Only then does the step count as consumed, admitting the groups of step
  ``step + eta + 1``.

A group of step ``s`` is admitted while the engines hold version ``v >= s - 1 - eta`` and
weights only move forward, so no token trained on in step ``s`` (whose update starts from
version ``s - 1``) is more than eta versions old; each step checks it on every trained token.
eta = 0 runs the synchronous loop's steps in the synchronous loop's order with the same seeds.

A resumed stage regenerates the groups that were in flight when it stopped (they were not
consumed, so they are not in the checkpoint), from the checkpoint's weights; the data order
continues from the consumed steps, so no group is trained on twice. ``groups.jsonl`` records
which problems each step trained on and from which policy version its groups were admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import atomic_write_text
from rstar2_scheduler import RolloutScheduler
from rstar2_scheduler.staleness import StalenessBuffer, TurnGate, produce
from rstar2_train.metrics import read_metrics
from rstar2_train.placement.engines import ray_engines, sync_weights
from rstar2_train.rl.rollouts import RolloutPhaseResult, ScoredRollout, collect
from rstar2_train.rl.trainer import RLTrainer, StageParts
from rstar2_train.rl.update import BehaviourCorrection

logger = logging.getLogger(__name__)

LEDGER = "groups.jsonl"


class StalenessError(RuntimeError):
    """A trained token was sampled more than max_staleness versions before the update."""


def lag_metrics(
    rollouts: list[ScoredRollout], *, version: int, initial: int, max_staleness: int
) -> dict[str, float]:
    """Version lag of the trained tokens (mask 1) of ``rollouts`` in an update that starts
    from policy ``version``: mean, max and the fraction of tokens at each lag 0..eta.

    A token whose engine gave no version label was sampled by the weights the engines started
    with, ``initial``. Raises ``StalenessError`` for a lag above ``max_staleness``.
    """
    lags: Counter[int] = Counter()
    for rollout in rollouts:
        trajectory = rollout.trajectory
        for trained, label in zip(trajectory.loss_mask, trajectory.versions, strict=True):
            if trained:
                lags[version - (initial if label is None else int(label))] += 1
    tokens = sum(lags.values())
    if not tokens:
        return {}
    worst = max(lags)
    if worst > max_staleness or min(lags) < 0:
        found = dict(sorted(lags.items()))
        raise StalenessError(
            f"an update from version {version} got tokens {worst} versions old (max_staleness "
            f"{max_staleness}; tokens by lag {found}): the admission bound failed"
            if worst > max_staleness
            else f"an update from version {version} got tokens sampled by a later version "
            f"(tokens by lag {found}): version labels are wrong"
        )
    metrics = {
        "staleness/lag_mean": sum(lag * n for lag, n in lags.items()) / tokens,
        "staleness/lag_max": float(worst),
    }
    for lag in range(max_staleness + 1):
        metrics[f"staleness/lag_hist/{lag}"] = lags[lag] / tokens
    return metrics


class StepLedger:
    """``groups.jsonl``: one line per consumed step, cut back to the checkpoint on resume."""

    def __init__(self, path: Path, *, keep_until: int) -> None:
        self.path = path
        kept = [r for r in read_metrics(path) if r.get("step", 0) <= keep_until]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


class AsyncRLTrainer(RLTrainer):
    """The bounded-staleness loop; the stage's set-up is ``RLTrainer``'s."""

    async def loop(self, parts: StageParts) -> None:
        run, rl, config = self.run, self.rl, self.config
        eta, per_step = rl.max_staleness, rl.prompts_per_step
        engines = parts.resources.engines
        gate = TurnGate(engines)
        scheduler = RolloutScheduler(gate.engines, rl.scheduler)
        buffer: StalenessBuffer[RolloutPhaseResult] = StalenessBuffer(
            eta, per_step, start_step=run.start_step
        )
        # The producer runs ahead on its own copy of the data order; the trainer's copy (the one
        # checkpoints save) advances only as steps are consumed.
        ahead = copy.deepcopy(parts.order)
        launched: dict[int, list[int]] = {}
        ledger = StepLedger(run.dir.root / LEDGER, keep_until=run.start_step)
        behaviour = (
            BehaviourCorrection(cap=rl.loss.behaviour_cap, band=rl.loss.behaviour_band)
            if eta
            else None
        )
        loop = asyncio.get_running_loop()

        async def run_step(step: int) -> RolloutPhaseResult:
            indices = ahead.take(per_step)  # steps start in order
            launched[step] = indices
            return await collect(
                [parts.problems[i] for i in indices],
                step=step,
                seed=config.seed,
                samples=rl.rollouts_per_prompt,
                runner=parts.runner,
                scheduler=scheduler,
                grader=parts.resources.grader,
            )

        async def sync(step: int, parts: StageParts) -> None:
            run.reporter.phase("weight sync (engines finish the turns they run)")
            if ray_engines(engines) is not None:  # one sync for the whole group of actors
                async with gate.hold():
                    await sync_weights(parts.actor, engines, version=str(step))
                return

            async def one(index: int) -> None:
                async with gate.hold([index]):
                    await sync_weights(parts.actor, [engines[index]], version=str(step))

            await asyncio.gather(*(one(index) for index in range(len(engines))))

        producer = asyncio.create_task(produce(buffer, run_step, last_step=rl.steps))
        try:
            began = mark = loop.time()
            busy_mark = sum(gate.busy_s())
            for _ in range(run.start_step + 1, rl.steps + 1):
                run.reporter.phase(
                    f"waiting for rollouts (queue {buffer.queued_groups} groups, "
                    f"version {buffer.version})"
                )
                waited = loop.time()
                step, phase = await buffer.take()
                idle = loop.time() - waited
                queued = buffer.queued_groups
                generating = buffer.unconsumed - queued - per_step
                sandbox_metrics = self.check_sandbox(step, parts, parts.order.state_dict())
                indices = parts.order.take(per_step)
                if indices != launched.pop(step):
                    raise RuntimeError(f"step {step} trained on other groups than it generated")
                admitted = buffer.admitted_version(step)
                metrics = await self.learn(
                    step,
                    phase,
                    parts,
                    sync=sync,
                    behaviour=behaviour,
                    kept_metrics=functools.partial(
                        lag_metrics, version=step - 1, initial=run.start_step, max_staleness=eta
                    ),
                )
                metrics.update(sandbox_metrics)
                await buffer.consumed()
                now, busy = loop.time(), sum(gate.busy_s())
                metrics["time/step_s"] = now - mark
                metrics["engines/idle_fraction"] = 1 - (busy - busy_mark) / (
                    len(engines) * max(now - mark, 1e-9)
                )
                metrics["trainer/idle_s"] = idle
                metrics["time/elapsed_s"] = now - began
                metrics["async/queue_groups"] = float(queued)
                metrics["async/generating_groups"] = float(generating)
                metrics["async/admitted_version"] = float(admitted)
                mark, busy_mark = now, busy
                ledger.write(
                    {
                        "step": step,
                        "problems": [parts.problems[i].id for i in indices],
                        "admitted_version": admitted,
                        "trained_version": step - 1,
                    }
                )
                metrics.update(await parts.validate(step))
                run.after_step(step, rl.steps, metrics)
            await producer
        finally:
            # Normally done by now; after a failure its own error (if any) reached take().
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer
