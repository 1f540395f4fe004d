"""The policy update of one RL step: log-probs recomputed by the trainer, then the clipped loss.

The engines' sampling log-probs travel with each rollout. The trainer recomputes the log-probs
of the same tokens under the same weights (the "old" policy of the clipped ratio, since the step
is on-policy); the gap between the two is logged, and with ``loss.tis_cap`` each token's loss is
weighted by ``min(p_trainer / p_engine, cap)`` (truncated importance sampling). With bounded
staleness the rollouts come from older policies: the recomputed log-probs are the proximal
policy of the decoupled objective, and each token's loss is weighted by the behaviour weight
``min(pi_prox / pi_behav, behaviour_cap)`` (rstar2-algo's ``behaviour_weights``; the same
weight as TIS, which it replaces). With one mini-batch and no weights, the old log-probs are
the update's own forward pass, detached (the ratio is exactly 1), so no separate pass is run.
The loss of every micro-batch is normalised by the whole mini-batch's token (or sequence)
count, so gradient accumulation gives the loss of the full batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rstar2_algo import WeightStats, behaviour_weights, policy_loss
from rstar2_train.actor import LossFn, MetricSums, TrainingActor
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import RLConfig
from rstar2_train.rl.rollouts import ScoredRollout
from rstar2_train.rl.selection import Selection

ENGINE_LOGPROBS = "engine_logprobs"


def training_sequences(
    rollouts: Sequence[ScoredRollout], selection: Selection
) -> list[TokenSequence]:
    """Kept rollouts as sequences: prompt + response ids, the rollout's loss mask, the engine's
    sampling log-probs and, where the rollouts kept them, the tokens' sampling supports (the
    trainer's log-probs are then renormalised over the same ids), all aligned with the ids."""
    out = []
    for position in selection.kept:
        trajectory = rollouts[position].trajectory
        prompt = [0] * len(trajectory.prompt_ids)
        out.append(
            TokenSequence(
                ids=trajectory.input_ids,
                mask=prompt + trajectory.loss_mask,
                token_values={ENGINE_LOGPROBS: [0.0] * len(prompt) + trajectory.logprobs},
                support=None
                if trajectory.support is None
                else [[] for _ in prompt] + trajectory.support,
            )
        )
    return out


@dataclass(frozen=True)
class BehaviourCorrection:
    """Per-token weights ``min(p_trainer / p_engine, cap)`` on the loss, 0 outside ``band``:
    TIS in the synchronous loop, the decoupled objective's behaviour weight with staleness."""

    cap: float
    band: tuple[float, float] | None = None
    prefix: str = "behaviour/"
    """Where its statistics are logged."""


def correction(config: RLConfig) -> BehaviourCorrection | None:
    """The synchronous loop's weights: TIS when ``loss.tis_cap`` is set, else none."""
    cap = config.loss.tis_cap
    return None if cap is None else BehaviourCorrection(cap, prefix="tis/")


@dataclass(frozen=True)
class _MiniBatch:
    batches: list[MicroBatch]
    advantages: list[torch.Tensor]
    old: list[torch.Tensor] | None
    """Old log-probs per micro-batch; ``None`` when the old policy is the one being updated, so
    that the update's own forward pass (detached) gives them."""
    weights: list[torch.Tensor] = field(default_factory=list)
    """Per micro-batch: the tokens' weights on the loss (empty: no weights)."""


def _split(count: int, parts: int, seed: int) -> list[list[int]]:
    """``parts`` mini-batches of sequence positions (seeded shuffle when there are several)."""
    order = list(range(count))
    if parts > 1:
        random.Random(seed).shuffle(order)
    size = -(-count // parts)
    return [order[i : i + size] for i in range(0, count, size)]


def _mismatch(batch: MicroBatch, logprobs: torch.Tensor) -> dict[str, float]:
    """The trainer/engine log-prob gap over a micro-batch's trained tokens."""
    trained = batch.mask.bool()
    gap = (logprobs.detach() - batch.token_values[ENGINE_LOGPROBS])[trained]
    if gap.numel() == 0:
        return {}
    return {
        "mismatch/logprob_abs_mean": float(gap.abs().mean()),
        "mismatch/logprob_abs_max": float(gap.abs().max()),
        "mismatch/ratio_mean": float(torch.exp(gap).mean()),
    }


def _loss(mini: _MiniBatch, config: RLConfig) -> LossFn:
    """The clipped loss of a micro-batch, normalised over the whole mini-batch."""
    loss_config = config.loss
    token_count = sum(batch.tokens for batch in mini.batches)
    # token-mean divides by the mini-batch's tokens; the sequence modes by its sequences (and
    # Dr. GRPO's token sums by the response budget).
    counts: dict[str, int]
    if loss_config.aggregation == "token-mean":
        counts = {"token_count": token_count}
    else:
        counts = {"seq_count": sum(int((b.mask.sum(-1) > 0).sum()) for b in mini.batches)}
    if loss_config.aggregation == "seq-mean-token-sum-norm":
        counts["norm_length"] = config.rollout.max_response_tokens

    def loss(
        index: int, batch: MicroBatch, logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        old = logprobs.detach() if mini.old is None else mini.old[index]
        result = policy_loss(
            logprobs,
            old,
            mini.advantages[index],
            batch.mask,
            eps_low=loss_config.eps_low,
            eps_high=loss_config.eps_high,
            dual_clip=loss_config.dual_clip,
            agg=loss_config.aggregation,
            weights=mini.weights[index] if mini.weights else None,
            **counts,
        )
        metrics = result.metrics("actor/")
        # Weighted by this micro-batch's tokens downstream, so the mean is the mini-batch loss.
        metrics["actor/pg_loss"] = float(result.loss.detach()) * token_count / max(batch.tokens, 1)
        if mini.old is None:
            metrics.update(_mismatch(batch, old))
        return result.loss, metrics

    return loss


def policy_update(
    actor: TrainingActor,
    sequences: Sequence[TokenSequence],
    advantages: Sequence[float],
    config: RLConfig,
    *,
    temperature: float,
    pad_id: int,
    seed: int,
    behaviour: BehaviourCorrection | None = None,
) -> dict[str, float]:
    """``config.ppo_mini_batches`` optimizer steps; returns metrics.

    ``behaviour`` weights each token's loss (default: the synchronous loop's, TIS when
    ``loss.tis_cap`` is set). The old log-probs need a separate forward pass only when the
    policy moves before a mini-batch is trained on (several mini-batches) or when weights
    depend on them; otherwise the update's own pass gives them.
    """
    behaviour = behaviour or correction(config)
    separate_pass = config.ppo_mini_batches > 1 or behaviour is not None
    minis: list[_MiniBatch] = []
    for members in _split(len(sequences), config.ppo_mini_batches, seed):
        chosen = [sequences[i] for i in members]
        batches = micro_batches(
            chosen,
            config.micro_batch_tokens,
            packing=config.packing,
            pad_id=pad_id,
            device=actor.device,
            share_prefixes=config.shared_prefix,
        )
        per_sequence = torch.tensor([advantages[i] for i in members], dtype=torch.float32)
        token_advantages = [
            per_sequence[batch.members].to(actor.device).unsqueeze(-1).expand_as(batch.mask)
            for batch in batches
        ]
        minis.append(_MiniBatch(batches, token_advantages, [] if separate_pass else None))
    metrics = _recompute(actor, minis, behaviour, temperature) if separate_pass else {}
    updates = []
    for mini in minis:
        updates.append(actor.update(mini.batches, _loss(mini, config), temperature=temperature))
    for name in sorted({name for update in updates for name in update.metrics}):
        values = [u.metrics[name] for u in updates if name in u.metrics]
        metrics[name] = max(values) if name.endswith("_max") else sum(values) / len(values)
    metrics["actor/grad_norm"] = sum(u.grad_norm for u in updates) / len(updates)
    metrics["actor/lr"] = updates[-1].lr
    metrics["actor/skipped_steps"] = float(sum(u.skipped for u in updates))
    metrics["actor/mini_batches"] = float(len(updates))
    return metrics


def _recompute(
    actor: TrainingActor,
    minis: list[_MiniBatch],
    behaviour: BehaviourCorrection | None,
    temperature: float,
) -> dict[str, float]:
    """Fill each mini-batch's old log-probs (and weights); returns mismatch and weight
    metrics."""
    sums = MetricSums()
    tokens = 0
    stats: WeightStats | None = None
    for mini in minis:
        assert mini.old is not None
        old = actor.logprobs(mini.batches, temperature=temperature)
        mini.old.extend(old)
        for batch, logprobs in zip(mini.batches, old, strict=True):
            sums.add(_mismatch(batch, logprobs), batch.tokens)
            tokens += batch.tokens
            if behaviour is not None:
                weights = behaviour_weights(
                    logprobs,
                    batch.token_values[ENGINE_LOGPROBS],
                    batch.mask,
                    cap=behaviour.cap,
                    band=behaviour.band,
                )
                mini.weights.append(weights.weights)
                stats = weights.stats if stats is None else stats + weights.stats
    metrics = sums.means(tokens)
    if stats is not None:
        metrics.update(stats.metrics(behaviour.prefix if behaviour is not None else ""))
    return metrics
