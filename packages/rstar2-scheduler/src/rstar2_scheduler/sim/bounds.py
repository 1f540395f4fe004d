"""A lower bound on a simulated rollout phase's makespan, from the plan and the cost model.

No schedule can beat either term of ``max(work / engines, critical path)``:

- work: the engine time the tokens need at the best possible efficiency: every prompt prefilled
  once (the rollouts of a prompt share its cached prefix), every tool response prefilled once,
  every output token decoded once at its context length, and the fewest decode steps that can
  produce the tokens, each paying the fixed step cost. A step decodes one token for each of at
  most ``max_num_seqs`` sequences, and those sequences' contexts must fit in the KV cache
  together; so, summed over all engines, there are at least ``tokens / max_num_seqs`` steps and
  at least ``(sum of the contexts the tokens are decoded at) / KV capacity`` steps. No
  preemption, no cache miss, no idle engine.
- critical path: the longest rollout alone on an engine (batch of one) plus its tool calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.sim.engine import SimEngineConfig
from rstar2_scheduler.sim.workload import RolloutPlan


class LowerBound(BaseModel):
    """The two terms of the makespan lower bound and the bound itself, in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    work_s: float = Field(description="Engine time of the whole phase at full efficiency.")
    engines: int = Field(gt=0)
    critical_path_s: float = Field(description="Longest single rollout, alone on an engine.")

    @property
    def balanced_s(self) -> float:
        return self.work_s / self.engines

    @property
    def bound_s(self) -> float:
        return max(self.balanced_s, self.critical_path_s)


def _decode_attention_tokens(context: int, output: int) -> int:
    """Sum of the context lengths over the decode steps of one turn."""
    return output * context + output * (output - 1) // 2


def lower_bound(plans: Sequence[RolloutPlan], engine: SimEngineConfig, engines: int) -> LowerBound:
    work = 0.0
    longest = 0.0
    decoded = held = 0  # output tokens, and the KV tokens held while each was decoded
    prompts_seen: set[int] = set()
    for plan in plans:
        alone = plan.prompt_tokens * engine.prefill_s_per_token
        if plan.prompt_index not in prompts_seen:
            prompts_seen.add(plan.prompt_index)
            work += plan.prompt_tokens * engine.prefill_s_per_token
        for turn in plan.turns:
            contexts = _decode_attention_tokens(turn.context_tokens, turn.output_tokens)
            decoded += turn.output_tokens
            held += contexts
            attention = engine.attention_s_per_token * contexts
            tool_prefill = turn.tool_tokens * engine.prefill_s_per_token
            work += turn.output_tokens * engine.decode_s_per_seq + attention + tool_prefill
            alone += (
                turn.output_tokens * (engine.decode_s_per_seq + engine.step_overhead_s)
                + attention
                + tool_prefill
                + (turn.tool_latency_s or 0.0)
            )
        longest = max(longest, alone)
    steps = max(decoded / engine.max_num_seqs, held / engine.capacity_tokens)
    work += steps * engine.step_overhead_s
    return LowerBound(work_s=work, engines=engines, critical_path_s=longest)
