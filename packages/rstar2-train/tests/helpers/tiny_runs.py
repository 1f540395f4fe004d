"""Tiny demo data and the tiny stage configs the tests run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rstar2_train import StageConfig, load_config


@dataclass(frozen=True)
class DemoData:
    transcripts: Path
    problems: Path


def sft_config(data: DemoData, output: Path, *overrides: str) -> StageConfig:
    """tiny-sft on the three transcripts, overfitting them."""
    return load_config(
        "tiny-sft",
        [
            f"output_dir={output}",
            f"data.train.file={data.transcripts}",
            "data.train.recipe=null",
            "tokenizer.train.vocab_size=512",
            "tokenizer.train.samples=null",
            "sft.max_steps=120",
            "sft.batch_size=3",
            "optimizer.lr=1e-2",
            "checkpoint.every_steps=60",
            *overrides,
        ],
    )


def rl_config(data: DemoData, model: Path, output: Path, *overrides: str) -> StageConfig:
    """tiny-rl on the same three problems from ``model``."""
    return load_config(
        "tiny-rl",
        [
            f"output_dir={output}",
            f"model.path={model}",
            f"data.train.file={data.problems}",
            "data.train.recipe=null",
            "rl.steps=2",
            "rl.prompts_per_step=3",
            "rl.rollouts_per_prompt=6",
            "rl.roc.keep=3",
            "checkpoint.every_steps=1",
            *overrides,
        ],
    )
