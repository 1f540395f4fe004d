"""The workload through TRL's ``GRPOTrainer``, set up to do what the rstar2 stage does.

The prompts are rstar2's rendered first turns (the chat template with the reasoning prefill),
passed to TRL as plain-text prompts, and generation stops at the same stop tokens. The reward is
rstar2-eval's grader on the completion, 0 when the completion ran out of budget, as in rstar2.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from arms import RunSpec
from datasets import Dataset
from rstar2_side import warm_grader
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl import GRPOConfig, GRPOTrainer
from workload import Prepared, StepRecord

from rstar2_data import MathProblem
from rstar2_data.rows import read_rows
from rstar2_eval import GraderConfig
from rstar2_scheduler import ChatConfig, ChatProtocol
from rstar2_scheduler.protocol.conversation import Conversation


def grpo_config(prepared: Prepared, *, steps: int, out_dir: Path) -> GRPOConfig:
    """TRL's settings for the workload, on the CPU and in fp32 like the rstar2 stage."""
    w = prepared.workload
    batch = w.prompts_per_step * w.generations
    return GRPOConfig(
        output_dir=str(out_dir),
        seed=w.seed,
        use_cpu=True,
        bf16=False,
        max_steps=steps,
        # One generation batch of prompts_per_step x generations completions, one optimizer
        # step on it (no gradient accumulation, no reuse of the batch).
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=w.generations,
        shuffle_dataset=False,
        max_completion_length=w.max_new_tokens,
        temperature=w.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=w.grad_clip,
        beta=0.0,  # no KL term, so no reference model
        epsilon=w.eps_low,
        epsilon_high=w.eps_high,
        loss_type="dapo",  # token-mean over the whole batch: rstar2's token-mean
        scale_rewards="group",
        # TRL's GRPOConfig turns gradient checkpointing on by default; the rstar2 stage does
        # not use it (the model is tiny), so it is off here too.
        gradient_checkpointing=False,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )


def rendered_prompts(
    prepared: Prepared, tokenizer: Any
) -> tuple[list[str], list[str], ChatProtocol]:
    """Each problem's first-turn prompt, exactly as rstar2's rollouts render it, and its answer."""
    chat = ChatProtocol(tokenizer, ChatConfig())
    prompts, answers = [], []
    for problem in read_rows(prepared.problems, kind="math"):
        assert isinstance(problem, MathProblem)
        conversation = Conversation(chat, chat.initial_messages(problem.problem))
        text = tokenizer.decode(conversation.prompt_ids)
        # TRL tokenizes text prompts itself (``processing_class(text=...)``); check that it gets
        # rstar2's ids back.
        if tokenizer(text=text)["input_ids"] != conversation.prompt_ids:
            raise ValueError(f"problem {problem.id}: the rendered prompt does not round-trip")
        prompts.append(text)
        answers.append(problem.answer)
    return prompts, answers, chat


class _StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.logs: list[dict[str, float]] = []

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.stamps.append(time.perf_counter())

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kw: Any,
    ) -> None:
        if logs is not None and "reward" in logs:
            self.logs.append(dict(logs))


def _timed_generate(
    generate: Callable[..., Any], threads: int, seconds: list[float]
) -> Callable[..., Any]:
    """``generate`` on ``threads`` torch threads (the update keeps torch's setting, as the rstar2
    engine does), its wall time appended to ``seconds``."""

    @functools.wraps(generate)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)
            torch.set_num_threads(previous)

    return wrapped


def run_trl(prepared: Prepared, spec: RunSpec, *, steps: int, out_dir: Path) -> list[StepRecord]:
    """Train ``steps`` steps with ``GRPOTrainer``; one record per step."""
    tokenizer = AutoTokenizer.from_pretrained(prepared.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(prepared.checkpoint, dtype=torch.float32)
    prompts, answers, chat = rendered_prompts(prepared, tokenizer)
    stops = list(chat.stop_token_ids)
    # TRL stops generation, and ends the completion mask, at the model's eos ids.
    model.generation_config.eos_token_id = stops
    # GRPOTrainer generates with the unwrapped model's generate (no vLLM, no paged batching).
    generating: list[float] = []
    generate = model.generate  # type: ignore[misc]  # transformers' generation mixin typing
    model.generate = _timed_generate(  # type: ignore[method-assign,misc]
        generate, spec.generation_threads, generating
    )
    grader = warm_grader(GraderConfig(workers=1))  # rl.grader.workers of the tiny-rl stage
    # Per step: (completions, their tokens, grading seconds). Every completion enters TRL's
    # loss (no group is dropped) and its completion_ids are the masked tokens, stop included.
    batches: list[tuple[int, int, float]] = []

    def reward(
        completions: list[str], completion_ids: list[list[int]], answer: list[str], **kw: Any
    ) -> list[float | None]:
        started = time.perf_counter()
        grades = grader.grade_many(completions, answer)
        batches.append(
            (len(completions), sum(map(len, completion_ids)), time.perf_counter() - started)
        )
        return [
            1.0 if grade.correct and ids and ids[-1] in stops else 0.0
            for grade, ids in zip(grades, completion_ids, strict=True)
        ]

    clock = _StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo_config(prepared, steps=steps, out_dir=out_dir),
        train_dataset=Dataset.from_dict({"prompt": prompts, "answer": answers}),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    try:
        started = time.perf_counter()
        # Trainer prints its logs when its progress bar is off: keep stdout for the results.
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
    finally:
        grader.close()
    if not len(clock.stamps) == len(generating) == len(batches):
        raise RuntimeError(
            f"TRL ran {len(clock.stamps)} steps but {len(generating)} generate calls and "
            f"{len(batches)} reward calls: the per-step records would not line up"
        )
    records = []
    previous = started
    for stamp, logs, generate_s, (rollouts, tokens, reward_s) in zip(
        clock.stamps, clock.logs, generating, batches, strict=True
    ):
        records.append(
            StepRecord(
                seconds=stamp - previous,
                reward=logs["reward"],
                completion_tokens=logs["completions/mean_length"],
                trained_rollouts=float(rollouts),
                trained_tokens=float(tokens),
                phases={"time/generate_s": generate_s, "time/reward_s": reward_s},
            )
        )
        previous = stamp
    return records
