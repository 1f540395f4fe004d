"""The trainer's one mixed-precision policy, on every path: weights the optimizer updates and
AdamW's moments in ``model.master_dtype`` (float32 by default), forward and backward passes in
``model.dtype`` (bf16 by default), gradients accumulated over micro-batches in the master dtype.

Pure bf16 training (bf16 weights and moments) loses every update smaller than half the
weight's rounding step (2^-9 to 2^-8 of its magnitude): at the paper's learning rate of 1e-6
most updates of a long RL run. Master weights keep them, at 4 + 4 bytes per parameter more than
pure bf16.

- Trainer ranks (FSDP2) get it from ``MixedPrecisionPolicy``: sharded master parameters,
  gathered in the compute dtype for each layer's forward and backward, gradients
  reduce-scattered in ``fsdp.reduce_dtype`` into master-dtype shards.
- A trainer in this process gets it from ``MasterWeights``: the model's own parameters become
  compute-dtype copies, the optimizer updates master copies, each parameter's gradient is
  added to its master's as soon as autograd has it (so at most one layer's compute-dtype
  gradients exist at a time), and the updated masters are copied back after each step.

Both compute the same thing, so one step on one rank equals one step in this process (a test
holds them to it). Checkpoints save the compute-dtype weights (what engines and users load) and,
in the optimizer state, the master weights, so a resumed run continues from them exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rstar2_train.devices import DTYPES, stage_placement

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rstar2_train.config.schema import StageConfig

MASTER_STATE = "master"
"""The optimizer-state key of the master weights (by parameter name), when they are kept."""


@dataclass(frozen=True)
class Precision:
    """Number formats of a trainer (see the module docstring)."""

    compute: torch.dtype
    """Forward and backward passes; the weights engines and checkpoints get."""
    master: torch.dtype
    """The weights the optimizer updates, its moments, accumulated gradients."""
    reduce: torch.dtype = torch.float32
    """Trainer ranks: the gradient reduce-scatter between ranks."""

    @classmethod
    def of(cls, config: StageConfig) -> Precision:
        """A stage's policy: ``model.dtype``, ``model.master_dtype`` and, on trainer ranks,
        ``fsdp.reduce_dtype``."""
        placement = stage_placement(config)
        reduce = placement.trainer.fsdp.reduce_dtype if placement is not None else "float32"
        model = config.model
        return cls(DTYPES[model.dtype], DTYPES[model.master_dtype], DTYPES[reduce])

    @property
    def mixed(self) -> bool:
        """Master weights are kept beside compute-dtype ones."""
        return self.master != self.compute

    def fsdp_policy(self) -> MixedPrecisionPolicy:
        """FSDP2's form of the policy (the sharded parameters are in the master dtype)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=self.reduce)

    def describe(self) -> str:
        def name(dtype: torch.dtype) -> str:
            return str(dtype).removeprefix("torch.")

        if not self.mixed:
            return f"{name(self.compute)} weights, moments and compute"
        return f"{name(self.master)} master weights and moments, {name(self.compute)} compute"


class MasterWeights:
    """Master copies of a model's trainable parameters (see the module docstring).

    Creating it turns the model's parameters into compute-dtype tensors (a parameter already in
    the master dtype hands its storage to its master, so nothing is copied twice); frozen
    parameters are cast too and get no master. Buffers (rotary frequencies) stay as they are.
    """

    def __init__(self, model: torch.nn.Module, precision: Precision) -> None:
        self.precision = precision
        self.names: list[str] = []
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        """``(the model's compute-dtype parameter, its master)``, in ``named_parameters``
        order."""
        for name, parameter in model.named_parameters():
            if not parameter.requires_grad:
                parameter.data = parameter.data.to(precision.compute)
                continue
            source = parameter.data
            if source.dtype != precision.master:
                source = source.to(precision.master)
            master = torch.nn.Parameter(source, requires_grad=True)
            parameter.data = source.to(precision.compute)
            hook = self._hook(master)
            parameter.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
            self.names.append(name)
            self.pairs.append((parameter, master))

    @staticmethod
    def _hook(master: torch.nn.Parameter) -> Callable[[torch.Tensor], None]:
        def accumulate(parameter: torch.Tensor) -> None:
            grad = parameter.grad
            assert grad is not None
            if master.grad is None:
                master.grad = grad.to(master.dtype)
            else:
                master.grad.add_(grad)
            parameter.grad = None

        return accumulate

    def parameters(self) -> list[torch.nn.Parameter]:
        """The masters, for the optimizer."""
        return [master for _, master in self.pairs]

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the masters into the model's compute-dtype parameters (after a step)."""
        for parameter, master in self.pairs:
            parameter.copy_(master)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The master weights by parameter name (on the CPU), for a checkpoint."""
        return {
            name: master.detach().cpu()
            for name, (_, master) in zip(self.names, self.pairs, strict=True)
        }

    @torch.no_grad()
    def load_state_dict(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Masters saved by ``state_dict``; the model's parameters follow them."""
        missing = [name for name in self.names if name not in weights]
        if missing:
            raise ValueError(f"the saved master weights lack {', '.join(missing[:3])}")
        for name, (_, master) in zip(self.names, self.pairs, strict=True):
            master.copy_(weights[name])
        self.publish()
