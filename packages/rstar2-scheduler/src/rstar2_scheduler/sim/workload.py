"""A simulated agentic-RL rollout phase: prompts, rollouts per prompt, multi-turn tool use.

Every rollout is planned up front from the seed (turn lengths, which turns call the tool, tool
latency and tool-response size), so each policy replays exactly the same work and the lower
bound can be computed without running anything. A simulated rollout then drives an engine the
way the real rollout loop does: generate, wait on the tool, append its response, generate again
on the same engine, until a turn makes no tool call, the turn limit, or the shared response
budget is spent.
"""

from __future__ import annotations

import asyncio
import random
from array import array
from collections.abc import Callable, Mapping
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.engine import Engine, GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.sim.distributions import LogNormal
from rstar2_scheduler.sim.lockstep import TurnBarrier


class WorkloadConfig(BaseModel):
    """A paper-like rollout phase (rStar2-Agent stage 1: 8K budget, up to 10 turns)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(default=512, gt=0, description="Problems in the phase.")
    rollouts_per_prompt: int = Field(default=32, gt=0, description="Rollouts per problem.")
    prompt_tokens: LogNormal = Field(
        default=LogNormal(median=300, sigma=0.4, minimum=64, maximum=2048),
        description="Prompt length (system prompt, tools and problem).",
    )
    response_budget: int = Field(
        default=8192, gt=0, description="Tokens all turns of a rollout may use, tool output too."
    )
    max_turns: int = Field(default=10, gt=0, description="Most model turns per rollout.")
    turn_tokens: LogNormal = Field(
        default=LogNormal(median=500, sigma=1.0),
        description="Tokens a model turn generates before the budget cuts it.",
    )
    tool_call_probability: float = Field(
        default=0.7, ge=0, le=1, description="Chance that a turn ends in a tool call."
    )
    tool_latency_s: LogNormal = Field(
        default=LogNormal(median=0.25, sigma=0.6),
        description="Tool-call round trip (mean 0.3 s by default).",
    )
    tool_response_tokens: LogNormal = Field(
        default=LogNormal(median=80, sigma=0.5, minimum=16, maximum=256),
        description="Tool response plus the template glue around it.",
    )
    seed: int = 0

    @property
    def rollouts(self) -> int:
        return self.prompts * self.rollouts_per_prompt


class PlannedTurn(BaseModel):
    """One model turn and the tool call that may follow it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(description="Sampling seed: SimEngine draws the turn length from it.")
    context_tokens: int = Field(description="Prompt length of this turn's request.")
    output_tokens: int
    tool_latency_s: float | None = Field(description="None: the turn makes no tool call.")
    tool_tokens: int = Field(description="Tool-response tokens appended (0: not appended).")


class RolloutPlan(BaseModel):
    """Everything one simulated rollout will do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    prompt_index: int
    prompt_tokens: int
    turns: list[PlannedTurn]
    truncated: bool = Field(description="The response budget ran out.")

    @property
    def response_tokens(self) -> int:
        return sum(t.output_tokens + t.tool_tokens for t in self.turns)


def synthetic_ids(seed: int | str, count: int) -> tuple[int, ...]:
    """Deterministic pseudo-random token ids standing in for text."""
    return tuple(array("H", random.Random(seed).randbytes(2 * count)))


class Workload:
    """The planned rollouts of a ``WorkloadConfig``, and the simulated agent that runs them."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config

    @cached_property
    def prompts(self) -> list[tuple[int, ...]]:
        cfg = self.config
        return [
            synthetic_ids(
                f"{cfg.seed}:prompt:{p}",
                cfg.prompt_tokens.sample_int(random.Random(f"{cfg.seed}:prompt-len:{p}")),
            )
            for p in range(cfg.prompts)
        ]

    @cached_property
    def plans(self) -> list[RolloutPlan]:
        return [self._plan(index) for index in range(self.config.rollouts)]

    def kv_tokens(self, plan: RolloutPlan) -> int:
        """The KV reservation a rollout declares: its prompt plus the whole response budget."""
        return plan.prompt_tokens + self.config.response_budget

    def _plan(self, index: int) -> RolloutPlan:
        cfg = self.config
        prompt_index = index // cfg.rollouts_per_prompt
        context = len(self.prompts[prompt_index])
        rng = random.Random(f"{cfg.seed}:rollout:{index}")
        used = 0
        turns: list[PlannedTurn] = []
        truncated = False
        for turn in range(cfg.max_turns):
            seed = rng.getrandbits(62)
            remaining = cfg.response_budget - used
            drawn = cfg.turn_tokens.sample_int(random.Random(seed))  # as SimEngine draws it
            output = min(drawn, remaining)
            used += output
            calls_tool = rng.random() < cfg.tool_call_probability
            latency = cfg.tool_latency_s.sample(rng)
            tool_tokens = cfg.tool_response_tokens.sample_int(rng)
            last = drawn >= remaining or not calls_tool or turn == cfg.max_turns - 1
            # A tool response that would use up the budget ends the rollout instead.
            overflow = not last and used + tool_tokens >= cfg.response_budget
            turns.append(
                PlannedTurn(
                    seed=seed,
                    context_tokens=context,
                    output_tokens=output,
                    tool_latency_s=None if last else latency,
                    tool_tokens=0 if last or overflow else tool_tokens,
                )
            )
            if last or overflow:
                truncated = drawn >= remaining or overflow
                break
            used += tool_tokens
            context += output + tool_tokens
        return RolloutPlan(
            index=index,
            prompt_index=prompt_index,
            prompt_tokens=len(self.prompts[prompt_index]),
            turns=turns,
            truncated=truncated,
        )

    async def run_rollout(
        self,
        plan: RolloutPlan,
        engine: Engine,
        *,
        lockstep: Mapping[str, TurnBarrier] | None = None,
        on_turn: Callable[[GenerationResult], None] | None = None,
    ) -> RolloutPlan:
        """Drive ``engine`` through the plan's turns; returns the plan once it has been replayed.

        ``on_turn`` sees every turn's result (e.g. to record the weights version it came from).

        With ``lockstep`` (a barrier per engine name) the rollout takes its turns together with
        the other rollouts of its engine: its tool call starts once every one of them has
        generated the turn, and its next turn once all their tool responses are back.
        """
        if lockstep is None:
            return await self._replay(plan, engine, None, on_turn)
        barrier = lockstep[engine.name]
        barrier.join()
        try:
            return await self._replay(plan, engine, barrier, on_turn)
        finally:
            barrier.leave()

    async def _replay(
        self,
        plan: RolloutPlan,
        engine: Engine,
        barrier: TurnBarrier | None,
        on_turn: Callable[[GenerationResult], None] | None,
    ) -> RolloutPlan:
        ids = self.prompts[plan.prompt_index]
        used = 0
        for number, turn in enumerate(plan.turns):
            result = await engine.generate(
                GenerationRequest(
                    request_id=f"r{plan.index}-t{number}",
                    prompt_ids=ids,
                    sampling=SamplingParams(
                        max_new_tokens=self.config.response_budget - used, seed=turn.seed
                    ),
                )
            )
            if result.finish_reason == "error":
                raise RuntimeError(f"engine {engine.name!r} failed: {result.error}")
            if len(result.token_ids) != turn.output_tokens:
                raise RuntimeError(
                    f"rollout {plan.index} turn {number}: engine generated "
                    f"{len(result.token_ids)} tokens, the plan expects {turn.output_tokens}; "
                    "the engine's output_tokens must equal the workload's turn_tokens"
                )
            if on_turn is not None:
                on_turn(result)
            ids += result.token_ids
            used += turn.output_tokens
            if turn.tool_latency_s is None:
                break
            if barrier is not None:
                await barrier.wait()
            await asyncio.sleep(turn.tool_latency_s)
            if barrier is not None:
                await barrier.wait()
            ids += synthetic_ids(turn.seed, turn.tool_tokens)
            used += turn.tool_tokens
        return plan
