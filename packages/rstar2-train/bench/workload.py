"""The one GRPO workload both frameworks run: data, starting weights and shared settings.

The policy starts from a tiny Qwen3 (the shipped ``tiny-sft`` architecture) fine-tuned briefly by
rstar2's own SFT trainer on single-turn answers to the benchmark's problems, so that sampling at
temperature 1.0 answers correctly some of the time and most responses end before the token
budget. Both frameworks then load that checkpoint (weights and tokenizer) from disk.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data import ChatExample, ChatMessage, python_tool_schema
from rstar2_data.demo import generate_tasks, to_problem
from rstar2_data.rows import rows_bytes
from rstar2_train import load_config, run_stage

logger = logging.getLogger("rstar2_train.bench")


class Workload(BaseModel):
    """One GRPO configuration, as both frameworks are given it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problems: int = Field(default=16, ge=1, description="Distinct problems, used in file order.")
    prompts_per_step: int = Field(default=4, ge=1)
    generations: int = Field(default=8, ge=2, description="Rollouts per prompt (the group).")
    max_new_tokens: int = Field(default=128, ge=8, description="Response budget per rollout.")
    temperature: float = Field(default=1.0, gt=0)
    lr: float = Field(default=1e-5, gt=0, description="AdamW, constant, no warm-up.")
    grad_clip: float = Field(default=1.0, gt=0)
    eps_low: float = 0.2
    eps_high: float = 0.28
    seed: int = 0
    sft_steps: int = Field(default=150, ge=1, description="SFT steps making the start weights.")


class Prepared(BaseModel):
    """Files made once per benchmark run and read by every measured run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: Workload
    problems: Path
    """RL problems (rstar2-data ``math`` rows, JSONL)."""
    checkpoint: Path
    """The starting policy and its tokenizer (Hugging Face format)."""

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Prepared:
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))


class StepRecord(BaseModel):
    """One measured training step of either framework."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float
    """Wall time from the previous step's end (or the trainer's start) to this step's end."""
    reward: float
    """Mean reward of the step's rollouts."""
    completion_tokens: float
    """Mean generated tokens per rollout (the stop token included)."""
    trained_rollouts: float
    """Rollouts in the step's loss (zero-advantage ones included where the framework keeps
    them: they add nothing to the gradient but count in the token-mean's denominator)."""
    trained_tokens: float
    """Tokens in the step's loss (its token-mean's denominator)."""
    phases: dict[str, float] = Field(default_factory=dict)
    """The framework's own per-phase timings for the step, where it reports them."""


def _answer_text(answer: int) -> str:
    """A single-turn response in the agent protocol (the prompt pre-fills ``<reason>``)."""
    return (
        f"<reason>\nThe product is {answer}.\n</reason>\n<answer>\n\\boxed{{{answer}}}\n</answer>"
    )


def prepare(workload: Workload, folder: Path) -> Prepared:
    """Write the problems and SFT transcripts, and train the starting checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = generate_tasks(
        workload.problems, seed=workload.seed, levels=(1,), families=["multiply"]
    )
    problems = [to_problem(task, problem_id=f"bench-{i}") for i, task in enumerate(tasks)]
    transcripts = [
        ChatExample(
            id=f"bench-sft-{i}",
            source="rstar2/bench",
            messages=[
                ChatMessage(role="user", content=task.problem),
                ChatMessage(role="assistant", content=_answer_text(task.answer)),
            ],
            tools=[python_tool_schema()],
        )
        for i, task in enumerate(tasks)
    ]
    problems_file = folder / "problems.jsonl"
    sft_file = folder / "sft.jsonl"
    problems_file.write_bytes(rows_bytes(problems, kind="math", fmt="jsonl"))
    sft_file.write_bytes(rows_bytes(transcripts, kind="chat", fmt="jsonl"))
    logger.info("SFT of the starting policy (%d steps)", workload.sft_steps)
    config = load_config(
        "tiny-sft",
        [
            f"output_dir={folder / 'sft'}",
            f"seed={workload.seed}",
            f"data.train.file={sft_file}",
            "data.train.recipe=null",
            "tokenizer.train.vocab_size=512",
            "tokenizer.train.samples=null",
            f"sft.max_steps={workload.sft_steps}",
            f"sft.batch_size={workload.problems}",
            "optimizer.lr=1e-2",
            "checkpoint.every_steps=null",
            "logging.plots=false",
        ],
    )
    checkpoint = run_stage(config)
    return Prepared(workload=workload, problems=problems_file, checkpoint=checkpoint)
