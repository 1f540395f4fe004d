"""The trainer's side of the policy: the model, its optimizer and schedule, one update at a time.

The SFT and RL trainers drive an ``Actor`` through a small surface (log-probs of micro-batches,
an optimizer step over micro-batches with a caller's loss, the weights to publish, state to
checkpoint), so the data-parallel actor of a multi-GPU run plugs in without changing them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from rstar2_train.batching import MicroBatch, token_logprobs
from rstar2_train.config.schema import OptimizerConfig, ScheduleConfig
from rstar2_train.precision import MASTER_STATE, MasterWeights, Precision

LossFn = Callable[[int, MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]
"""``(micro-batch index, micro-batch, its log-probs) -> (loss to backpropagate, metrics)``.
Losses are normalised by the caller over the whole step, so they are summed here."""


class MetricSums:
    """A loss function's metrics gathered over micro-batches (and ranks): token-weighted means,
    except names ending in ``_max``, which keep the largest value seen."""

    def __init__(self, values: Mapping[str, float] | None = None) -> None:
        self.values: dict[str, float] = dict(values or {})

    def add(self, metrics: Mapping[str, float], tokens: int = 1) -> None:
        """One micro-batch's metrics (``tokens`` = its trained tokens), or with the default
        weight of 1, another ``MetricSums``' values."""
        for name, value in metrics.items():
            if name.endswith("_max"):
                self.values[name] = max(self.values.get(name, -math.inf), value)
            else:
                self.values[name] = self.values.get(name, 0.0) + value * tokens

    def means(self, tokens: int) -> dict[str, float]:
        """The metrics over ``tokens`` trained tokens in all."""
        if not tokens:
            return {}
        return {
            name: value if name.endswith("_max") else value / tokens
            for name, value in self.values.items()
        }


@dataclass(frozen=True)
class UpdateStats:
    """One optimizer step."""

    grad_norm: float
    lr: float
    skipped: bool
    """The gradient was not finite: no update was applied."""
    metrics: dict[str, float]
    """The loss function's metrics, weighted by each micro-batch's trained tokens."""


class TrainingActor(Protocol):
    """What the SFT and RL trainers drive: ``Actor`` in this process, or a ``DistributedActor``
    over data-parallel ranks (``rstar2_train.placement``)."""

    @property
    def device(self) -> torch.device:
        """Where the caller builds micro-batches and the tensors its loss functions use."""

    @property
    def lr(self) -> float: ...

    def logprobs(
        self, batches: Sequence[MicroBatch], *, temperature: float
    ) -> list[torch.Tensor]: ...

    def update(
        self, batches: Sequence[MicroBatch], loss_fn: LossFn, *, temperature: float = 1.0
    ) -> UpdateStats: ...

    def skip(self) -> None: ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def export_model(self) -> PreTrainedModel:
        """A Hugging Face model holding the current full weights (for checkpoints)."""

    def optimizer_state(self) -> dict[str, Any]: ...

    def load_optimizer_state(self, state: dict[str, Any], *, resume: bool) -> None: ...


def make_optimizer(
    parameters: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases), over the weights
    the trainer updates (its master weights when it keeps them)."""
    trainable = [p for p in parameters if p.requires_grad]
    implementation = config.implementation
    if implementation == "auto":
        on_gpu = bool(trainable) and all(p.device.type == "cuda" for p in trainable)
        implementation = "fused" if on_gpu else "foreach"
    return torch.optim.AdamW(
        [
            {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        fused=implementation == "fused",
        foreach=implementation == "foreach",
    )


def advance_schedule(schedule: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Step the schedule on a step without an optimizer step (every group was dropped)."""
    with warnings.catch_warnings():
        # torch warns when the schedule steps without an optimizer step; here that is meant.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        schedule.step()


def make_schedule(
    optimizer: torch.optim.Optimizer, config: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule over ``total_steps`` optimizer steps."""
    warmup = config.warmup(total_steps)
    schedule: torch.optim.lr_scheduler.LambdaLR
    if config.kind == "constant":
        schedule = get_constant_schedule_with_warmup(optimizer, warmup)
    elif config.kind == "linear":
        schedule = get_linear_schedule_with_warmup(  # type: ignore[no-untyped-call]
            optimizer, warmup, total_steps
        )
    else:
        schedule = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, warmup, total_steps, min_lr_rate=config.min_lr_ratio
        )
    return schedule


class Actor:
    """A model trained in this process (one device), under ``precision``: with master weights
    when it is mixed (``rstar2_train.precision``), the model itself computing in the compute
    dtype."""

    def __init__(
        self,
        model: PreTrainedModel,
        optimizer: OptimizerConfig,
        schedule: ScheduleConfig,
        *,
        total_steps: int,
        precision: Precision | None = None,
    ) -> None:
        self.model = model
        self.model.train()
        self._device = next(model.parameters()).device
        self.grad_clip = optimizer.grad_clip
        self.precision = precision or Precision(model.dtype, model.dtype)
        self.masters: MasterWeights | None = None
        if self.precision.mixed:
            self.masters = MasterWeights(model, self.precision)
            trained = self.masters.parameters()
        else:
            model.to(self.precision.compute)  # type: ignore[arg-type]  # transformers' stub
            trained = list(model.parameters())
        self.trained = trained
        self.optimizer = make_optimizer(trained, optimizer)
        self.schedule = make_schedule(self.optimizer, schedule, total_steps)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @torch.no_grad()
    def logprobs(self, batches: Sequence[MicroBatch], *, temperature: float) -> list[torch.Tensor]:
        """Log-probs of each micro-batch's targets under the current weights."""
        return [token_logprobs(self.model, batch, temperature=temperature) for batch in batches]

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)

    def update(
        self, batches: Sequence[MicroBatch], loss_fn: LossFn, *, temperature: float = 1.0
    ) -> UpdateStats:
        """Backpropagate ``loss_fn`` over every micro-batch, clip, and take one optimizer step."""
        self._zero_grad()
        sums = MetricSums()
        weight = 0
        for index, batch in enumerate(batches):
            logprobs = token_logprobs(self.model, batch, temperature=temperature)
            loss, metrics = loss_fn(index, batch, logprobs)
            loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
            weight += batch.tokens
            sums.add(metrics, batch.tokens)
        limit = self.grad_clip if self.grad_clip is not None else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.trained, limit))
        lr = self.lr
        skipped = not math.isfinite(norm)
        if skipped:
            self._zero_grad()
        else:
            self.optimizer.step()
            if self.masters is not None:
                self.masters.publish()
        self.schedule.step()
        return UpdateStats(grad_norm=norm, lr=lr, skipped=skipped, metrics=sums.means(weight))

    def skip(self) -> None:
        """A step with nothing to train on: the schedule still advances."""
        advance_schedule(self.schedule)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights by ``state_dict`` name (in the compute dtype), for the engines."""
        yield from self.model.state_dict().items()

    def export_model(self) -> PreTrainedModel:
        return self.model

    def optimizer_state(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict()}
        if self.masters is not None:
            state[MASTER_STATE] = self.masters.state_dict()
        return state

    def load_optimizer_state(self, state: dict[str, Any], *, resume: bool) -> None:
        """Restore the optimizer and, when saved, the master weights. Resuming this stage also
        restores the schedule position; continuing from a previous stage keeps only the moments
        and master weights (this stage's hyperparameters and schedule apply)."""
        if self.masters is not None and MASTER_STATE in state:
            self.masters.load_state_dict(state[MASTER_STATE])
        if resume:
            self.optimizer.load_state_dict(state["optimizer"])
            self.schedule.load_state_dict(state["schedule"])
            return
        settings = [
            {key: value for key, value in group.items() if key != "params"}
            for group in self.optimizer.param_groups
        ]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, own in zip(self.optimizer.param_groups, settings, strict=True):
            group.update(own)
