"""The workload through rstar2-train: a ``kind: rl`` stage run in this process."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from arms import RunSpec
from workload import Prepared, StepRecord

from rstar2_algo import GroupFilter, GroupIds
from rstar2_eval import Grader, GraderConfig
from rstar2_train import load_config, run_stage
from rstar2_train.rl import selection
from rstar2_train.stage import StageRun


def stage_overrides(prepared: Prepared, *, steps: int, out_dir: Path) -> list[str]:
    """``tiny-rl`` turned into the shared workload: one turn, plain GRPO (RoC off), no KL."""
    w = prepared.workload
    return [
        f"output_dir={out_dir}",
        f"seed={w.seed}",
        f"model.path={prepared.checkpoint}",
        f"data.train.file={prepared.problems}",
        "data.train.recipe=null",
        "data.shuffle=false",  # file order, as TRL's shuffle_dataset=False
        f"optimizer.lr={w.lr}",
        "optimizer.weight_decay=0.0",
        f"optimizer.grad_clip={w.grad_clip}",
        "schedule.kind=constant",
        "schedule.warmup_steps=0",
        f"rl.steps={steps}",
        f"rl.prompts_per_step={w.prompts_per_step}",
        f"rl.rollouts_per_prompt={w.generations}",
        "rl.roc.strategy=none",
        f"rl.roc.keep={w.generations}",
        f"rl.loss.eps_low={w.eps_low}",
        f"rl.loss.eps_high={w.eps_high}",
        "rl.loss.aggregation=token-mean",
        # A group's rollouts share micro-batches that run its prompt once (rl.shared_prefix, the
        # default); anything left is padded, as TRL's: a packed row attends through a dense
        # block-diagonal mask with sdpa, quadratic in the row's length.
        "rl.packing=false",
        "rl.rollout.max_turns=1",
        f"rl.rollout.max_response_tokens={w.max_new_tokens}",
        f"rl.rollout.temperature={w.temperature}",
        f"rl.engines.max_batch_size={w.prompts_per_step * w.generations}",
        "checkpoint.every_steps=null",
        "logging.plots=false",
        "logging.sample_rollouts=0",
    ]


def warm_grader(config: GraderConfig) -> Grader:
    """A grader whose math-verify workers have started (about 2 s, once per run).

    The TRL side starts its grader with this before its first step, as an rstar2 stage warms its
    own grading while its engines start, so that this start-up lands in neither side's steps.
    """
    grader = Grader(config)
    grader.warm_up()
    return grader


def spec_overrides(spec: RunSpec) -> list[str]:
    """The stage settings a run setting changes (``all_groups`` is no setting: see below)."""
    overrides = [f"rl.engines.torch_threads={spec.generation_threads}"]
    if not spec.shared_prefix:
        overrides.append("rl.shared_prefix=false")
    return overrides


def _keep_every_group(rewards: torch.Tensor | Sequence[float], group_ids: GroupIds) -> GroupFilter:
    """A ``filter_groups`` that drops nothing: all-equal groups go on to advantage 0."""
    labels = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    return GroupFilter(kept=torch.arange(len(labels)), dropped=(), num_groups=len(set(labels)))


def _all_groups(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """While active, the stage trains all-equal groups (advantage exactly 0) as TRL does.

    For the comparison only: the trainer has no such setting, since such groups carry no GRPO
    signal; they only add rows to the update and tokens to the token-mean's denominator.
    """
    if not enabled:
        return contextlib.nullcontext()
    return mock.patch.object(selection, "filter_groups", _keep_every_group)


def run_rstar2(prepared: Prepared, spec: RunSpec, *, steps: int, out_dir: Path) -> list[StepRecord]:
    """Train ``steps`` steps; one record per step, stamped when the step's logging is done."""
    config = load_config(
        "tiny-rl",
        [*stage_overrides(prepared, steps=steps, out_dir=out_dir), *spec_overrides(spec)],
    )
    stamps: list[tuple[float, float, dict[str, float]]] = []
    saving = 0.0
    after_step, save = StageRun.after_step, StageRun.save

    # The stage loop has no callback API; wrapping after_step stamps the end of each step
    # (rollouts, update, weight sync and logging, as TRL's on_step_end does on its side). The
    # stage always checkpoints its last step; TRL here saves nothing, so time spent in
    # checkpoints is taken out of the step it falls in.
    def timed_save(self: StageRun, *args: Any, **kwargs: Any) -> Any:
        nonlocal saving
        started = time.perf_counter()
        try:
            return save(self, *args, **kwargs)
        finally:
            saving += time.perf_counter() - started

    def stamped(self: StageRun, step: int, total: int, metrics: dict[str, float]) -> None:
        after_step(self, step, total, metrics)
        stamps.append((time.perf_counter(), saving, dict(metrics)))

    StageRun.after_step = stamped  # type: ignore[method-assign]
    StageRun.save = timed_save  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        with _all_groups(spec.all_groups):
            run_stage(config)
    finally:
        StageRun.after_step, StageRun.save = after_step, save  # type: ignore[method-assign]
    records = []
    previous, saved = started, 0.0
    for stamp, saved_by_then, metrics in stamps:
        records.append(
            StepRecord(
                seconds=stamp - previous - (saved_by_then - saved),
                reward=metrics.get("reward/mean", float("nan")),
                completion_tokens=metrics.get("response/length_mean", float("nan")),
                trained_rollouts=metrics["rollouts/kept"],
                trained_tokens=metrics["actor/trained_tokens"],
                phases={k: v for k, v in metrics.items() if k.startswith("time/")},
            )
        )
        previous, saved = stamp, saved_by_then
    return records
