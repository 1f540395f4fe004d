"""The policy model and its tokenizer: loaded from a checkpoint, or built new for tiny runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rstar2_data import build_tokenizer
from rstar2_data.hub import hub_problem
from rstar2_scheduler import ChatProtocol, install_chat_template
from rstar2_scheduler.protocol import SPECIAL_TOKENS
from rstar2_train.attention import VARLEN_ATTENTION, varlen_unavailable
from rstar2_train.config.schema import ModelConfig, StageConfig, TokenizerTraining
from rstar2_train.devices import DTYPES, trainer_on_gpu
from rstar2_train.devices import resolve_device as resolve_device  # re-exported
from rstar2_train.sources import (
    TOKENIZER_SETTING,
    CheckpointNotFoundError,
    check_source,
    unreachable_source,
)

logger = logging.getLogger(__name__)

EOS = "<|endoftext|>"


class AttentionChoice(NamedTuple):
    """An attention implementation for the trainer and why it was chosen."""

    name: str
    reason: str


def choose_attention(
    requested: str, *, on_gpu: bool, packed: bool, dtype: torch.dtype = torch.bfloat16
) -> AttentionChoice:
    """``requested``, or for ``auto``: on a GPU with packed micro-batches ``varlen_attention``
    (PyTorch's variable-length FlashAttention: no compiler) where the installed torch, GPU and
    compute ``dtype`` allow it, else ``flex_attention`` (which compiles its kernels in the first
    step); ``sdpa`` on a CPU and for padded rows."""
    if requested != "auto":
        return AttentionChoice(requested, "set in model.attn_implementation")
    if not on_gpu:
        return AttentionChoice("sdpa", "trainer on CPU")
    if not packed:
        return AttentionChoice("sdpa", "padded micro-batches on GPU: sdpa's fused causal kernels")
    problem = varlen_unavailable(dtype)
    if problem is None:
        return AttentionChoice(
            VARLEN_ATTENTION, "packed micro-batches on GPU: variable-length FlashAttention"
        )
    return AttentionChoice(
        "flex_attention",
        f"packed micro-batches on GPU, and {VARLEN_ATTENTION} is unavailable ({problem}); "
        "FlexAttention compiles its kernels in the first step",
    )


def resolve_attention(config: StageConfig) -> tuple[StageConfig, AttentionChoice | None]:
    """The stage config with ``model.attn_implementation: auto`` replaced by its choice
    (``choose_attention``, from where the trainer runs, the micro-batch layout and the trainer's
    compute dtype), and that choice (None when the config names one). The choice is logged."""
    if config.model.attn_implementation != "auto":
        return config, None
    section = config.sft if config.sft is not None else config.rl
    packed = section is not None and section.packing
    choice = choose_attention(
        "auto", on_gpu=trainer_on_gpu(config), packed=packed, dtype=DTYPES[config.model.dtype]
    )
    logger.info("model.attn_implementation auto -> %s (%s)", choice.name, choice.reason)
    model = config.model.model_copy(update={"attn_implementation": choice.name})
    return config.model_copy(update={"model": model}), choice


def _load_error(
    path: str, what: str, error: OSError, *, setting: str | None = None
) -> CheckpointNotFoundError:
    """One line: an unreachable hub with how to give a local copy (in ``setting``, default
    ``what``), else the library's reason."""
    problem = hub_problem()
    if problem is not None and not Path(path).expanduser().exists():
        return unreachable_source(path, what, problem, setting)
    reason = " ".join(str(error).split())
    return CheckpointNotFoundError(f"{what} {path!r} could not be loaded: {reason}")


def load_tokenizer(path: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer (its own chat template is kept; rstar2's is the default use)."""
    check_source(path, "tokenizer", marker="tokenizer_config.json", setting=TOKENIZER_SETTING)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code
        )
    except OSError as error:
        raise _load_error(path, "tokenizer", error, setting=TOKENIZER_SETTING) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def train_tokenizer(texts: Iterable[str], training: TokenizerTraining) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, with the chat template's special tokens.

    Callers pass the stage's data rendered the way training sees it, so the template's fixed
    text (system prompt, tool schema) compresses into few tokens.
    """
    tokenizer = build_tokenizer(
        texts,
        special_tokens=[EOS, *SPECIAL_TOKENS],
        vocab_size=training.vocab_size,
        pre_split=training.pre_split,
        split_digits=training.split_digits,
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # untyped in transformers
        tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS
    )
    install_chat_template(fast)
    return fast


def bootstrap_chat(training: TokenizerTraining) -> ChatProtocol:
    """A chat protocol over a minimal tokenizer, to render texts before the real one exists."""
    minimal = build_tokenizer(["rstar2"], special_tokens=[EOS, *SPECIAL_TOKENS], vocab_size=300)
    bootstrap = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # untyped in transformers
        tokenizer_object=minimal, eos_token=EOS
    )
    return ChatProtocol(bootstrap)


def build_model(
    config: ModelConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int,
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """The policy: loaded from ``config.path``, or new random weights from ``config.init``, in
    ``dtype`` (default ``model.dtype``; a trainer keeping master weights loads them in their
    own dtype, so a float32 checkpoint keeps its precision).

    ``attn_implementation: auto`` is resolved per stage (``resolve_attention``); a model built
    outside a stage gets ``sdpa`` for it.
    """
    dtype = dtype or DTYPES[config.dtype]
    attention = choose_attention(config.attn_implementation, on_gpu=False, packed=False).name
    if config.path is not None:
        check_source(config.path, "model.path")
        try:
            model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
                config.path,
                dtype=dtype,
                attn_implementation=attention,
                trust_remote_code=config.trust_remote_code,
            )
        except OSError as error:
            raise _load_error(config.path, "model.path", error) from None
        embedded = int(model.config.vocab_size)
        if embedded < len(tokenizer):
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the model {config.path} embeds "
                f"only {embedded}"
            )
    else:
        assert config.init is not None
        model_class = getattr(transformers, config.init.architecture, None)
        if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
            raise ValueError(
                f"model.init.architecture: {config.init.architecture!r} is not a transformers "
                "model class (e.g. Qwen2ForCausalLM)"
            )
        settings: dict[str, Any] = {
            **config.init.config,
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        }
        config_class = model_class.config_class
        if config_class is None:
            raise ValueError(f"{config.init.architecture} names no config class")
        model_config = config_class(**settings)
        model_config._attn_implementation = attention
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_class(model_config)
        model.to(dtype)  # type: ignore[arg-type]  # transformers' stub of .to is wrong
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "policy: %s, %.2fM parameters, %s, %s attention",
        type(model).__name__,
        parameters / 1e6,
        dtype,
        attention,
    )
    return model
