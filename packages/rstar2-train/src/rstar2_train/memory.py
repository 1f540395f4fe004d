"""Plan the trainer's memory before its first step, instead of learning it from an OOM.

The peak of a training step is estimated from the model's shape (parameters, layers, hidden
and MLP sizes, attention heads, vocabulary) and the settings that multiply it (weight and
optimizer-state dtypes, sharding over ranks, micro-batch tokens, activation checkpointing):

- weights, gradients and AdamW's two moments in the weights' dtype, divided over the ranks
  that shard them; under FSDP, the compute-dtype copies it gathers (the root's embeddings and
  head for the whole step, two decoder layers in flight);
- activations: per token and layer, what autograd keeps for a decoder layer (the norms' float32
  inputs, q/k/v and the attention output, the MLP's four intermediates) with a
  FlashAttention-style kernel that keeps no scores; with checkpointing only each layer's input,
  plus one layer recomputed in the backward pass;
- the fused LM head's chunk of logits and its float32 weight-gradient buffer, and a backward
  working set of one layer's activations.

The estimate is compared with what the device has free (times ``memory.usable_fraction``, for
fragmentation and kernel workspaces). When it does not fit, the plan shrinks micro-batch tokens
(by halves, not below ``memory.min_micro_batch_tokens`` and the longest sequence, which is never
split) without checkpointing, else turns activation checkpointing on; the decision is logged
with its numbers, and when nothing fits it fails in one line naming the settings to change.
It is an estimate: the figures it logged beside the peaks measured on a GPU are in the README.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from rstar2_train.config.schema import FSDPConfig, MemoryConfig, ModelConfig, StageConfig
from rstar2_train.devices import DTYPES, resolve_device, stage_placement

logger = logging.getLogger(__name__)

GIB = 2**30
FLOAT32 = 4
HEAD_CHUNK_LOGITS = 64 * 2**20
"""Logits per chunk of the fused LM head on an accelerator (``rstar2_algo.fused_head``)."""
HEAD_CHUNK_ROWS = 1024
"""Fewest rows per chunk of the fused LM head on an accelerator."""


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer's memory depends on."""

    parameters: int
    """Distinct parameters (a tied head counted once)."""
    root_parameters: int
    """Parameters outside the decoder layers (embeddings, head, final norm)."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, model: PreTrainedModel) -> ModelShape:
        """The shape of ``model`` (also sharded: FSDP's parameters count their full size)."""
        parameters = sum(p.numel() for p in model.parameters())
        config = model.config.get_text_config()
        layers = int(config.num_hidden_layers)
        in_layers = 0
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
                in_layers = sum(p.numel() for p in module.parameters())
                break
        return cls.from_config(config, parameters, parameters - in_layers)

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, parameters: int, root_parameters: int
    ) -> ModelShape:
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        return cls(
            parameters=parameters,
            root_parameters=root_parameters,
            layers=int(config.num_hidden_layers),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", 4 * hidden)),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            vocab=int(config.vocab_size),
        )

    def activation_bytes(self, compute: int) -> int:
        """Bytes autograd keeps per token and decoder layer, without checkpointing."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = 2 * h * (FLOAT32 + compute)  # input and post-attention RMSNorm
        qk_norms = (q + kv) * (FLOAT32 + compute)  # per-head q/k norms (Qwen3)
        attention = compute * (q + 2 * kv) + compute * q + FLOAT32 * self.heads  # q, k, v, out, lse
        mlp = 4 * compute * self.intermediate  # gate, act(gate), up, act(gate) * up
        return norms + qk_norms + attention + mlp


@dataclass(frozen=True)
class MemorySettings:
    """The trainer settings that set its memory, besides the model."""

    weight_bytes: int
    """Bytes per element of the weights the optimizer updates (its moments are the same)."""
    compute_bytes: int
    """Bytes per element of activations (and of FSDP's gathered parameters)."""
    micro_batch_tokens: int
    longest_sequence: int = 0
    """A sequence longer than the micro-batch budget gets a micro-batch of its own."""
    checkpointing: bool = False
    shards: int = 1
    """Ranks that shard weights, gradients and optimizer state (FSDP)."""
    gathered: bool = False
    """Parameters are gathered into compute-dtype copies for the forward pass (FSDP)."""

    @property
    def tokens(self) -> int:
        """Tokens in the largest micro-batch."""
        return max(self.micro_batch_tokens, self.longest_sequence)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of a training step's peak, by part."""

    weights: int
    gradients: int
    optimizer: int
    gathered: int
    activations: int
    head: int
    working: int

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.gathered
            + self.activations
            + self.head
            + self.working
        )

    def describe(self) -> str:
        parts = ("weights", "gradients", "optimizer", "gathered", "activations", "head")
        shown = [f"{name} {getattr(self, name) / GIB:.1f}" for name in parts if getattr(self, name)]
        return f"{self.total / GIB:.1f} GiB ({', '.join(shown)})"


def estimate_peak(shape: ModelShape, settings: MemorySettings) -> MemoryEstimate:
    """The estimated peak memory of one training step (see the module docstring)."""
    s = settings
    per_rank = -(-shape.parameters // s.shards)
    layer_parameters = (shape.parameters - shape.root_parameters) // max(shape.layers, 1)
    gathered = 0
    if s.gathered:
        gathered = s.compute_bytes * (shape.root_parameters + 2 * layer_parameters)
    per_token = shape.activation_bytes(s.compute_bytes)
    tokens = s.tokens
    if s.checkpointing:
        activations = shape.layers * tokens * shape.hidden * s.compute_bytes + tokens * per_token
    else:
        activations = shape.layers * tokens * per_token
    rows = max(HEAD_CHUNK_ROWS, HEAD_CHUNK_LOGITS // shape.vocab)
    head = min(rows, tokens) * shape.vocab * (s.compute_bytes + 2 * FLOAT32)
    if s.compute_bytes < FLOAT32:  # the head's weight gradient accumulates in float32
        head += shape.vocab * shape.hidden * FLOAT32
    return MemoryEstimate(
        weights=per_rank * s.weight_bytes,
        gradients=per_rank * s.weight_bytes + layer_parameters * s.compute_bytes,
        optimizer=2 * per_rank * s.weight_bytes,
        gathered=gathered,
        activations=activations,
        head=head,
        working=tokens * per_token,
    )


@dataclass(frozen=True)
class MemoryPlan:
    """The settings to train with, and why."""

    settings: MemorySettings
    estimate: MemoryEstimate
    budget: int
    """Bytes the estimate may fill."""
    changes: tuple[str, ...]
    """What the plan changed from the configured settings (empty: nothing)."""

    def describe(self) -> str:
        fits = f"estimated peak {self.estimate.describe()} of {self.budget / GIB:.1f} GiB usable"
        if not self.changes:
            return f"memory plan: {fits}; settings as configured"
        return f"memory plan: {'; '.join(self.changes)}: {fits}"


class MemoryPlanError(ValueError):
    """No setting within the configured bounds fits the device."""


def _candidates(
    settings: MemorySettings, floor: int, *, can_shrink: bool, can_checkpoint: bool
) -> list[MemorySettings]:
    """Settings to try, cheapest in speed first: as configured; smaller micro-batches without
    checkpointing (down to ``floor``); checkpointing at the configured size, then smaller."""
    sizes = [settings.micro_batch_tokens]
    if can_shrink:
        size = settings.micro_batch_tokens // 2
        while size >= floor and size >= settings.longest_sequence:
            sizes.append(size)
            size //= 2
    modes = [settings.checkpointing]
    if can_checkpoint and not settings.checkpointing:
        modes.append(True)
    return [
        replace(settings, micro_batch_tokens=size, checkpointing=mode)
        for mode in modes
        for size in sizes
    ]


def fsdp_settings(
    fsdp: FSDPConfig, model_dtype: torch.dtype, *, ranks: int, tokens: int, checkpointing: bool
) -> MemorySettings:
    """The memory settings of FSDP2 trainer ranks (``placement.ranks``): float32 master weights
    under mixed precision (``fsdp.param_dtype``), else the model's dtype throughout."""
    compute = DTYPES[fsdp.param_dtype] if fsdp.param_dtype is not None else model_dtype
    weights = torch.float32 if fsdp.param_dtype is not None else model_dtype
    return MemorySettings(
        weight_bytes=weights.itemsize,
        compute_bytes=compute.itemsize,
        micro_batch_tokens=tokens,
        checkpointing=checkpointing,
        shards=ranks,
        gathered=True,
    )


def plan_memory(
    shape: ModelShape,
    settings: MemorySettings,
    *,
    budget: int,
    min_micro_batch_tokens: int,
    can_shrink: bool,
    can_checkpoint: bool,
    settings_to_change: str,
) -> MemoryPlan:
    """The first of ``_candidates`` whose estimate fits ``budget`` bytes, logged; raises
    ``MemoryPlanError`` (one line, naming ``settings_to_change``) when none does."""
    for candidate in _candidates(
        settings, min_micro_batch_tokens, can_shrink=can_shrink, can_checkpoint=can_checkpoint
    ):
        estimate = estimate_peak(shape, candidate)
        if estimate.total <= budget:
            changes = []
            if candidate.micro_batch_tokens != settings.micro_batch_tokens:
                changes.append(
                    f"micro-batch tokens {settings.micro_batch_tokens} -> "
                    f"{candidate.micro_batch_tokens}"
                )
            if candidate.checkpointing != settings.checkpointing:
                changes.append("activation checkpointing on")
            if changes:
                configured = estimate_peak(shape, settings).total / GIB
                changes[-1] += f" (as configured: {configured:.1f} GiB)"
            plan = MemoryPlan(candidate, estimate, budget, tuple(changes))
            logger.info("%s", plan.describe())
            return plan
    least = estimate_peak(
        shape,
        replace(
            settings,
            micro_batch_tokens=min(settings.micro_batch_tokens, max(min_micro_batch_tokens, 1))
            if can_shrink
            else settings.micro_batch_tokens,
            checkpointing=settings.checkpointing or can_checkpoint,
        ),
    )
    raise MemoryPlanError(
        f"the trainer does not fit: it needs about {least.describe()} at best within the "
        f"configured bounds, and {budget / GIB:.1f} GiB are usable; change {settings_to_change}"
    )


def device_memory(device: torch.device, fraction: float) -> tuple[int, int] | None:
    """``(usable, total)`` bytes of ``device`` for this process: usable is what is free plus
    what its allocator already holds, times ``fraction``; None off CUDA (nothing to plan)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int((free + torch.cuda.memory_reserved(device)) * fraction), int(total)


def meta_shape(config: ModelConfig, vocab: int | None) -> ModelShape:
    """The shape of the model ``config`` describes, built on the meta device (no memory, no
    weights read); ``vocab`` replaces the vocabulary of a new model (its tokenizer's size)."""
    if config.path is not None:
        model_config = AutoConfig.from_pretrained(
            config.path, trust_remote_code=config.trust_remote_code
        )
    else:
        assert config.init is not None
        import transformers

        model_class = getattr(transformers, config.init.architecture)
        settings = {**config.init.config, "vocab_size": vocab or config.init.config["vocab_size"]}
        model_config = model_class.config_class(**settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            model_config, trust_remote_code=config.trust_remote_code
        )
    return ModelShape.of(model)


def engines_beside(config: StageConfig, shape: ModelShape, total: int) -> int:
    """Bytes that in-process RL engines on the trainer's device hold through the update:
    transformers engines their copy of the weights and KV budget, vLLM its
    ``gpu_memory_utilization`` share of the device."""
    rl = config.rl
    if rl is None or resolve_device(rl.engines.device) != resolve_device(config.model.device):
        return 0
    if rl.engines.kind == "vllm":
        return int(float(rl.engines.vllm.get("gpu_memory_utilization", 0.9)) * total)
    dtype = DTYPES[config.model.dtype].itemsize
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype
    per_engine = shape.parameters * dtype + rl.engines.kv_budget_tokens * kv_per_token
    return rl.engines.count * per_engine


def plan_stage_memory(config: StageConfig) -> tuple[StageConfig, MemoryPlan | None]:
    """For a stage that trains in this process on a CUDA device (``memory.plan``): its memory
    plan, and the config with the plan's micro-batch tokens and activation checkpointing
    (``model.gradient_checkpointing``). Other stages are returned as they are (Ray trainer
    ranks plan on their own devices, at their first step)."""
    memory: MemoryConfig = config.memory
    device = resolve_device(config.model.device)
    if not memory.plan or stage_placement(config) is not None:
        return config, None
    found = device_memory(device, memory.usable_fraction)
    if found is None:
        return config, None
    usable, total = found
    section = config.sft if config.sft is not None else config.rl
    assert section is not None
    train = config.tokenizer.train
    shape = meta_shape(config.model, train.vocab_size if train is not None else None)
    beside = engines_beside(config, shape, total)
    longest = (
        config.sft.max_seq_len if config.sft is not None else config.rollout.max_response_tokens
    )
    dtype = DTYPES[config.model.dtype].itemsize
    shared_prefix = config.rl is not None and config.rl.shared_prefix
    plan = plan_memory(
        shape,
        MemorySettings(
            weight_bytes=dtype,
            compute_bytes=dtype,
            micro_batch_tokens=section.micro_batch_tokens,
            longest_sequence=longest,
            checkpointing=config.model.gradient_checkpointing,
        ),
        budget=usable - beside,
        min_micro_batch_tokens=memory.min_micro_batch_tokens,
        can_shrink=True,
        can_checkpoint=not shared_prefix,
        settings_to_change=f"{config.kind}.micro_batch_tokens or memory.min_micro_batch_tokens, "
        "model.gradient_checkpointing"
        + (" (with rl.shared_prefix=false)" if shared_prefix else "")
        + ", model.dtype, or shard the trainer over Ray ranks (placement)",
    )
    if beside:
        logger.info("memory plan: %.1f GiB held by the engines beside the trainer", beside / GIB)
    section = section.model_copy(update={"micro_batch_tokens": plan.settings.micro_batch_tokens})
    model = config.model.model_copy(update={"gradient_checkpointing": plan.settings.checkpointing})
    return config.model_copy(update={config.kind: section, "model": model}), plan
