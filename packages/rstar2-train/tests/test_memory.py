"""The memory plan: its estimate against what autograd keeps (counted with saved-tensor hooks on
tiny models) and against the peaks measured on one H200, and its decisions on devices of given
sizes (no GPU needed: the device's memory is an input)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from models import tiny_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from rstar2_train import TokenSequence, load_config, memory, micro_batches
from rstar2_train.batching import token_logprobs
from rstar2_train.config.schema import FSDPConfig, OptimizerConfig, ScheduleConfig
from rstar2_train.memory import (
    GIB,
    MemoryPlanError,
    MemorySettings,
    ModelShape,
    estimate_peak,
    head_backward_bytes,
    memory_settings,
    plan_memory,
    plan_stage_memory,
)
from rstar2_train.placement import ranks as ranks_module
from rstar2_train.placement.ranks import RankSetup, TrainerRank, free_port
from rstar2_train.precision import Precision

BENCH = Path(__file__).parents[1] / "bench"
H200 = 139 * GIB  # what torch reports free on an idle 141 GB H200
H100 = 79 * GIB
MIXED = Precision(compute=torch.bfloat16, master=torch.float32)


def bench_shapes() -> dict[str, dict[str, Any]]:
    """The Qwen3 shapes the GPU benchmark measures."""
    sys.path.insert(0, str(BENCH))
    from shapes import SHAPES

    return SHAPES


def shape(name: str) -> ModelShape:
    with torch.device("meta"):
        return ModelShape.of(Qwen3ForCausalLM(Qwen3Config(**bench_shapes()[name])))


def ranks(tokens: int, checkpointing: bool = False, **changes: Any) -> MemorySettings:
    """One FSDP2 rank with bf16 compute and float32 master weights, fused AdamW."""
    settings = MemorySettings(
        master_bytes=4,
        compute_bytes=2,
        micro_batch_tokens=tokens,
        checkpointing=checkpointing,
        fsdp=True,
    )
    return MemorySettings(**{**settings.__dict__, **changes})


def plan(name: str, device: int, *, can_shrink: bool, can_checkpoint: bool = True) -> Any:
    return plan_memory(
        shape(name),
        ranks(16384),
        budget=int(device * 0.9),
        min_micro_batch_tokens=4096,
        can_shrink=can_shrink,
        can_checkpoint=can_checkpoint,
        settings_to_change="rl.micro_batch_tokens",
    )


def test_shapes_count_the_qwen3_parameters() -> None:
    small, large = shape("0.6b"), shape("4b")
    assert round(small.parameters / 1e6) == 596  # Qwen3-0.6B, tied head counted once
    assert round(large.parameters / 1e9, 2) == 4.02
    assert large.layers == 36
    assert large.root_parameters == 151936 * 2560 + 2560  # embeddings and the final norm
    assert small.qk_norm
    assert large.qk_norm


# Peaks measured on one H200 (torch 2.11, whose varlen_attn repeats grouped keys and values;
# 32 sequences of 1,024 tokens a step; one FSDP2 rank, bf16 compute, float32 masters,
# foreach AdamW), by bench/scale_gpu.py on 187c765: (shape, micro-batch tokens,
# checkpointing, attention mask, peak GiB).
H200_PEAKS = [
    ("0.6b", 16384, False, "none", 43.57),  # varlen_attention, packed
    ("4b", 8192, False, "none", 113.84),  # varlen_attention, packed
    ("0.6b", 16384, True, "none", 12.00),
    ("4b", 16384, True, "none", 75.39),  # the optimizer step's foreach temporary is the peak
    ("0.6b", 16384, False, "packed", 57.57),  # sdpa through a dense mask over packed rows
]


@pytest.mark.parametrize(("name", "tokens", "checkpointing", "mask", "measured"), H200_PEAKS)
def test_the_estimate_is_within_3_percent_of_the_peaks_measured_on_an_h200(
    name: str, tokens: int, checkpointing: bool, mask: str, measured: float
) -> None:
    settings = ranks(tokens, checkpointing, kv_repeated=True, mask=mask, foreach_step=True)
    estimate = estimate_peak(shape(name), settings).total / GIB
    assert estimate == pytest.approx(measured, rel=0.03)


def test_the_estimate_predicts_the_oom_measured_on_an_h200() -> None:
    # Measured on one H200 (2e64bca): the 4B shape in 16,384-token micro-batches without
    # checkpointing ran out of memory with 134 GiB in use.
    assert estimate_peak(shape("4b"), ranks(16384)).total > H200
    checkpointed = estimate_peak(shape("4b"), ranks(16384, checkpointing=True))
    assert checkpointed.activations < estimate_peak(shape("4b"), ranks(16384)).activations / 10


def _saved_bytes(model: torch.nn.Module, batch: Any) -> int:
    """Bytes of the distinct tensors the forward pass of ``token_logprobs`` leaves for the
    backward pass: what autograd saves (seen by saved-tensor hooks) and, under activation
    checkpointing, the layer inputs the checkpoint keeps for its recomputation; parameters
    excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        keep(tensor)
        return tensor

    def counted(checkpoint: Callable[..., Any]) -> Callable[..., Any]:
        def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            # transformers hands a layer's keyword arguments over in a functools.partial.
            bound = getattr(function, "keywords", {})
            for value in (*args, *kwargs.values(), *bound.values()):
                # The rotary tables come as a (cos, sin) pair.
                for tensor in value if isinstance(value, tuple) else (value,):
                    if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                        keep(tensor)
            return checkpoint(function, *args, **kwargs)

        return call

    # transformers gives each checkpointed layer its own checkpoint function.
    for module in model.modules():
        checkpoint = module.__dict__.get("_gradient_checkpointing_func")
        if checkpoint is not None:
            module._gradient_checkpointing_func = counted(checkpoint)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs = token_logprobs(model, batch)  # type: ignore[arg-type]
    assert logprobs.requires_grad
    return sum(kept.values())


ARCHITECTURES: dict[str, tuple[Any, Any]] = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def _model(architecture: str, layers: int, kv_heads: int, dtype: torch.dtype) -> Any:
    config_class, model_class = ARCHITECTURES[architecture]
    config = config_class(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "varlen_attention"
    torch.manual_seed(0)
    model = model_class(config).to(dtype)
    model.train()
    return model


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
@pytest.mark.parametrize("kv_heads", [2, 8], ids=["gqa", "mha"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["full", "checkpointed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_estimate_is_within_5_percent_of_what_autograd_keeps(
    architecture: str, kv_heads: int, checkpointing: bool, dtype: torch.dtype
) -> None:
    # Packed rows of several documents through varlen_attention (on a CPU its reference
    # kernel, which repeats grouped keys and values like torch 2.10/2.11's kernel), the fused
    # LM head, every position trained: two depths, so the per-layer share and the rest are
    # told apart.
    generator = torch.Generator().manual_seed(1)
    lengths = [700, 300, 1000, 48]
    sequences = [
        TokenSequence(ids=torch.randint(1, 300, (n,), generator=generator).tolist(), mask=[1] * n)
        for n in lengths
    ]
    tokens = sum(lengths)
    (batch,) = micro_batches(sequences, tokens, packing=True, pad_id=0, device=torch.device("cpu"))
    measured = {}
    for layers in (2, 4):
        model = _model(architecture, layers, kv_heads, dtype)
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        measured[layers] = _saved_bytes(model, batch)
        model_shape = ModelShape.of(model)
    assert model_shape.qk_norm == (architecture == "qwen3")
    settings = memory_settings(
        Precision(dtype, dtype),
        micro_batch_tokens=tokens,
        attention="varlen_attention",
        device=torch.device("cpu"),
        packed=True,
        checkpointing=checkpointing,
    )
    assert settings.kv_repeated  # the reference kernel's way, as on torch without enable_gqa
    estimate = estimate_peak(model_shape, settings)
    per_layer = (measured[4] - measured[2]) / 2
    c = dtype.itemsize
    # The reference kernel keeps one more query-sized tensor per layer than a fused kernel: each
    # document's output, and their concatenation (the output projection's input; a fused
    # kernel's output is that input itself).
    reference_extra = 0 if checkpointing else tokens * model_shape.heads * model_shape.head_dim * c
    expected_layer = reference_extra + tokens * (
        model_shape.hidden * c
        if checkpointing
        else model_shape.activation_bytes(c, kv_repeated=True)
    )
    assert per_layer == pytest.approx(expected_layer, rel=0.05)
    # The whole forward: decoder layers, final norm and the fused head's saved hidden states.
    assert measured[4] == pytest.approx(estimate.activations + 4 * reference_extra, rel=0.05)


def test_the_estimate_counts_the_norm_outputs_and_repeated_keys_of_a_qwen3_layer() -> None:
    # The Qwen3-4B layer that autograd was seen to keep 170,280 bytes per token of (bf16,
    # keys and values grouped), and with the keys and values repeated for eight query heads
    # each 12,288 more.
    large = shape("4b")
    assert large.activation_bytes(2) == 170_280
    assert large.activation_bytes(2, kv_repeated=True) == 170_280 + 2 * 2 * (4096 - 1024)


def test_the_head_backward_counts_the_float32_accumulator_and_its_cast() -> None:
    large = shape("4b")
    settings = ranks(16384)
    head = large.vocab * large.hidden
    chunk = 1024 * large.vocab * (2 + 4)
    assert head_backward_bytes(large, settings) == head * 4 + max(chunk, head * 2)
    # The 4B head's bf16 [vocab x hidden] gradient is 0.78 GB: counted until the embedding's
    # backward adds to it (gradients), beside the chunk when the head's backward runs.
    assert estimate_peak(large, settings).gradients >= 15 * GIB + head * 2


def test_mixed_precision_in_this_process_keeps_compute_copies_beside_the_masters() -> None:
    large = shape("4b")
    mixed = estimate_peak(large, ranks(8192, fsdp=False))
    pure = estimate_peak(large, ranks(8192, fsdp=False, master_bytes=2))
    p = large.parameters
    # 4 + 2 + 4 + 8 bytes per parameter against 2 + 2 + 4, and the compute-dtype gradients not
    # yet added to their masters (the tied head's until the embedding's backward, one layer's).
    pending = 2 * (large.root_parameters + large.layer_parameters)
    assert mixed.states - pure.states == 10 * p + pending
    assert mixed.compute_weights == 2 * p
    assert pure.compute_weights == 0


def test_the_foreach_optimizer_step_can_be_the_peak() -> None:
    large = shape("4b")
    fused = estimate_peak(large, ranks(16384, checkpointing=True))
    foreach = estimate_peak(large, ranks(16384, checkpointing=True, foreach_step=True))
    assert foreach.step == 4 * large.parameters
    assert foreach.total == foreach.states + foreach.step > fused.total


def sft_on_a_gpu(name: str, *overrides: str) -> Any:
    """The tiny SFT config with a benchmark shape's random weights, in bf16 on a GPU."""
    init = json.dumps(bench_shapes()[name])
    gpu = ["model.device=cuda", "model.dtype=bfloat16", f"model.init.config={init}"]
    return load_config("tiny-sft", [*gpu, *overrides])


def rl_on_a_gpu(name: str, *overrides: str) -> Any:
    """The tiny RL config with a benchmark shape's random weights, in bf16 on a GPU."""
    init = json.dumps(bench_shapes()[name])
    gpu = [
        "model.path=null",
        f"model.init={{config: {init}}}",
        "tokenizer.path=a-tokenizer",
        "model.device=cuda",
        "model.dtype=bfloat16",
    ]
    return load_config("tiny-rl", [*gpu, *overrides])


def test_a_stage_plans_with_its_precision_attention_and_optimizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = sft_on_a_gpu("0.6b")
    seen: list[MemorySettings] = []
    original = memory.plan_memory

    def spy(shape: ModelShape, settings: MemorySettings, **kwargs: Any) -> Any:
        seen.append(settings)
        return original(shape, settings, **kwargs)

    _on_a_gpu(monkeypatch, H200)
    monkeypatch.setattr(memory, "plan_memory", spy)
    plan_stage_memory(config)
    (settings,) = seen
    assert (settings.master_bytes, settings.compute_bytes) == (4, 2)
    assert not settings.fsdp
    assert not settings.foreach_step  # fused AdamW on a GPU
    assert config.sft is not None
    assert settings.longest_sequence == config.sft.max_seq_len


def test_an_rl_stage_plans_for_its_longest_prompt_and_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = rl_on_a_gpu(
        "0.6b", "rl.rollout.max_response_tokens=20000", "rl.micro_batch_tokens=16384"
    )
    _on_a_gpu(monkeypatch, H200)
    _planned, found = plan_stage_memory(config, longest_prompt=lambda: 700)
    assert found is not None
    # Micro-batches cannot shrink below a 20,700-token sequence, which never splits.
    assert found.settings.longest_sequence == 20700
    assert found.settings.tokens == 20700


def test_the_4b_shape_plans_to_fit_a_141_gb_gpu() -> None:
    # In a stage's own process micro-batches can still shrink: halving them is cheaper than
    # recomputing every layer, so that comes first.
    shrunk = plan("4b", H200, can_shrink=True)
    assert shrunk.settings.micro_batch_tokens == 8192
    assert not shrunk.settings.checkpointing
    assert shrunk.estimate.total <= shrunk.budget
    assert shrunk.changes[0].startswith("micro-batch tokens 16384 -> 8192")
    # Trainer ranks get their micro-batches built: checkpointing is their lever.
    checkpointed = plan("4b", H200, can_shrink=False)
    assert checkpointed.settings.micro_batch_tokens == 16384
    assert checkpointed.settings.checkpointing
    assert "activation checkpointing on" in checkpointed.describe()


def test_what_fits_as_configured_is_left_alone() -> None:
    for device in (H200, H100):
        kept = plan("0.6b", device, can_shrink=True)
        assert kept.changes == ()
        assert kept.settings == ranks(16384)
        assert "settings as configured" in kept.describe()


def test_the_micro_batch_floor_and_the_longest_sequence_bound_the_shrinking() -> None:
    # On an 80 GB GPU the 4B shape does not fit without checkpointing above 4,096 tokens (the
    # floor): the plan checkpoints instead, at the largest size that fits.
    tight = plan("4b", H100, can_shrink=True)
    assert tight.settings.checkpointing
    assert tight.settings.micro_batch_tokens >= 4096
    long = ranks(16384, longest_sequence=12000, fsdp=False)
    found = plan_memory(
        shape("4b"),
        long,
        budget=int(H200 * 0.9),
        min_micro_batch_tokens=1024,
        can_shrink=True,
        can_checkpoint=True,
        settings_to_change="x",
    )
    # 8,192-token micro-batches would still hold the 12,000-token sequence: no halving.
    assert found.settings.micro_batch_tokens == 16384
    assert found.settings.checkpointing


def test_nothing_fits_fails_in_one_line_naming_the_settings() -> None:
    with pytest.raises(MemoryPlanError) as failure:
        plan_memory(
            shape("4b"),
            ranks(16384),
            budget=40 * GIB,
            min_micro_batch_tokens=4096,
            can_shrink=True,
            can_checkpoint=False,
            settings_to_change="rl.micro_batch_tokens, rl.shared_prefix=false",
        )
    message = str(failure.value)
    assert "\n" not in message
    assert "40.0 GiB are usable" in message
    assert message.endswith("change rl.micro_batch_tokens, rl.shared_prefix=false")


def test_sharding_over_ranks_divides_weights_and_optimizer_state() -> None:
    one = estimate_peak(shape("4b"), ranks(8192))
    eight = estimate_peak(shape("4b"), ranks(8192, shards=8))
    assert eight.optimizer == pytest.approx(one.optimizer / 8, rel=1e-6)
    assert eight.activations == one.activations


def _on_a_gpu(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(memory, "device_memory", lambda device, fraction: (int(free * 0.9), free))


def test_a_stage_in_this_process_applies_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    config = sft_on_a_gpu("4b", "sft.micro_batch_tokens=16384")
    # float32 masters and moments, bf16 compute in this process: about 183 GiB at 16,384
    # tokens, 117 at 8,192 (a 141 GB GPU has 127 usable)
    _on_a_gpu(monkeypatch, H200)
    planned, found = plan_stage_memory(config)
    assert found is not None
    assert found.estimate.total <= found.budget == int(H200 * 0.9)
    assert planned.sft is not None
    assert planned.sft.micro_batch_tokens == 8192
    assert not planned.model.gradient_checkpointing
    assert config.sft is not None
    assert config.sft.micro_batch_tokens == 16384  # the given config is not changed
    _on_a_gpu(monkeypatch, 250 * GIB)
    assert plan_stage_memory(config)[0] == config  # fits as configured
    _on_a_gpu(monkeypatch, 20 * GIB)
    with pytest.raises(MemoryPlanError, match=r"change sft\.micro_batch_tokens"):
        plan_stage_memory(config)


def test_an_rl_stage_sharing_prompts_cannot_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    config = rl_on_a_gpu("4b", "rl.micro_batch_tokens=16384")
    assert config.rl is not None
    assert config.rl.shared_prefix
    # About 71 GiB of weights, masters, gradients and moments: checkpointed activations fit
    # beside them in 85 GiB, 4,096 tokens of full ones (26 GiB) do not.
    _on_a_gpu(monkeypatch, 95 * GIB)
    with pytest.raises(MemoryPlanError, match=r"\(with rl\.shared_prefix=false\)"):
        plan_stage_memory(config)
    unshared = rl_on_a_gpu("4b", "rl.micro_batch_tokens=16384", "rl.shared_prefix=false")
    planned, found = plan_stage_memory(unshared)
    assert found is not None
    assert planned.model.gradient_checkpointing


def test_stages_off_cuda_or_with_planning_off_are_left_alone() -> None:
    config = load_config("tiny-sft")
    assert plan_stage_memory(config) == (config, None)  # on the CPU
    off = load_config("tiny-sft", ["model.device=cuda", "memory.plan=false"])
    assert plan_stage_memory(off) == (off, None)


def test_a_trainer_rank_turns_checkpointing_on_when_its_micro_batches_need_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = tiny_model(seed=3)
    seqs = [TokenSequence(ids=list(range(1, 41)), mask=[0] * 5 + [1] * 35) for _ in range(4)]
    batches = micro_batches(seqs, 160, packing=True, pad_id=0, device=torch.device("cpu"))
    tiny = ModelShape.of(model)
    budget = estimate_peak(
        tiny,
        MemorySettings(master_bytes=4, compute_bytes=4, micro_batch_tokens=160, fsdp=True,
                       checkpointing=True, kv_repeated=True, mask="packed", foreach_step=True),
    ).total  # fmt: skip
    monkeypatch.setattr(ranks_module, "device_memory", lambda device, fraction: (budget, budget))
    rank = TrainerRank(0, threads=1)
    rank.setup(
        RankSetup(
            world=1,
            master_addr="127.0.0.1",
            master_port=free_port(),
            backend="gloo",
            fsdp=FSDPConfig(),
            optimizer=OptimizerConfig(lr=1e-3),
            schedule=ScheduleConfig(),
            total_steps=2,
            precision=Precision(torch.float32, torch.float32),
        ),
        model,
    )
    try:
        assert not rank._model().is_gradient_checkpointing

        def loss(index: int, batch: Any, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
            return -(logprobs * batch.mask).sum(), {}

        update = rank.update(batches, loss, [0], 1, 1.0)
        assert rank._model().is_gradient_checkpointing
        assert update.startup["startup/first_step_s"] >= update.startup["startup/model_build_s"]
        assert rank.update(batches, loss, [0], 1, 1.0).startup == {}  # the first update only
        monkeypatch.setattr(ranks_module, "device_memory", lambda device, fraction: (1, 1))
        bigger = micro_batches(seqs * 2, 400, packing=True, pad_id=0, device=torch.device("cpu"))
        with pytest.raises(MemoryPlanError, match=r"placement\.trainer\.ranks"):
            rank.update(bigger, loss, [0], 1, 1.0)
    finally:
        rank.close()
