"""Plan the trainer's memory before its first step, instead of learning it from an OOM.

The peak of a training step is estimated from the model's shape (parameters, layers, hidden
and MLP sizes, attention heads, vocabulary) and the settings that multiply it (the precision
policy of ``rstar2_train.precision``, sharding over ranks, micro-batch tokens, activation
checkpointing, the attention kernel). A step's memory peaks in one of two phases:

- the backward pass: the weights the optimizer updates, their gradients and AdamW's two
  moments (divided over the ranks that shard them); the compute-dtype copies of the weights
  (a trainer in this process keeps all of them beside its master weights; FSDP gathers the
  root's embeddings and head for the step and two decoder layers at a time); the
  compute-dtype gradients not yet added to the masters (the root's, held until the embedding's
  backward, and one layer's); what autograd keeps for the backward pass (``activation_bytes``
  per token and decoder layer, counted with saved-tensor hooks in the tests, or each layer's
  input alone under checkpointing, plus the final norm and the hidden states the fused LM
  head keeps); and the larger of the fused head's backward (one chunk of logits and
  probabilities, the float32 weight-gradient accumulator) and one layer's backward (the
  layer recomputed under checkpointing, else its gradient working set);
- the optimizer step: the same weights and states, plus torch's multi-tensor (``foreach``)
  AdamW's temporary of one master-dtype copy of the weights (the fused kernel has none).

The estimate is compared with what the device has free (times ``memory.usable_fraction``, for
fragmentation and kernel workspaces). When it does not fit, the plan shrinks micro-batch tokens
(by halves, not below ``memory.min_micro_batch_tokens`` and the longest sequence, which is never
split) without checkpointing, else turns activation checkpointing on; the decision is logged
with its numbers, and when nothing fits it fails in one line naming the settings to change.
It is an estimate: the figures it logged beside the peaks measured on a GPU are in the README.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from rstar2_train.attention import VARLEN_ATTENTION, varlen_takes_gqa
from rstar2_train.config.schema import MemoryConfig, ModelConfig, StageConfig
from rstar2_train.devices import DTYPES, resolve_device, stage_placement
from rstar2_train.precision import Precision

logger = logging.getLogger(__name__)

GIB = 2**30
FLOAT32 = 4
INT64 = 8
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
    qk_norm: bool = False
    """Per-head RMSNorms on queries and keys (Qwen3)."""

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
        qk_norm = any(name.endswith(".q_norm") for name, _ in model.named_modules())
        return cls.from_config(config, parameters, parameters - in_layers, qk_norm=qk_norm)

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig,
        parameters: int,
        root_parameters: int,
        *,
        qk_norm: bool = False,
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
            qk_norm=qk_norm,
        )

    @property
    def layer_parameters(self) -> int:
        return (self.parameters - self.root_parameters) // max(self.layers, 1)

    def activation_bytes(self, compute: int, *, kv_repeated: bool = False) -> int:
        """Bytes autograd keeps per token and decoder layer, without checkpointing, with an
        attention kernel that keeps no scores (FlashAttention and torch's other fused kernels):

        - each RMSNorm (before attention, before the MLP) its float32 input, the normalised
          input (for its weight's gradient) and 1/rms; its output is the next projections'
          saved input;
        - Qwen3's per-head query and key norms the same, per head (their outputs go through
          the rotary embedding, whose backward needs only cos and sin);
        - attention its query, key, value, output and float32 log-sum-exp; keys and values
          are repeated to every query head when the kernel cannot read them grouped
          (``kv_repeated``);
        - the MLP its gate, activation, up projection and their product.
        """
        h, q = self.hidden, self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attended_kv = q if kv_repeated else kv
        norms = 2 * (h * (FLOAT32 + 2 * compute) + FLOAT32)
        qk_norms = 0
        if self.qk_norm:
            qk_norms = (q + kv) * (FLOAT32 + compute) + FLOAT32 * (self.heads + self.kv_heads)
        attention = compute * (2 * q + 2 * attended_kv) + FLOAT32 * self.heads
        mlp = 4 * compute * self.intermediate
        return norms + qk_norms + attention + mlp

    def root_activation_bytes(self, compute: int) -> int:
        """Bytes autograd keeps per token outside the decoder layers: the final norm's (its
        float32 input, 1/rms, the normalised input and its output, which the fused LM head
        keeps for its backward pass), the rotary tables every layer reads (cos and sin), and
        the integer token ids, labels and positions."""
        rotary = 2 * self.head_dim * compute
        return self.hidden * (FLOAT32 + 2 * compute) + FLOAT32 + rotary + 3 * INT64


@dataclass(frozen=True)
class MemorySettings:
    """The trainer settings that set its memory, besides the model."""

    master_bytes: int
    """Bytes per element of the weights the optimizer updates, its moments and accumulated
    gradients."""
    compute_bytes: int
    """Bytes per element of activations and of the compute-dtype weights."""
    micro_batch_tokens: int
    longest_sequence: int = 0
    """A sequence longer than the micro-batch budget gets a micro-batch of its own."""
    checkpointing: bool = False
    shards: int = 1
    """Ranks that shard weights, gradients and optimizer state (FSDP)."""
    fsdp: bool = False
    """FSDP2 ranks (parameters gathered a layer at a time); else a model in one process."""
    kv_repeated: bool = False
    """The attention kernel keeps keys and values repeated to every query head."""
    mask: Literal["none", "packed", "padded"] = "none"
    """Attention through a dense mask that every layer keeps (``sdpa`` over packed rows: a
    micro-batch's tokens per token; over padded rows: a row's width per token)."""
    foreach_step: bool = False
    """The optimizer step is torch's multi-tensor AdamW (a temporary copy of the weights)."""

    @property
    def tokens(self) -> int:
        """Tokens in the largest micro-batch."""
        return max(self.micro_batch_tokens, self.longest_sequence)

    @property
    def mixed(self) -> bool:
        return self.master_bytes != self.compute_bytes

    @property
    def mask_columns(self) -> int:
        if self.mask == "packed":
            return self.tokens
        if self.mask == "padded":
            return self.longest_sequence or self.tokens
        return 0


def memory_settings(
    precision: Precision,
    *,
    micro_batch_tokens: int,
    attention: str,
    device: torch.device,
    packed: bool,
    longest_sequence: int = 0,
    checkpointing: bool = False,
    ranks: int | None = None,
    optimizer: str = "auto",
) -> MemorySettings:
    """The settings of a trainer in this process (``ranks`` None) or of FSDP2 trainer ranks,
    from its precision policy, attention kernel and AdamW implementation."""
    gpu = device.type == "cuda"
    mask: Literal["none", "packed", "padded"] = "none"
    if attention == VARLEN_ATTENTION:
        # On CUDA torch's kernel; elsewhere the reference kernel, which repeats them.
        kv_repeated = not (gpu and varlen_takes_gqa())
    else:
        # transformers' sdpa reads grouped keys and values only when there is no mask; packed
        # rows and padded rows of unequal lengths have one.
        kv_repeated = True
        mask = "packed" if packed else "padded"
    foreach = optimizer == "foreach" or (optimizer == "auto" and not gpu)
    return MemorySettings(
        master_bytes=precision.master.itemsize,
        compute_bytes=precision.compute.itemsize,
        micro_batch_tokens=micro_batch_tokens,
        longest_sequence=longest_sequence,
        checkpointing=checkpointing,
        shards=ranks or 1,
        fsdp=ranks is not None,
        kv_repeated=kv_repeated,
        mask=mask,
        foreach_step=foreach,
    )


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of a training step's peak, by part (see the module docstring)."""

    weights: int
    """The weights the optimizer updates (this rank's shard)."""
    compute_weights: int
    """Compute-dtype copies of the weights (all of them in one process; FSDP's gathered)."""
    gradients: int
    """Accumulated gradients, and compute-dtype gradients not yet accumulated."""
    optimizer: int
    activations: int
    """What autograd keeps for the backward pass, at its start."""
    backward: int
    """The larger of the fused head's backward and one layer's."""
    step: int
    """The optimizer step's temporaries."""

    @property
    def states(self) -> int:
        return self.weights + self.compute_weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.states + max(self.activations + self.backward, self.step)

    def describe(self) -> str:
        parts = ("weights", "compute_weights", "gradients", "optimizer", "activations")
        shown = [
            f"{name.replace('_', ' ')} {getattr(self, name) / GIB:.1f}"
            for name in parts
            if getattr(self, name)
        ]
        return f"{self.total / GIB:.1f} GiB ({', '.join(shown)})"


def head_backward_bytes(shape: ModelShape, settings: MemorySettings) -> int:
    """The fused LM head's backward pass (``rstar2_algo.fused_head``): a chunk of logits in the
    compute dtype and their float32 probabilities and gradient (in place), and, for a
    low-precision head, the float32 weight-gradient accumulator beside its final cast."""
    rows = max(HEAD_CHUNK_ROWS, HEAD_CHUNK_LOGITS // shape.vocab)
    chunk = min(rows, settings.tokens) * shape.vocab * (settings.compute_bytes + FLOAT32)
    head = shape.vocab * shape.hidden
    if settings.compute_bytes < FLOAT32:
        return head * FLOAT32 + max(chunk, head * settings.compute_bytes)
    return chunk


def estimate_peak(shape: ModelShape, settings: MemorySettings) -> MemoryEstimate:
    """The estimated peak memory of one training step (see the module docstring)."""
    s = settings
    compute, master = s.compute_bytes, s.master_bytes
    per_rank = -(-shape.parameters // s.shards)
    layer = shape.layer_parameters
    if s.fsdp:
        compute_weights = compute * (shape.root_parameters + 2 * layer) if s.mixed else 0
        # The gathered root and layer gradients before their reduce-scatter (unsharded).
        pending = compute * (shape.root_parameters + layer)
        gradients = per_rank * master + pending
    elif s.mixed:
        compute_weights = compute * shape.parameters
        pending = compute * (shape.root_parameters + layer)
        gradients = shape.parameters * master + pending
    else:
        compute_weights = 0
        gradients = shape.parameters * compute
    tokens = s.tokens
    per_token = shape.activation_bytes(compute, kv_repeated=s.kv_repeated)
    per_token += s.mask_columns * compute
    root = tokens * shape.root_activation_bytes(compute)
    if s.checkpointing:
        activations = shape.layers * tokens * shape.hidden * compute + root
    else:
        activations = shape.layers * tokens * per_token + root
    # One layer's backward: the layer recomputed under checkpointing, else a gradient working
    # set bounded by the activations the layer kept.
    layer_backward = tokens * per_token
    return MemoryEstimate(
        weights=per_rank * master,
        compute_weights=compute_weights,
        gradients=gradients,
        optimizer=2 * per_rank * master,
        activations=activations,
        backward=max(head_backward_bytes(shape, s), layer_backward),
        step=per_rank * master if s.foreach_step else 0,
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


def plan_stage_memory(
    config: StageConfig, *, longest_prompt: Callable[[], int] | None = None
) -> tuple[StageConfig, MemoryPlan | None]:
    """For a stage that trains in this process on a CUDA device (``memory.plan``): its memory
    plan, and the config with the plan's micro-batch tokens and activation checkpointing
    (``model.gradient_checkpointing``). An RL stage's longest sequence is its longest prompt
    (``longest_prompt()`` tokens, asked for only when there is a plan to make) and the response
    budget. Other stages are returned as they are (Ray trainer ranks plan on their own devices,
    at their first step)."""
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
        config.sft.max_seq_len
        if config.sft is not None
        else (longest_prompt() if longest_prompt else 0) + config.rollout.max_response_tokens
    )
    shared_prefix = config.rl is not None and config.rl.shared_prefix
    plan = plan_memory(
        shape,
        memory_settings(
            Precision.of(config),
            micro_batch_tokens=section.micro_batch_tokens,
            attention=config.model.attn_implementation,
            device=device,
            packed=section.packing,
            longest_sequence=longest,
            checkpointing=config.model.gradient_checkpointing,
            optimizer=config.optimizer.implementation,
        ),
        budget=usable - beside,
        min_micro_batch_tokens=memory.min_micro_batch_tokens,
        can_shrink=True,
        can_checkpoint=not shared_prefix,
        settings_to_change=f"{config.kind}.micro_batch_tokens or memory.min_micro_batch_tokens, "
        "model.gradient_checkpointing"
        + (" (with rl.shared_prefix=false)" if shared_prefix else "")
        + ", model.dtype or model.master_dtype, or shard the trainer over Ray ranks (placement)",
    )
    if beside:
        logger.info("memory plan: %.1f GiB held by the engines beside the trainer", beside / GIB)
    section = section.model_copy(update={"micro_batch_tokens": plan.settings.micro_batch_tokens})
    model = config.model.model_copy(update={"gradient_checkpointing": plan.settings.checkpointing})
    return config.model_copy(update={config.kind: section, "model": model}), plan
