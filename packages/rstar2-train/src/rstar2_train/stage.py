"""What every stage does around its training loop: the run directory, where to start from,
the tokenizer and model, checkpoints, metrics and plots."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rstar2_data.jsonl import atomic_write_text
from rstar2_train.actor import TrainingActor
from rstar2_train.checkpoint import (
    TrainerState,
    list_checkpoints,
    load_optimizer_state,
    load_rng,
    prune,
    read_state,
    save_checkpoint,
    step_folder,
)
from rstar2_train.config.schema import StageConfig
from rstar2_train.data import DataOrder
from rstar2_train.devices import resolve_device
from rstar2_train.interrupt import StageInterrupted, StopSignals
from rstar2_train.memory import plan_stage_memory
from rstar2_train.metrics import MetricsLog, read_metrics
from rstar2_train.modeling import (
    build_model,
    load_tokenizer,
    resolve_attention,
    train_tokenizer,
)
from rstar2_train.plots import write_plots
from rstar2_train.precision import Precision
from rstar2_train.progress import LogReporter, Reporter
from rstar2_train.run_dir import RunDir
from rstar2_train.sources import check_stage_sources
from rstar2_train.startup import FirstStepClock
from rstar2_train.wandb_run import WandbRun

logger = logging.getLogger(__name__)


class StageRun:
    """One stage's run: prepared directory, starting point, and the shared bookkeeping."""

    def __init__(
        self,
        config: StageConfig,
        *,
        resume: bool = False,
        allow_changes: bool = False,
        reporter: Reporter | None = None,
    ) -> None:
        self.clock = FirstStepClock()
        self.signals = StopSignals()
        self.signals.install()
        try:
            self._prepare(config, resume=resume, allow_changes=allow_changes, reporter=reporter)
        except BaseException:
            self.signals.restore()
            self.clock.close()
            raise

    def _prepare(
        self, config: StageConfig, *, resume: bool, allow_changes: bool, reporter: Reporter | None
    ) -> None:
        self.dir = RunDir(config.output_dir)
        self.dir.prepare(config, resume=resume, allow_changes=allow_changes)
        # The config as given stays the run's identity (resume and the demo compare it); what
        # `auto` chose and what the memory plan changed on this machine are noted in
        # config.yaml as comments.
        config, choice = resolve_attention(config)
        self.config = config
        if choice is not None:
            self._note(f"model.attn_implementation auto: {choice.name} ({choice.reason})")
        if config.kind == "sft":
            self.plan_memory()
        self.reporter: Reporter = reporter or LogReporter()
        found = list_checkpoints(self.dir.checkpoints) if resume else []
        self.checkpoint: Path | None = found[-1] if found else None
        self.state: TrainerState | None = (
            read_state(self.checkpoint) if self.checkpoint is not None else None
        )
        self.start_step = self.state.step if self.state is not None else 0
        if self.checkpoint is None:
            # Before the data is built, so a wrong path fails in seconds.
            check_stage_sources(self.config)
        self._training: tuple[TrainingActor, PreTrainedTokenizerBase, DataOrder] | None = None
        if self.checkpoint is not None:
            logger.info("resuming %s from %s", config.name, self.checkpoint)
        elif resume:
            logger.info(
                "no checkpoint in %s yet: starting %s from the beginning",
                self.dir.root,
                config.name,
            )
        seed = config.seed
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.device = resolve_device(config.model.device)
        self.wandb: WandbRun | None = None
        if config.logging.wandb is not None:
            logged = [record.get("step", 0) for record in read_metrics(self.dir.metrics)]
            self.wandb = WandbRun(
                config.logging.wandb,
                config,
                self.dir.wandb,
                logged_until=max(logged) if logged else None,
            )
        self.metrics = MetricsLog(
            self.dir.metrics,
            keep_until=self.start_step,
            tensorboard=self.dir.tensorboard if config.logging.tensorboard else None,
            wandb=self.wandb,
        )

    def _note(self, note: str) -> None:
        """A comment at the end of the run's config.yaml."""
        atomic_write_text(self.dir.config, self.dir.config.read_text() + f"# {note}\n")

    def plan_memory(self, *, longest_prompt: Callable[[], int] | None = None) -> None:
        """The memory plan (``rstar2_train.memory``) applied to ``config``, and noted in
        config.yaml when it changed a setting. SFT stages plan as they start; an RL stage once
        it can tokenize its prompts (``longest_prompt()`` tokens at most), before its model is
        built."""
        self.config, plan = plan_stage_memory(self.config, longest_prompt=longest_prompt)
        if plan is not None and plan.changes:
            self._note(plan.describe())

    def tokenizer(self, training_texts: Callable[[], Iterable[str]]) -> PreTrainedTokenizerBase:
        """The checkpoint's tokenizer when resuming; else the configured (or trained) one."""
        config = self.config
        if self.checkpoint is not None:
            return load_tokenizer(str(self.checkpoint))
        if config.tokenizer.train is not None:
            logger.info("training a tokenizer (vocab %d)", config.tokenizer.train.vocab_size)
            return train_tokenizer(training_texts(), config.tokenizer.train)
        path = config.tokenizer.path or config.model.path
        assert path is not None  # the schema requires a tokenizer source
        return load_tokenizer(path, trust_remote_code=config.model.trust_remote_code)

    @property
    def precision(self) -> Precision:
        """The trainer's number formats (``rstar2_train.precision``)."""
        return Precision.of(self.config)

    def model(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
        """The policy at the starting point, on the trainer's device, in the dtype of the
        weights the trainer updates (the actor casts what computes)."""
        model_config = self.config.model
        if self.checkpoint is not None:
            model_config = model_config.model_copy(
                update={"path": str(self.checkpoint), "init": None}
            )
        with self.clock.model_build():
            model = build_model(
                model_config,
                tokenizer,
                seed=self.config.seed,
                dtype=self.precision.master,
            )
            model.to(self.device)  # type: ignore[arg-type]  # transformers' stub of .to is wrong
        return model

    def restore(
        self, actor: TrainingActor, tokenizer: PreTrainedTokenizerBase, order: DataOrder
    ) -> None:
        """Optimizer, schedule, data position and RNG of the checkpoint being resumed; or the
        previous stage's optimizer moments when the config asks for them. ``save`` writes
        these objects from now on."""
        self._training = (actor, tokenizer, order)
        if self.checkpoint is not None and self.state is not None:
            actor.load_optimizer_state(load_optimizer_state(self.checkpoint), resume=True)
            order.load_state_dict(self.state.data)
            load_rng(self.checkpoint)
        elif self.config.optimizer.load_state:
            source = self.config.model.path
            assert source is not None
            actor.load_optimizer_state(load_optimizer_state(Path(source)), resume=False)
            logger.info("optimizer moments continued from %s", source)

    def save(self, *, step: int, total_steps: int, final: bool = False) -> Path:
        """A step checkpoint (pruning old ones), or the stage's final weights, of the actor,
        tokenizer and data order given to ``restore``."""
        assert self._training is not None, "restore() first"
        actor, tokenizer, order = self._training
        state = TrainerState(
            stage=self.config.name,
            kind=self.config.kind,
            step=step,
            total_steps=total_steps,
            data=order.state_dict(),
            finished=final,
        )
        folder = self.dir.final if final else step_folder(self.dir.checkpoints, step)
        save_checkpoint(
            folder,
            model=actor.export_model(),
            tokenizer=tokenizer,
            optimizer_state=actor.optimizer_state(),
            state=state,
        )
        if not final:
            prune(self.dir.checkpoints, self.config.checkpoint.keep_last)
        logger.info("saved %s", folder)
        return folder

    def save_finished(self, step: int, total_steps: int) -> None:
        """A checkpoint of finished step ``step`` unless it has one: a stage that stops early
        keeps what it trained."""
        if step > self.start_step and not step_folder(self.dir.checkpoints, step).exists():
            self.save(step=step, total_steps=total_steps)

    def after_step(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        """Log the step and write a checkpoint when one is due; the first step of this process
        also records how long it took to get there (``startup/*``). After SIGINT or SIGTERM,
        the checkpoint is due now and ``StageInterrupted`` stops the stage."""
        metrics = {**metrics, **self.clock.metrics()}
        self.metrics.write(step, metrics)
        self.reporter.step(step, metrics)
        every = self.config.checkpoint.every_steps
        if step == total_steps or (every is not None and step % every == 0):
            self.save(step=step, total_steps=total_steps)
        signum = self.signals.received
        if signum is not None and step < total_steps:
            self.save_finished(step, total_steps)
            raise StageInterrupted(step, signum)

    def finish(self, total_steps: int) -> Path:
        """The final checkpoint and the plots."""
        final = self.save(step=total_steps, total_steps=total_steps, final=True)
        if self.config.logging.plots:
            self.dir.plots.mkdir(parents=True, exist_ok=True)
            write_plots(self.metrics.records, self.dir.plots)
        return final

    def close(self, *, failed: bool = False) -> None:
        self.signals.restore()
        self.clock.close()
        self.metrics.close(failed=failed)
        self.reporter.stop()
