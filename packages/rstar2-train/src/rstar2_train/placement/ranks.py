"""One data-parallel trainer rank, run inside a Ray actor: its FSDP2 shard of the policy and the
optimizer over that shard.

Every method that touches the model is a collective: the driver calls it on all ranks at once,
and each rank runs the same number of forward (and backward) passes, padding with passes that
contribute nothing when it has fewer micro-batches than another rank.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from transformers import PreTrainedModel

from rstar2_train.actor import (
    LossFn,
    MetricSums,
    advance_schedule,
    make_optimizer,
    make_schedule,
)
from rstar2_train.batching import MicroBatch, token_logprobs
from rstar2_train.config.schema import (
    FSDPConfig,
    MemoryConfig,
    OptimizerConfig,
    ScheduleConfig,
)
from rstar2_train.memory import ModelShape, device_memory, memory_settings, plan_memory
from rstar2_train.precision import MASTER_STATE, Precision
from rstar2_train.startup import FirstStepClock

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _checkpoint(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@dataclass(frozen=True)
class RankSetup:
    """What every rank is told at start-up."""

    world: int
    master_addr: str
    master_port: int
    backend: str
    fsdp: FSDPConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    total_steps: int
    precision: Precision
    memory: MemoryConfig = field(default_factory=MemoryConfig)


@dataclass(frozen=True)
class RankUpdate:
    """One rank's share of an optimizer step."""

    grad_norm: float
    lr: float
    skipped: bool
    metric_sums: dict[str, float]
    """The loss function's metrics over this rank's micro-batches (``MetricSums.values``)."""
    tokens: int
    """All ranks' trained tokens (all-reduced)."""
    startup: dict[str, float] = field(default_factory=dict)
    """The first update only: how long this rank took to its first optimizer step
    (``FirstStepClock``'s ``startup/*`` figures, from the start of ``setup``)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class TrainerRank:
    """Rank ``rank`` of the data-parallel trainer (the body of a Ray actor)."""

    def __init__(self, rank: int, threads: int) -> None:
        self.rank = rank
        torch.set_num_threads(max(1, threads))
        self.model: PreTrainedModel | None = None
        self.clock: FirstStepClock | None = None

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group's rendezvous."""
        import ray

        host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return host, free_port()

    def setup(self, setup: RankSetup, model: PreTrainedModel) -> None:
        """Join the process group and shard ``model`` (a full copy) over it."""
        self.clock = clock = FirstStepClock()
        with clock.model_build():
            self._setup(setup, model)

    def _setup(self, setup: RankSetup, model: PreTrainedModel) -> None:
        os.environ["MASTER_ADDR"] = setup.master_addr
        os.environ["MASTER_PORT"] = str(setup.master_port)
        cuda = torch.cuda.is_available() and setup.backend == "nccl"
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group(setup.backend, rank=self.rank, world_size=setup.world)
        mesh = init_device_mesh(self.device.type, (setup.world,))
        fsdp = setup.fsdp
        precision = setup.precision
        # The sharded parameters are the master weights; FSDP gathers them in the compute dtype.
        model.to(precision.master)  # type: ignore[arg-type]  # transformers' stub of .to is wrong
        policy = precision.fsdp_policy()
        if fsdp.activation_checkpointing:
            _checkpoint(model)
        model.to(self.device)  # type: ignore[arg-type]  # transformers' stub of .to is wrong
        layer_types = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in layer_types:
                fully_shard(
                    module,
                    mesh=mesh,
                    mp_policy=policy,
                    reshard_after_forward=fsdp.reshard_after_forward,
                )
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        assert isinstance(model, FSDPModule)
        self.world = setup.world
        self.precision = precision
        self.memory = setup.memory
        self.optimizer_implementation = setup.optimizer.implementation
        self.planned_tokens = 0
        model.train()
        self.model = model
        self.grad_clip = setup.optimizer.grad_clip
        self.optimizer = make_optimizer(model.parameters(), setup.optimizer)
        self.schedule = make_schedule(self.optimizer, setup.schedule, setup.total_steps)

    def _model(self) -> PreTrainedModel:
        assert self.model is not None, "setup() first"
        return self.model

    def _plan_memory(self, batches: Sequence[MicroBatch]) -> None:
        """Before the first pass over micro-batches this large: the memory plan for them on the
        ranks' GPUs (``rstar2_train.memory``), turning activation checkpointing on when they
        would not fit without it; ``MemoryPlanError`` when nothing fits. Micro-batches are
        built by the driver, so here the plan cannot shrink them. A collective: every rank
        plans with the smallest budget of any, so all decide alike."""
        tokens = max(
            b.input_ids.numel() + (0 if b.prefix_ids is None else b.prefix_ids.numel())
            for b in batches
        )
        if tokens <= self.planned_tokens or not self.memory.plan:
            return
        found = device_memory(self.device, self.memory.usable_fraction)
        if found is None:
            return
        self.planned_tokens = tokens
        least = torch.tensor([found[0]], dtype=torch.int64, device=self.device)
        dist.all_reduce(least, op=dist.ReduceOp.MIN)
        model = self._model()
        checkpointing = bool(model.is_gradient_checkpointing)
        shared_prefix = any(b.prefix_ids is not None for b in batches)
        plan = plan_memory(
            ModelShape.of(model),
            memory_settings(
                self.precision,
                micro_batch_tokens=tokens,
                attention=model.config._attn_implementation,
                device=self.device,
                packed=any(b.documents is not None for b in batches),
                checkpointing=checkpointing,
                ranks=self.world,
                optimizer=self.optimizer_implementation,
            ),
            budget=int(least.item()),
            min_micro_batch_tokens=self.memory.min_micro_batch_tokens,
            can_shrink=False,
            can_checkpoint=not shared_prefix,
            settings_to_change="rl.micro_batch_tokens, placement.trainer.fsdp.activation_"
            "checkpointing"
            + (" (with rl.shared_prefix=false)" if shared_prefix else "")
            + ", placement.trainer.ranks (more ranks shard more), model.dtype or "
            "model.master_dtype",
        )
        if plan.settings.checkpointing and not checkpointing:
            _checkpoint(model)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @torch.no_grad()
    def logprobs(
        self, batches: Sequence[MicroBatch], own: list[int], passes: int, temperature: float
    ) -> dict[int, torch.Tensor]:
        """Log-probs of micro-batches ``own`` (on the callers' device), in ``passes`` forwards."""
        self._plan_memory(batches)
        model, out = self._model(), {}
        for step in range(passes):
            index = own[step] if step < len(own) else None
            batch = batches[index if index is not None else 0]
            logprobs = token_logprobs(model, batch.to(self.device), temperature=temperature)
            if index is not None:
                out[index] = logprobs.to(batch.mask.device)
        return out

    def update(
        self,
        batches: Sequence[MicroBatch],
        loss_fn: LossFn,
        own: list[int],
        passes: int,
        temperature: float,
    ) -> RankUpdate:
        """Backpropagate ``loss_fn`` over micro-batches ``own``, reduce, clip, step."""
        self._plan_memory(batches)
        model = self._model()
        self.optimizer.zero_grad(set_to_none=True)
        sums = MetricSums()
        tokens = 0
        for step in range(passes):
            index = own[step] if step < len(own) else None
            batch = batches[index if index is not None else 0]
            logprobs = token_logprobs(model, batch.to(self.device), temperature=temperature)
            if index is None:
                # Padding pass: the same collectives as a real one, no contribution.
                loss = logprobs.sum() * 0.0
            else:
                # The loss function runs where the caller built its tensors; autograd carries
                # the gradient back to this rank's device.
                loss, metrics = loss_fn(index, batch, logprobs.to(batch.mask.device))
                tokens += batch.tokens
                sums.add(metrics, batch.tokens)
            # Losses come normalised by the whole step's token count, so the gradients of the
            # ranks must add up; FSDP averages them (gloo has no pre-scaled sum).
            (loss * self.world).backward()  # type: ignore[no-untyped-call]  # untyped in torch
        limit = self.grad_clip if self.grad_clip is not None else math.inf
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
        full = total.full_tensor() if hasattr(total, "full_tensor") else total
        norm = float(full)
        lr = self.lr()
        skipped = not math.isfinite(norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        self.schedule.step()
        count = torch.tensor([tokens], dtype=torch.float64, device=self.device)
        dist.all_reduce(count)
        startup = self.clock.metrics() if self.clock is not None and not skipped else {}
        return RankUpdate(norm, lr, skipped, sums.values, int(count.item()), startup)

    def skip(self) -> None:
        advance_schedule(self.schedule)

    def full_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The full weights on rank 0, empty on the others (a collective): gathered from every
        shard one tensor at a time and, with ``dtype``, cast on the device before they leave it
        (engines and checkpoints get the compute dtype: half the bytes of float32 masters
        through host memory and the object store)."""
        from torch.distributed.tensor import DTensor

        model = self._model()
        # A tied head is the embedding's parameter under a second name: gathered once.
        first: dict[int, str] = {}
        alias = {
            name: first.setdefault(id(parameter), name)
            for name, parameter in model.named_parameters(remove_duplicate=False)
        }
        weights: dict[str, torch.Tensor] = {}
        gathered: dict[str, torch.Tensor] = {}
        for name, tensor in model.state_dict().items():
            full = gathered.get(alias.get(name, name))
            if full is None:
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()
                if dtype is not None and full.is_floating_point():
                    full = full.to(dtype)
                if self.rank == 0:
                    full = full.cpu()
                gathered[alias.get(name, name)] = full
            if self.rank == 0:
                weights[name] = full
        return weights

    def weight_buckets(self, bucket_bytes: int) -> list[Any]:
        """The full weights in the compute dtype as Ray object refs of ``bucket_bytes`` each
        (rank 0; [] on others)."""
        import ray

        weights = self.full_weights(self.precision.compute)
        refs: list[Any] = []
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in weights.items():
            bucket[name] = tensor
            size += tensor.numel() * tensor.element_size()
            if size >= bucket_bytes:
                refs.append(ray.put(bucket))
                bucket, size = {}, 0
        if bucket:
            refs.append(ray.put(bucket))
        return refs

    def _order(self) -> list[str]:
        """Parameter names in the optimizer's order (the index keys of its state_dict)."""
        names = {id(p): name for name, p in self._model().named_parameters()}
        return [names[id(p)] for group in self.optimizer.param_groups for p in group["params"]]

    def optimizer_state(self) -> dict[str, Any] | None:
        """The full optimizer state in ``torch.optim`` layout (keyed by parameter index, as a
        single-process ``Actor`` saves it), on rank 0; None on the others."""
        full: Any = get_optimizer_state_dict(self._model(), self.optimizer, options=FULL)
        masters = self._master_weights()
        if self.rank != 0:
            return None
        order = self._order()
        state = {i: full["state"][name] for i, name in enumerate(order) if name in full["state"]}
        groups, start = [], 0
        for group in self.optimizer.param_groups:
            settings = {key: value for key, value in group.items() if key != "params"}
            groups.append({**settings, "params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        saved: dict[str, Any] = {
            "optimizer": {"state": state, "param_groups": groups},
            "schedule": self.schedule.state_dict(),
        }
        if masters is not None:
            saved[MASTER_STATE] = masters
        return saved

    def _master_weights(self) -> dict[str, torch.Tensor] | None:
        """The full master weights by parameter name on rank 0 (a collective), when the
        precision policy keeps them apart from the compute-dtype ones; else None."""
        if not self.precision.mixed:
            return None
        names = [name for name, _ in self._model().named_parameters()]
        weights = self.full_weights()
        return {name: weights[name] for name in names} if weights else None

    def load_optimizer_state(self, state: dict[str, Any], *, resume: bool) -> None:
        """Shard a full optimizer state (from any number of ranks) onto this rank."""
        order = self._order()
        saved = state["optimizer"]
        groups = []
        for group, own in zip(saved["param_groups"], self.optimizer.param_groups, strict=True):
            settings = {key: value for key, value in group.items() if key != "params"}
            if not resume:
                settings = {key: value for key, value in own.items() if key != "params"}
            groups.append({**settings, "params": [order[i] for i in group["params"]]})
        named: Any = {
            "state": {order[int(i)]: value for i, value in saved["state"].items()},
            "param_groups": groups,
        }
        set_optimizer_state_dict(
            self._model(),
            self.optimizer,
            optim_state_dict=named,
            options=StateDictOptions(full_state_dict=True),
        )
        if self.precision.mixed and MASTER_STATE in state:
            # Tied weights are saved once, under their first name.
            set_model_state_dict(
                self._model(),
                state[MASTER_STATE],
                options=StateDictOptions(full_state_dict=True, strict=False),
            )
        if resume:
            self.schedule.load_state_dict(state["schedule"])

    def close(self) -> None:
        if self.clock is not None:
            self.clock.close()
        if dist.is_initialized():
            dist.destroy_process_group()
