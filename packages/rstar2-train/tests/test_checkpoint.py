"""Checkpoints: complete or absent, loadable by transformers alone, pruned, and honest."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models import tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from rstar2_train import TrainerState, list_checkpoints, save_checkpoint
from rstar2_train.checkpoint import load_rng, prune, read_state, step_folder
from rstar2_train.config import TokenizerTraining
from rstar2_train.modeling import train_tokenizer

TEXTS = ["<|im_start|>user\nWhat is 1234 * 5678?<|im_end|>\n", "print(a * b) 98765\n"] * 20


def state(step: int) -> TrainerState:
    return TrainerState(
        stage="s", kind="rl", step=step, total_steps=9, data={"epoch": 0, "offset": step, "size": 9}
    )


def test_saved_checkpoint_loads_with_transformers_alone(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(TEXTS, TokenizerTraining(vocab_size=320))
    model = tiny_model(len(tokenizer))
    folder = save_checkpoint(
        step_folder(tmp_path, 3),
        model=model,
        tokenizer=tokenizer,
        optimizer_state=None,
        state=state(3),
    )
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for (name, ours), (_, theirs) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    reloaded = AutoTokenizer.from_pretrained(folder)
    assert reloaded.encode(TEXTS[0]) == tokenizer.encode(TEXTS[0])
    assert reloaded.chat_template == tokenizer.chat_template
    assert read_state(folder) == state(3)
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind


def test_a_tokenizer_transformers_would_reload_differently_is_refused(tmp_path: Path) -> None:
    # transformers gives qwen2 checkpoints its own pre-tokenizer, whatever tokenizer.json says:
    # a trained byte-level tokenizer saved beside a Qwen2 model would load as another one.
    tokenizer = train_tokenizer(TEXTS, TokenizerTraining(vocab_size=320))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    with pytest.raises(RuntimeError, match="encodes differently"):
        save_checkpoint(
            tmp_path / "final",
            model=Qwen2ForCausalLM(config),
            tokenizer=tokenizer,
            optimizer_state=None,
            state=state(1),
        )
    assert not (tmp_path / "final").exists()


def test_only_complete_checkpoints_count_and_old_ones_are_pruned(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(TEXTS, TokenizerTraining(vocab_size=320))
    model = tiny_model(len(tokenizer))
    for step in (1, 2, 3):
        save_checkpoint(
            step_folder(tmp_path, step),
            model=model,
            tokenizer=tokenizer,
            optimizer_state=None,
            state=state(step),
        )
    # A save killed half-way leaves a temporary folder; a folder without its state is partial.
    (tmp_path / ".step-000004.tmp").mkdir()
    (tmp_path / "step-000005").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-000001",
        "step-000002",
        "step-000003",
    ]
    prune(tmp_path, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    assert not (tmp_path / ".step-000004.tmp").exists()


def test_random_state_is_restored(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(TEXTS, TokenizerTraining(vocab_size=320))
    torch.manual_seed(7)
    folder = save_checkpoint(
        tmp_path / "c",
        model=tiny_model(len(tokenizer)),
        tokenizer=tokenizer,
        optimizer_state=None,
        state=state(1),
    )
    expected = torch.rand(3)
    torch.rand(5)
    load_rng(folder)
    assert torch.equal(torch.rand(3), expected)
