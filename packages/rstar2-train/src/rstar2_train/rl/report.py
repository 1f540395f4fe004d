"""What an RL step logs about its rollouts, and a few of them as readable conversations."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2_data.jsonl import atomic_write_text
from rstar2_train.rl.rollouts import RolloutPhaseResult, ScoredRollout
from rstar2_train.rl.selection import Selection


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _error_ratio(rollouts: Sequence[ScoredRollout]) -> float:
    """Failed tool calls / tool calls, pooled (NaN without any tool call)."""
    calls = sum(r.trajectory.quality.tool_calls for r in rollouts)
    failed = sum(r.trajectory.quality.failed_tool_calls for r in rollouts)
    return failed / calls if calls else float("nan")


def rollout_metrics(phase: RolloutPhaseResult, selection: Selection) -> dict[str, float]:
    """Rewards, groups, tool use, format and lengths of one step's rollouts."""
    rollouts = phase.rollouts
    positives = [r for r in rollouts if r.reward > 0]
    qualities = [r.trajectory.quality for r in rollouts]
    lengths = [float(len(r.trajectory.response_ids)) for r in rollouts]
    kept_groups = len({rollouts[i].prompt for i in selection.kept})
    metrics = {
        "reward/mean": _mean([r.reward for r in rollouts]),
        "reward/accuracy": _mean([float(r.grade.correct) for r in rollouts]),
        "rollouts/total": float(len(rollouts) + phase.failed),
        "rollouts/failed": float(phase.failed),
        "rollouts/kept": float(len(selection.kept)),
        "groups/total": float(selection.groups),
        "groups/kept": float(kept_groups),
        "groups/kept_fraction": kept_groups / selection.groups if selection.groups else 0.0,
        "tools/calls_per_rollout": _mean([float(q.tool_calls) for q in qualities]),
        "tools/error_ratio": _error_ratio(rollouts),
        "tools/error_ratio_all_positives": _error_ratio(positives),
        "tools/error_ratio_kept_positives": _error_ratio(
            [rollouts[i] for i in selection.kept if rollouts[i].reward > 0]
        ),
        "format/no_answer_ratio": _mean([float(q.answer_tags == 0) for q in qualities]),
        "format/penalized_positives_ratio": _mean(
            [float(r.trajectory.quality.format_penalty > 0) for r in positives]
        ),
        "response/length_mean": _mean(lengths),
        "response/length_max": max(lengths, default=float("nan")),
        "response/model_tokens_mean": _mean([float(sum(r.trajectory.loss_mask)) for r in rollouts]),
        "response/turns_mean": _mean([float(q.turns) for q in qualities]),
        "response/truncation_rate": _mean([float(q.truncated) for q in qualities]),
        "time/rollout_s": phase.rollout_s,
        "time/reward_s": phase.grading_tail_s,
        "throughput/model_tokens_per_s": sum(sum(r.trajectory.loss_mask) for r in rollouts)
        / max(phase.rollout_s, 1e-9),
    }
    for reason, count in selection.dropped.items():
        metrics[f"groups/dropped_{reason.value}"] = float(count)
    metrics.update(selection.roc.metrics("roc/"))
    return metrics


def _pick(rollouts: Sequence[ScoredRollout], count: int) -> list[ScoredRollout]:
    """Up to ``count`` rollouts, alternating correct and incorrect ones, in step order."""
    right = [r for r in rollouts if r.reward > 0]
    wrong = [r for r in rollouts if r.reward <= 0]
    picked: list[ScoredRollout] = []
    while len(picked) < count and (right or wrong):
        for side in (right, wrong):
            if side and len(picked) < count:
                picked.append(side.pop(0))
    return picked


def render_rollout(rollout: ScoredRollout) -> str:
    """One rollout as Markdown: the problem, every model turn and every tool response."""
    trajectory = rollout.trajectory
    quality = trajectory.quality
    lines = [
        f"## {trajectory.rollout_id}: reward {rollout.reward:g}",
        "",
        f"- problem `{rollout.problem.id}`; gold answer `{rollout.problem.answer}`; graded "
        f"answer `{rollout.grade.answer}` ({rollout.grade.status})",
        f"- stop: {trajectory.stop_reason}; {quality.turns} turns; {quality.tool_calls} tool "
        f"calls, {quality.failed_tool_calls} failed; {len(trajectory.response_ids)} response "
        "tokens",
        "",
        "**Problem**",
        "",
        rollout.problem.problem,
        "",
    ]
    for turn in trajectory.turns:
        lines += [f"**Turn {turn.index + 1}** (model, {turn.model_tokens} tokens)", ""]
        lines += ["```text", turn.text, "```", ""]
        if turn.parse_error is not None:
            lines += [f"tool call did not parse: {turn.parse_error}", ""]
        if turn.tool_response is not None:
            status = turn.sandbox_status.value if turn.sandbox_status is not None else "not run"
            lines += [f"**Tool response** ({status})", "", "```text", turn.tool_response, "```", ""]
    return "\n".join(lines)


def write_samples(
    path: Path, step: int, rollouts: Sequence[ScoredRollout], count: int
) -> list[ScoredRollout]:
    """A few of the step's rollouts, readable, in ``path``; returns them."""
    picked = _pick(rollouts, count)
    if not picked:
        return picked
    body = "\n\n".join(render_rollout(r) for r in picked)
    atomic_write_text(path, f"# Step {step}: {len(picked)} of {len(rollouts)} rollouts\n\n{body}\n")
    return picked


def sample_rows(rollouts: Sequence[ScoredRollout]) -> list[dict[str, Any]]:
    """Rollouts as table rows (W&B): figures to sort by, and the conversation as Markdown."""
    return [
        {
            "rollout": r.trajectory.rollout_id,
            "problem": r.problem.id,
            "reward": r.reward,
            "gold": r.problem.answer,
            "answer": r.grade.answer or "",
            "grade": r.grade.status,
            "turns": r.trajectory.quality.turns,
            "tool_calls": r.trajectory.quality.tool_calls,
            "failed_tool_calls": r.trajectory.quality.failed_tool_calls,
            "response_tokens": len(r.trajectory.response_ids),
            "conversation": render_rollout(r),
        }
        for r in rollouts
    ]
