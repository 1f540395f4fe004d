"""The GRPO-RoC stage loop.

One step: take ``prompts_per_step`` problems -> ``rollouts_per_prompt`` rollouts each through the
scheduler (tools in the sandbox, graded as each finishes) -> drop all-equal groups -> RoC keeps
G per prompt -> advantages -> the trainer recomputes log-probs -> clipped loss over micro-batches
-> optimizer step(s) -> new weights to every engine (their prefix caches reset) -> log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from rstar2_data import MathProblem
from rstar2_scheduler import RolloutRunner, RolloutScheduler, run_on_device
from rstar2_scheduler.protocol import ChatProtocol, Conversation
from rstar2_train.actor import TrainingActor
from rstar2_train.config.schema import RLConfig, StageConfig
from rstar2_train.data import DataOrder, load_rows
from rstar2_train.modeling import bootstrap_chat
from rstar2_train.placement.engines import COLOCATED_SLEEP_LEVEL, ray_engines, sync_weights
from rstar2_train.rl.report import rollout_metrics, sample_rows, write_samples
from rstar2_train.rl.resources import RolloutResources, rollout_resources, training_side
from rstar2_train.rl.rollouts import RolloutPhaseResult, ScoredRollout, collect, rollout_seed
from rstar2_train.rl.sandbox_health import GuardedSandbox
from rstar2_train.rl.selection import select
from rstar2_train.rl.update import BehaviourCorrection, policy_update, training_sequences
from rstar2_train.rl.validation import Validator
from rstar2_train.stage import StageRun

logger = logging.getLogger(__name__)


@dataclass
class StageParts:
    """What the loop of an RL stage works with, set up by ``RLTrainer.train``."""

    problems: list[MathProblem]
    order: DataOrder
    actor: TrainingActor
    runner: RolloutRunner
    resources: RolloutResources
    sandbox: GuardedSandbox
    pad: int
    validate: Callable[[int], Awaitable[dict[str, float]]]


class RLTrainer:
    """Runs an RL stage (``kind: rl``) in this process: the synchronous loop (one rollout phase,
    then the update, then the weight sync, per step). ``rl.max_staleness`` >= 1 runs
    ``AsyncRLTrainer`` (``rl/asynchronous.py``), which keeps this set-up and replaces the loop."""

    def __init__(self, run: StageRun) -> None:
        self.run = run
        self.config: StageConfig = run.config
        assert self.config.rl is not None
        self.rl: RLConfig = self.config.rl
        self.colocated = False

    def _prompt_texts(self, problems: list[MathProblem]) -> list[str]:
        training = self.config.tokenizer.train
        assert training is not None
        chat = bootstrap_chat(training)
        limit = training.samples or len(problems)
        return [
            chat.render(chat.initial_messages(p.problem), add_generation_prompt=True)
            for p in problems[:limit]
        ]

    async def train(self) -> Path:
        """Train for ``rl.steps`` steps; returns the final checkpoint."""
        run, config, rl = self.run, self.config, self.rl
        problems = load_rows(config.data.train, "math", run.dir.data)
        tokenizer = run.tokenizer(lambda: self._prompt_texts(problems))

        def longest_prompt() -> int:
            chat = ChatProtocol(tokenizer, config.chat)
            return max(
                len(Conversation(chat, chat.initial_messages(p.problem)).prompt_ids)
                for p in problems
            )

        run.plan_memory(longest_prompt=longest_prompt)
        self.config = config = run.config
        assert config.rl is not None
        self.rl = rl = config.rl
        model = run.model(tokenizer)
        order = DataOrder(len(problems), seed=config.seed, shuffle=config.data.shuffle)
        model_path = str(run.checkpoint) if run.checkpoint is not None else config.model.path
        validator = (
            Validator(
                rl.validation,
                config.rollout,
                seed=config.seed,
                total_steps=rl.steps,
                out_dir=run.dir.validation,
            )
            if rl.validation is not None
            else None
        )
        total = rl.steps * rl.ppo_mini_batches
        async with training_side(config, model, model_path=model_path, total_steps=total) as side:
            sandbox = GuardedSandbox(side.sandbox, rl.sandbox)
            async with rollout_resources(
                side.engines, sandbox, side.grader, check=sandbox.check
            ) as resources:
                actor = side.actor
                self.colocated = side.mode == "colocated"
                run.restore(actor, tokenizer, order)
                runner = RolloutRunner(tokenizer, resources.sandbox, config.rollout)
                pad = int(tokenizer.pad_token_id or 0)
                run.reporter.start(f"rl {config.name}", rl.steps, run.start_step)

                async def validate(step: int) -> dict[str, float]:
                    if validator is None or not validator.due(step):
                        return {}
                    run.reporter.phase("validation")
                    return await validator.run(
                        step,
                        resources=resources,
                        tokenizer=tokenizer,
                        chat=config.chat,
                        label=config.name,
                    )

                # A kill after the start's validation was logged must not log it twice.
                if run.start_step == 0 and not any(r["step"] == 0 for r in run.metrics.records):
                    initial = await validate(0)
                    if initial:
                        run.metrics.write(0, initial)
                await self.loop(
                    StageParts(problems, order, actor, runner, resources, sandbox, pad, validate)
                )
                # Inside: a distributed trainer's ranks hold the weights the final checkpoint needs.
                return run.finish(rl.steps)

    async def loop(self, parts: StageParts) -> None:
        """Steps ``start_step + 1 .. rl.steps``, each logged and checkpointed when due."""
        run, rl = self.run, self.rl
        scheduler = RolloutScheduler(parts.resources.engines, rl.scheduler)
        began = time.perf_counter()
        for step in range(run.start_step + 1, rl.steps + 1):
            position = parts.order.state_dict()
            problems = [parts.problems[i] for i in parts.order.take(rl.prompts_per_step)]
            started = time.perf_counter()
            phase = await collect(
                problems,
                step=step,
                seed=self.config.seed,
                samples=rl.rollouts_per_prompt,
                runner=parts.runner,
                scheduler=scheduler,
                grader=parts.resources.grader,
                on_progress=lambda done, total: run.reporter.phase(f"rollouts {done}/{total}"),
            )
            sandbox_metrics = self.check_sandbox(step, parts, position)
            metrics = await self.learn(step, phase, parts, sync=self._sync)
            metrics.update(sandbox_metrics)
            metrics["time/step_s"] = time.perf_counter() - started
            metrics["engines/idle_fraction"] = 1 - phase.metrics.busy_s / (
                len(parts.resources.engines) * metrics["time/step_s"]
            )
            metrics["trainer/idle_s"] = phase.rollout_s + phase.grading_tail_s
            metrics["time/elapsed_s"] = time.perf_counter() - began
            metrics.update(await parts.validate(step))
            run.after_step(step, rl.steps, metrics)

    def check_sandbox(
        self, step: int, parts: StageParts, position: dict[str, int]
    ) -> dict[str, float]:
        """The step's sandbox figures; a sandbox taken for down stops the stage before the step
        trains on its rollouts, after a checkpoint of the last finished step (the data order
        back at ``position``, where that step left it)."""
        metrics = parts.sandbox.step_metrics(step)
        if parts.sandbox.down is not None:
            parts.order.load_state_dict(position)
            self.run.save_finished(step - 1, self.rl.steps)
            parts.sandbox.raise_if_down(step)
        return metrics

    async def _sync(self, step: int, parts: StageParts) -> None:
        self.run.reporter.phase("weight sync")  # colocated: the engines wake with the sync
        await sync_weights(
            parts.actor, parts.resources.engines, version=str(step), wake=self.colocated
        )

    async def learn(
        self,
        step: int,
        phase: RolloutPhaseResult,
        parts: StageParts,
        *,
        sync: Callable[[int, StageParts], Awaitable[None]],
        behaviour: BehaviourCorrection | None = None,
        kept_metrics: Callable[[list[ScoredRollout]], dict[str, float]] | None = None,
    ) -> dict[str, float]:
        """Everything a step does with its finished rollouts: RoC selection, the update
        (``behaviour``: the decoupled objective's weights) and ``sync`` of the new weights.
        ``kept_metrics`` adds figures about the rollouts the update trains on."""
        rl, seed = self.rl, self.config.seed
        resources, actor = parts.resources, parts.actor
        group = ray_engines(resources.engines)
        if group is not None:
            group.check()  # engines lost mid-phase had their rollouts re-run on the others
        selection = select(phase.rollouts, rl.roc, seed=rollout_seed(seed, step, -1, -1))
        metrics = rollout_metrics(phase, selection)
        if kept_metrics is not None:
            metrics.update(kept_metrics([phase.rollouts[i] for i in selection.kept]))
        if self.config.logging.sample_rollouts:
            samples = write_samples(
                self.run.dir.samples / f"step-{step:06d}.md",
                step,
                phase.rollouts,
                self.config.logging.sample_rollouts,
            )
            if self.run.wandb is not None:
                self.run.wandb.log_rollouts(step, sample_rows(samples))
        self.run.reporter.phase("update")
        sequences = training_sequences(phase.rollouts, selection)
        if self.colocated:  # the update gets the accelerators the engines free
            level = COLOCATED_SLEEP_LEVEL[self.rl.engines.kind]
            await asyncio.gather(*(engine.sleep(level) for engine in resources.engines))
        updated = time.perf_counter()
        if sequences:
            metrics.update(
                await run_on_device(
                    str(actor.device),
                    policy_update,
                    actor,
                    sequences,
                    selection.advantages,
                    rl,
                    temperature=rl.rollout.temperature,
                    pad_id=parts.pad,
                    seed=rollout_seed(seed, step, -2, -2),
                    behaviour=behaviour,
                )
            )
        else:
            logger.warning("step %d: every group was dropped; no update", step)
            actor.skip()
        synced = time.perf_counter()
        await sync(step, parts)
        done = time.perf_counter()
        metrics["time/update_s"] = synced - updated
        metrics["time/sync_s"] = done - synced
        if group is not None:
            metrics["engines/lost"] = float(len(group.dead))
        metrics.update(resources.grader.metrics())
        metrics["actor/trained_tokens"] = float(sum(sum(s.mask) for s in sequences))
        return metrics
