"""The stage config: every setting of one SFT or RL stage, validated by pydantic.

Sections reuse the models of the packages that own them (``ChatConfig`` and ``RolloutConfig``
from rstar2-scheduler, ``GraderConfig`` from rstar2-eval), so a setting means the same thing in
training, rollouts and evaluation. Paths are taken relative to the working directory.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_algo import LossAggregation
from rstar2_eval import GraderConfig
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_scheduler import ChatConfig, RolloutConfig, SchedulerConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exactly_one(section: BaseModel, names: tuple[str, ...]) -> None:
    # The section's own path prefixes the message in every error report (pydantic's ``loc``).
    given = [name for name in names if getattr(section, name) is not None]
    if len(given) != 1:
        options = ", ".join(names)
        found = ", ".join(given) or "none"
        raise ValueError(f"set exactly one of {options} (got {found})")


class ModelInit(_Section):
    """A new model with random weights, built from a transformers config (tiny CPU runs)."""

    architecture: str = Field(
        default="Qwen3ForCausalLM", description="A transformers model class name."
    )
    config: dict[str, Any] = Field(
        description="Keyword arguments of the architecture's config class; vocab_size is taken "
        "from the tokenizer."
    )


class ModelConfig(_Section):
    """Where the policy comes from and how it runs."""

    path: str | None = Field(
        default=None,
        description="Hugging Face checkpoint directory or hub id (e.g. a previous stage's "
        "<output_dir>/final).",
    )
    init: ModelInit | None = Field(default=None, description="Or: build a new random model.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="bfloat16",
        description="Compute dtype: the trainer's forward and backward passes, the weights "
        "engines generate with and checkpoints are saved in.",
    )
    master_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32",
        description="dtype of the weights the optimizer updates, of its AdamW moments and of "
        "accumulated gradients, on every trainer path (one process or Ray ranks). float32 keeps "
        "updates that bf16 weights would round away (at lr 1e-6, most of them); set it to "
        "model.dtype to train without master weights (8 bytes per parameter less).",
    )
    attn_implementation: Literal[
        "auto", "varlen_attention", "sdpa", "flex_attention", "eager", "flash_attention_2"
    ] = Field(
        default="auto",
        description="transformers attention kernel of the trainer. auto: when the trainer runs "
        "on a GPU and micro-batches are packed (sft.packing, rl.packing), varlen_attention "
        "(PyTorch's variable-length FlashAttention, torch 2.10+, bf16/fp16, no compilation), or "
        "flex_attention where that is unavailable (older torch, ROCm, float32; it compiles its "
        "kernels in the first step); sdpa otherwise (CPU, padded rows: over a packed row sdpa "
        "attends through a dense [tokens, tokens] mask). The choice and its reason are logged "
        "and noted in the run's config.yaml. flex_attention has no backward pass on CPU; "
        "flash_attention_2 needs the flash-attn package. TransformersEngine decodes with its "
        "own attention.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass to save memory."
    )
    trust_remote_code: bool = False
    device: str = Field(
        default="auto", description="Where the trainer's model lives: cpu, cuda, cuda:1; auto."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _exactly_one(self, ("path", "init"))
        return self

    @model_validator(mode="after")
    def _master_holds_compute(self) -> Self:
        if self.master_dtype not in ("float32", self.dtype):
            raise ValueError(
                f"master_dtype: {self.master_dtype} cannot hold the {self.dtype} weights the "
                "trainer computes with (expected float32, or the same as model.dtype for pure "
                f"{self.dtype} training)"
            )
        return self


class MemoryConfig(_Section):
    """Planning the trainer's memory on a GPU before the first step."""

    plan: bool = Field(
        default=True,
        description="Estimate the trainer's peak memory per step from the model's shape and "
        "these settings, compare it with the GPU's free memory, and when it would not fit "
        "shrink micro-batch tokens (in this process) or turn activation checkpointing on; fail "
        "at once, naming the settings to change, when nothing fits. CUDA only.",
    )
    min_micro_batch_tokens: int = Field(
        default=4096, gt=0, description="The plan shrinks micro-batches no further than this."
    )
    usable_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of the GPU's free memory the estimate may fill (the rest absorbs "
        "allocator fragmentation and kernel workspaces).",
    )


class TokenizerTraining(_Section):
    """Train a byte-level BPE tokenizer on the stage's own training data (with ``model.init``)."""

    vocab_size: int = Field(default=1024, gt=300, description="Vocabulary size, specials included.")
    samples: int | None = Field(
        default=None, gt=0, description="Train on the first N rows only (None: all)."
    )
    pre_split: Literal["words", "lines"] = Field(
        default="words",
        description="words: merges stay inside words; lines: merges may span a whole line, so "
        "fixed text (system prompt, tool schema, programs) becomes a few tokens.",
    )
    split_digits: bool = Field(
        default=False, description="One token per digit (numbers are copied digit by digit)."
    )


class TokenizerConfig(_Section):
    """Where the tokenizer comes from (default: the model's checkpoint)."""

    path: str | None = Field(default=None, description="Tokenizer directory or hub id.")
    train: TokenizerTraining | None = Field(default=None, description="Or: train one.")

    @model_validator(mode="after")
    def _not_both(self) -> Self:
        if self.path is not None and self.train is not None:
            raise ValueError("tokenizer: set path or train, not both")
        return self


class DataSource(_Section):
    """One dataset: an rstar2-data build folder, a recipe built into the run, or a file."""

    build: str | None = Field(default=None, description="rstar2-data build folder.")
    recipe: str | None = Field(
        default=None,
        description="Shipped rstar2-data recipe name or recipe file; built into "
        "<output_dir>/data/<name> on first use.",
    )
    vars: dict[str, str] = Field(default_factory=dict, description="Recipe ${VARIABLES}.")
    file: str | None = Field(
        default=None, description="JSONL or Parquet of MathProblem (RL) or ChatExample (SFT) rows."
    )
    limit: int | None = Field(default=None, gt=0, description="Use the first N rows only.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _exactly_one(self, ("build", "recipe", "file"))
        if self.vars and self.recipe is None:
            raise ValueError("vars apply to a recipe only")
        return self


class DataConfig(_Section):
    """Training data (and SFT validation data)."""

    train: DataSource
    validation: DataSource | None = Field(
        default=None, description="SFT: rows for the validation loss."
    )
    shuffle: bool = Field(default=True, description="Reshuffle every epoch (seeded).")


class OptimizerConfig(_Section):
    """AdamW."""

    lr: float = Field(gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    grad_clip: float | None = Field(default=1.0, gt=0, description="Max global grad norm.")
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = Field(
        default="auto",
        description="torch's AdamW kernels: fused (one kernel for all parameters), foreach "
        "(batched per operation), for-loop (per parameter). auto: fused when the weights are "
        "on a GPU, else foreach (torch's own default).",
    )
    load_state: bool = Field(
        default=False,
        description="Continue from the optimizer state saved with model.path (a previous "
        "stage's checkpoint) instead of a fresh one.",
    )


class ScheduleConfig(_Section):
    """Learning-rate schedule over the stage's optimizer steps."""

    kind: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int | None = Field(default=None, ge=0)
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Cosine floor / lr.")

    @model_validator(mode="after")
    def _one_warmup(self) -> Self:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("schedule: set warmup_steps or warmup_ratio, not both")
        return self

    def warmup(self, total_steps: int) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return round((self.warmup_ratio or 0.0) * total_steps)


class CheckpointConfig(_Section):
    """When checkpoints are written and how many are kept."""

    every_steps: int | None = Field(
        default=50, gt=0, description="Also at the end; None: only at the end."
    )
    keep_last: int = Field(default=2, ge=1, description="Older checkpoints are deleted.")


class WandbConfig(_Section):
    """Weights & Biases: the resolved config, every step's metrics and the sample rollouts."""

    project: str = Field(default="rstar2", min_length=1, description="W&B project.")
    entity: str | None = Field(default=None, description="W&B team or user; default: yours.")
    name: str | None = Field(default=None, description="Run name; default: the stage's name.")
    group: str | None = Field(default=None, description="Groups runs, e.g. the stages of a recipe.")
    tags: list[str] = Field(default_factory=list, description="Run tags.")
    mode: Literal["online", "offline", "disabled"] | None = Field(
        default=None,
        description="offline: no network, the run is written under <output_dir>/wandb for a "
        "later `wandb sync`; default: WANDB_MODE, else online.",
    )


class LoggingConfig(_Section):
    """Metrics, plots and inspection files."""

    tensorboard: bool = Field(default=False, description="Also write TensorBoard events.")
    wandb: WandbConfig | None = Field(
        default=None,
        description="Also log to Weights & Biases (wandb extra); {} for the defaults.",
    )
    plots: bool = Field(default=True, description="PNG plots of the metrics (plot extra).")
    sample_rollouts: int = Field(
        default=4,
        ge=0,
        description="RL: rollouts per step written as readable text (and logged to W&B).",
    )


class SFTConfig(_Section):
    """Supervised fine-tuning on chat transcripts (loss on assistant tokens only)."""

    epochs: float | None = Field(default=None, gt=0, description="Passes over the data.")
    max_steps: int | None = Field(default=None, gt=0, description="Or: optimizer steps.")
    batch_size: int = Field(default=128, gt=0, description="Sequences per optimizer step.")
    micro_batch_tokens: int = Field(
        default=16384, gt=0, description="Tokens per forward/backward pass (memory bound)."
    )
    max_seq_len: int = Field(default=8192, gt=1, description="Longer transcripts are skipped.")
    packing: bool = Field(
        default=True,
        description="Pack sequences into one row per micro-batch (no padding); else pad rows.",
    )
    math_prompt: bool = Field(
        default=False,
        description="Wrap each transcript's first user message in the RL user prompt, as rollouts "
        "render problems (for math transcripts such as the demo's).",
    )
    tool_output_chars: int | None = Field(
        default=256,
        ge=2,
        description="Tool outputs in transcripts are truncated as rollouts truncate them (keep "
        "it equal to the RL stages' rl.rollout.tool_output_chars); None: shown whole.",
    )
    on_bad_example: Literal["error", "skip"] = Field(
        default="error",
        description="A transcript that cannot be encoded or is too long: stop, or skip it (the "
        "skipped count per reason is logged).",
    )
    validation_every: int | None = Field(
        default=None, gt=0, description="Steps between validation-loss passes (and at the end)."
    )

    @model_validator(mode="after")
    def _length(self) -> Self:
        _exactly_one(self, ("epochs", "max_steps"))
        return self


class RocConfig(_Section):
    """Which of the 2G rollouts of a prompt are kept (G = ``keep``)."""

    strategy: Literal["sample", "topk", "none"] = Field(
        default="sample",
        description="sample: the paper's RoC; topk: the release's; none: plain GRPO (positives "
        "kept uniformly at random).",
    )
    keep: int = Field(gt=0, description="Rollouts kept per prompt (G).")
    min_positives: int = Field(default=1, ge=0)
    min_negatives: int = Field(default=1, ge=0)


class LossConfig(_Section):
    """The clipped policy loss (no KL, no entropy term)."""

    eps_low: float = Field(default=0.2, ge=0, lt=1)
    eps_high: float = Field(default=0.28, ge=0, description="Clip-higher.")
    dual_clip: float | None = Field(default=None, gt=1)
    aggregation: LossAggregation = "token-mean"
    tis_cap: float | None = Field(
        default=None,
        gt=0,
        description="Synchronous loop (rl.max_staleness 0): truncated importance sampling, "
        "weighting each token by min(p_trainer / p_engine, cap) to correct engine/trainer "
        "mismatch (None: off). With max_staleness >= 1 the behaviour weight does this.",
    )
    behaviour_cap: float = Field(
        default=2.0,
        gt=0,
        description="rl.max_staleness >= 1: the decoupled objective weights each token by "
        "min(pi_prox / pi_behav, cap), pi_prox the trainer's log-probs at the start of the "
        "update and pi_behav the (older) sampling policy's.",
    )
    behaviour_band: tuple[float, float] | None = Field(
        default=None,
        description="rl.max_staleness >= 1: [low, high]; a token whose untruncated behaviour "
        "weight falls outside is masked out of the loss (None: none is).",
    )

    @model_validator(mode="after")
    def _band(self) -> Self:
        band = self.behaviour_band
        if band is not None and not 0 <= band[0] < band[1]:
            raise ValueError(f"behaviour_band must be [low, high] with 0 <= low < high, got {band}")
        return self


class EnginesConfig(_Section):
    """Inference engines for rollouts."""

    kind: Literal["transformers", "vllm"] = "transformers"
    count: int = Field(default=1, gt=0, description="Engines (one per GPU with vllm).")
    device: str = Field(default="auto", description="transformers: cpu, cuda, cuda:1; auto.")
    kv_budget_tokens: int = Field(
        default=65536, gt=0, description="transformers: KV tokens each engine may hold."
    )
    max_batch_size: int = Field(default=64, gt=0, description="transformers: rows per step.")
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="transformers, in this process: torch's intra-op threads during the "
        "engines' forward steps (None: torch's setting; 1 decodes a tiny model faster on a CPU).",
    )
    process: bool = Field(
        default=False,
        description="transformers, without placement: run each engine in a child process of "
        "its own, so that its forward steps run beside the trainer's update (in this process "
        "they share one compute thread): what rl.max_staleness needs to overlap on one machine "
        "without Ray.",
    )
    cpus: list[int] | None = Field(
        default=None,
        min_length=1,
        description="process: the CPU cores the engine processes may run on (e.g. [1], with "
        "the trainer on the others); None: any.",
    )
    vllm: dict[str, Any] = Field(default_factory=dict, description="vllm: AsyncEngineArgs.")

    @model_validator(mode="after")
    def _process(self) -> Self:
        if self.process and self.kind != "transformers":
            raise ValueError("process: only transformers engines run in child processes")
        if self.cpus is not None and not self.process:
            raise ValueError("cpus: pins engine processes; set process: true")
        return self


class SandboxConfig(_Section):
    """Where tool calls run."""

    url: str | None = Field(
        default=None, description="rstar2-sandbox server URL; None: an embedded sandbox."
    )
    executor: ExecutorSettings = Field(
        default_factory=ExecutorSettings,
        description="The embedded sandbox's fork-servers, slots and limits.",
    )
    check_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="The call that checks the sandbox before the first step must answer within "
        "this (an embedded sandbox starts its fork-servers for it).",
    )
    max_consecutive_failures: int = Field(
        default=8,
        ge=1,
        description="Sandbox calls failing in a row (no answer, or its own internal error) that "
        "stop the stage, after a checkpoint of the last finished step, with exit status 1.",
    )
    error_rate_warning: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Share of a step's sandbox calls that may fail before the step logs a warning.",
    )


class ValidationConfig(_Section):
    """Periodic evaluation through rstar2-eval, on the trainer's own engines."""

    every_steps: int | None = Field(default=None, gt=0, description="None: only at the end.")
    at_start: bool = Field(default=False, description="Also before the first step.")
    benchmarks: list[str] = Field(
        min_length=1, description="rstar2-eval benchmark names, or NAME=PATH problem files."
    )
    data_dir: str | None = Field(default=None, description="Local benchmark files.")
    samples: int = Field(default=4, gt=0)
    temperature: float = Field(default=0.6, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_response_tokens: int | None = Field(
        default=None, gt=0, description="Default: the rollouts' budget."
    )
    max_turns: int | None = Field(default=None, gt=0, description="Default: the rollouts'.")
    limit: int | None = Field(default=None, gt=0, description="Problems per benchmark.")


class FSDPConfig(_Section):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) options of the trainer ranks."""

    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="dtype of the gradient reduce-scatter between ranks (bfloat16 halves its "
        "bytes; gradients still accumulate in model.master_dtype). Number formats are set for "
        "every trainer path by model.dtype and model.master_dtype.",
    )
    reshard_after_forward: bool = Field(
        default=True, description="Free gathered parameters after forward (ZeRO-3); else ZeRO-2."
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in backward."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_param_dtype(cls, data: Any) -> Any:
        if isinstance(data, dict) and "param_dtype" in data:
            raise ValueError(
                "param_dtype is no longer an FSDP setting: every trainer path computes in "
                "model.dtype and keeps master weights and AdamW moments in model.master_dtype "
                "(float32 by default); remove placement.trainer.fsdp.param_dtype"
            )
        return data


class TrainerPlacement(_Section):
    """The data-parallel trainer: one Ray actor per rank, torch.distributed between them."""

    ranks: int = Field(default=1, gt=0, description="Trainer ranks (one per GPU on GPUs).")
    cpus: float = Field(default=1, ge=0, description="CPUs per rank (also its torch threads).")
    gpus: float = Field(default=0, ge=0, description="GPUs per rank (0: CPU ranks over gloo).")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="auto: nccl when ranks have GPUs, else gloo."
    )
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    bucket_mb: int = Field(
        default=512, gt=0, description="Weight sync: megabytes per bucket put in the object store."
    )


class EnginePlacement(_Section):
    """Resources of each inference-engine actor (rl.engines.count of them)."""

    cpus: float = Field(default=1, ge=0)
    gpus: float = Field(
        default=0, ge=0, description="GPUs per engine (vllm: its tensor_parallel_size)."
    )


class SandboxPlacement(_Section):
    """The rstar2-sandbox service as Ray-placed processes (used unless rl.sandbox.url is set)."""

    servers: int = Field(
        default=1, ge=0, description="Fork-servers of the front end (single node) or per worker."
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="Cluster mode: worker processes behind a Redis queue (needs redis_url and "
        "the sandbox's cluster extra); 0: one single-node service.",
    )
    redis_url: str | None = Field(default=None, description="Cluster mode: the Redis queue.")
    cpus: float = Field(default=1, ge=0, description="CPUs per sandbox process.")

    @model_validator(mode="after")
    def _cluster(self) -> Self:
        if self.workers and self.redis_url is None:
            raise ValueError("placement.sandbox.workers needs placement.sandbox.redis_url")
        return self


class GraderPlacement(_Section):
    """Grading as Ray actors: each holds an rstar2-eval Grader built from rl.grader (its own
    math-verify worker pool); each graded batch goes to the least busy actor."""

    actors: int = Field(
        default=1, ge=1, description="Grader actors (a dead one's batches go to the others)."
    )
    cpus: float = Field(
        default=1,
        gt=0,
        description="CPUs per grader actor: its math-verify processes run on them "
        "(rl.grader.workers of them when set, else one per whole CPU).",
    )


class PlacementConfig(_Section):
    """Ray placement of an RL stage: trainer ranks, engines, the sandbox and the graders as
    actors."""

    ray_address: str | None = Field(
        default=None,
        description="Ray cluster to join (e.g. auto, ray://head:10001); None: RAY_ADDRESS, else "
        "a local cluster started for the stage.",
    )
    mode: Literal["split", "colocated"] = Field(
        default="split",
        description="split: engines and trainer on separate resources; colocated: they share "
        "them and engines sleep() during the update.",
    )
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK", description="Ray placement-group strategy over all bundles."
    )
    local_cpus: int | None = Field(
        default=None, gt=0, description="CPUs of a local cluster started for the stage."
    )
    trainer: TrainerPlacement = Field(default_factory=TrainerPlacement)
    engines: EnginePlacement = Field(default_factory=EnginePlacement)
    sandbox: SandboxPlacement = Field(default_factory=SandboxPlacement)
    grader: GraderPlacement = Field(default_factory=GraderPlacement)


class RLConfig(_Section):
    """GRPO-RoC."""

    steps: int = Field(gt=0, description="RL steps (one rollout phase each).")
    prompts_per_step: int = Field(gt=0)
    rollouts_per_prompt: int = Field(gt=1, description="2G: rollouts generated per prompt.")
    roc: RocConfig
    loss: LossConfig = Field(default_factory=LossConfig)
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="eta. 0: the synchronous loop (rollouts, update, weight sync, next "
        "rollouts). >= 1: rollouts are produced while the trainer updates; a prompt group is "
        "admitted only while (eta + 1) x prompts_per_step groups are not all admitted and "
        "unconsumed, so no trained token is more than eta policy versions old; the loss is the "
        "decoupled objective (loss.behaviour_cap). Needs engines beside the trainer, not "
        "colocated.",
    )
    ppo_mini_batches: int = Field(
        default=1, gt=0, description="Optimizer steps per RL step (1: fully on-policy)."
    )
    micro_batch_tokens: int = Field(default=16384, gt=0, description="Tokens per forward pass.")
    packing: bool = True
    shared_prefix: bool = Field(
        default=True,
        description="Train the kept rollouts of a prompt in micro-batches that run the prompt "
        "once (its KV cache is read by every rollout); else each rollout recomputes it. Needs "
        "the KV cache in training, so not with activation checkpointing.",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Turn limit, response budget, sampling and tool limits (chat: see the "
        "top-level chat section).",
    )
    engines: EnginesConfig = Field(default_factory=EnginesConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    grader: GraderConfig = Field(default_factory=GraderConfig)
    validation: ValidationConfig | None = None

    @model_validator(mode="after")
    def _groups(self) -> Self:
        if self.roc.keep > self.rollouts_per_prompt:
            raise ValueError(
                f"roc.keep ({self.roc.keep}) cannot exceed rollouts_per_prompt "
                f"({self.rollouts_per_prompt})"
            )
        if self.roc.min_positives + self.roc.min_negatives > self.roc.keep:
            raise ValueError("roc.min_positives + roc.min_negatives cannot exceed roc.keep")
        if self.max_staleness and self.loss.tis_cap is not None:
            raise ValueError(
                "loss.tis_cap is the synchronous loop's correction; with max_staleness >= 1 the "
                "behaviour weight (loss.behaviour_cap) corrects engine/trainer mismatch too: "
                "unset loss.tis_cap"
            )
        if "chat" in self.rollout.model_fields_set:
            raise ValueError(
                "rl.rollout.chat: set the top-level chat section instead (SFT, RL and "
                "evaluation must render prompts alike)"
            )
        if (
            self.rollout.return_support
            and self.engines.kind == "vllm"
            and self.validation is not None
        ):
            raise ValueError(
                "rl.rollout.return_support with rl.engines.kind=vllm starts vLLM with sampling "
                "masks, which serves only requests with temperature > 0 and top_k > 0: "
                "rl.validation's requests would be refused; drop rl.validation and evaluate "
                "checkpoints with rstar2-eval"
            )
        return self


class StageConfig(_Section):
    """One training stage: SFT or RL."""

    name: str = Field(min_length=1)
    kind: Literal["sft", "rl"]
    description: str = ""
    output_dir: str = Field(description="Run directory: checkpoints, metrics, plots, samples.")
    seed: int = 0
    model: ModelConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    chat: ChatConfig = Field(default_factory=ChatConfig)
    data: DataConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    sft: SFTConfig | None = None
    rl: RLConfig | None = None
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    placement: PlacementConfig | None = Field(
        default=None,
        description="RL: run trainer ranks, engines, the sandbox and the graders as Ray "
        "actors; None: in this process (unless RAY_ADDRESS is set).",
    )

    @model_validator(mode="after")
    def _sections_match_kind(self) -> Self:
        if self.kind == "sft" and (self.sft is None or self.rl is not None):
            raise ValueError("kind sft needs an sft section and no rl section")
        if self.kind == "rl" and (self.rl is None or self.sft is not None):
            raise ValueError("kind rl needs an rl section and no sft section")
        tokenizer = self.tokenizer
        if self.model.init is not None and tokenizer.train is None and tokenizer.path is None:
            raise ValueError(
                "model.init builds a new model: give tokenizer.path or tokenizer.train"
            )
        if self.tokenizer.train is not None and self.model.init is None:
            raise ValueError("tokenizer.train needs model.init (a new model for a new vocabulary)")
        placement = self.placement
        if placement is not None:
            if self.rl is None:
                raise ValueError("placement: Ray placement runs RL stages only (kind rl)")
            if self.rl.engines.process:
                raise ValueError(
                    "rl.engines.process runs engines in child processes of this one; with "
                    "placement each engine is a Ray actor already: unset rl.engines.process"
                )
            if placement.trainer.fsdp.activation_checkpointing and self.rl.shared_prefix:
                raise ValueError(
                    "placement.trainer.fsdp.activation_checkpointing turns the KV cache off in "
                    "training, which rl.shared_prefix needs: set rl.shared_prefix=false"
                )
            if placement.mode == "colocated" and self.rl.max_staleness:
                raise ValueError(
                    "rl.max_staleness > 0 overlaps rollouts with the update, but colocated "
                    "engines sleep while the trainer uses their devices: set placement.mode "
                    "split or rl.max_staleness 0"
                )
            engines, ranks = self.rl.engines.count, placement.trainer.ranks
            if placement.mode == "colocated" and engines != ranks:
                raise ValueError(
                    "placement.mode colocated shares each rank's resources with one engine: "
                    f"rl.engines.count ({engines}) must equal placement.trainer.ranks ({ranks})"
                )
        return self

    @property
    def rollout(self) -> RolloutConfig:
        """The RL rollout settings with the stage's chat settings."""
        assert self.rl is not None
        return self.rl.rollout.model_copy(update={"chat": self.chat})
