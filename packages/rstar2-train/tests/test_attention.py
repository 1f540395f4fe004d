"""`model.attn_implementation: auto`: varlen FlashAttention (or FlexAttention where that is
unavailable) for packed micro-batches on GPUs, sdpa else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_runs import DemoData, rl_config, sft_config

from rstar2_train import StageConfig, attention, load_config
from rstar2_train.modeling import build_model, choose_attention, resolve_attention, train_tokenizer


def rl(tmp_path: Path, *overrides: str) -> StageConfig:
    data = DemoData(tmp_path / "sft.jsonl", tmp_path / "rl.jsonl")
    return rl_config(data, tmp_path / "model", tmp_path / "run", *overrides)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "sdpa"),  # the trainer on the CPU
        # the tiny configs train in float32, which FlashAttention does not take
        (["placement.trainer.gpus=1"], "flex_attention"),
        (["placement.trainer.gpus=1", "model.dtype=bfloat16"], "varlen_attention"),
        (
            ["placement.trainer.gpus=1", "model.dtype=bfloat16", "model.master_dtype=bfloat16"],
            "varlen_attention",
        ),
        (["placement.trainer.gpus=1", "rl.packing=false"], "sdpa"),
        (["placement.trainer.gpus=1", "model.attn_implementation=eager"], "eager"),
        (["model.attn_implementation=flex_attention"], "flex_attention"),
    ],
)
def test_auto_chooses_varlen_attention_for_packed_batches_on_gpus(
    tmp_path: Path, overrides: list[str], expected: str
) -> None:
    config = rl(tmp_path, *overrides)
    assert config.model.attn_implementation == (
        "auto" if not any("attn" in o for o in overrides) else expected
    )
    resolved, choice = resolve_attention(config)
    assert resolved.model.attn_implementation == expected
    assert (choice is None) == any("attn" in o for o in overrides)


def test_the_runs_config_keeps_auto_and_notes_the_choice(sft_run: Path) -> None:
    # The config as given is the run's identity (a resume on other hardware is the same run).
    assert load_config(str(sft_run / "config.yaml")).model.attn_implementation == "auto"
    note = "# model.attn_implementation auto: sdpa (trainer on CPU)"
    assert note in (sft_run / "config.yaml").read_text()


def test_a_model_built_outside_a_stage_uses_sdpa_for_auto(
    demo_data: DemoData, tmp_path: Path
) -> None:
    config = sft_config(demo_data, tmp_path / "run")
    assert config.model.attn_implementation == "auto"
    assert config.tokenizer.train is not None
    tokenizer = train_tokenizer(["1 + 2 = 3"] * 20, config.tokenizer.train)
    model = build_model(config.model, tokenizer, seed=0)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    ("problem", "dtype", "expected"),
    [
        (None, torch.bfloat16, "varlen_attention"),
        (None, torch.float32, "flex_attention"),  # FlashAttention needs bf16/fp16
        ("torch 2.9 has no torch.nn.attention.varlen", torch.bfloat16, "flex_attention"),
    ],
)
def test_flex_attention_is_the_fallback_where_varlen_is_unavailable(
    problem: str | None, dtype: torch.dtype, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if problem is not None:
        monkeypatch.setattr(attention.importlib.util, "find_spec", lambda name: None)
    choice = choose_attention("auto", on_gpu=True, packed=True, dtype=dtype)
    assert choice.name == expected
    if expected == "flex_attention":
        assert "compiles its kernels in the first step" in choice.reason
        assert ("float32" in choice.reason) == (dtype == torch.float32)
        assert ("no torch.nn.attention.varlen" in choice.reason) == (problem is not None)
    assert choose_attention("auto", on_gpu=False, packed=True).name == "sdpa"
    assert choose_attention("eager", on_gpu=True, packed=True).name == "eager"
