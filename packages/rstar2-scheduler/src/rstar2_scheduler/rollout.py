"""The multi-turn tool rollout: generate, run the tool call, show its output, repeat.

Token in, token out: each turn's prompt is the conversation's ids so far, the engine returns token
ids and sampling log-probs, and tool responses are appended as template glue (loss mask 0). Tool
calls go to the sandbox the moment a turn emits one; other rollouts keep generating meanwhile,
since each rollout is its own coroutine.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_data import MathProblem
from rstar2_data.protocol import ToolCall, count_answer_tags
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler.engine import Engine, GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.protocol.chat import ChatConfig, ChatProtocol
from rstar2_scheduler.protocol.conversation import Conversation
from rstar2_scheduler.protocol.prefix import check_prefix_preserving
from rstar2_scheduler.protocol.tool_calls import ParsedTurn, ToolCallParser
from rstar2_scheduler.protocol.tool_response import DEFAULT_TOOL_OUTPUT_CHARS, ToolOutputFormatter
from rstar2_scheduler.trajectory import StopReason, Trajectory, TurnRecord, count_quality

if TYPE_CHECKING:  # transformers loads only where a tokenizer is used: configs stay light
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_SEED_STRIDE = 1_000_003  # a prime, so (rollout seed, turn) pairs never share a sampling seed


class RolloutConfig(BaseModel):
    """Limits and sampling of one rollout (paper: T=10 in RL stages 1-2, 15 in 3, 30 in eval)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=10, ge=1, description="Assistant turns at most.")
    max_response_tokens: int = Field(
        default=8192, ge=1, description="Budget shared by all turns: model and tool tokens."
    )
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, description="Sample among the k most likely; 0: off.")
    return_support: bool = Field(
        default=False,
        description="Ask the engine for each token's sampling support (its top-p / top-k set) "
        "and keep it in the trajectory, so a trainer renormalises its log-probs over the same "
        "ids and the PPO ratio is exact under top_p < 1 or top_k.",
    )
    tool_output_chars: int | None = Field(
        default=DEFAULT_TOOL_OUTPUT_CHARS,
        ge=2,
        description="Tool output shown to the model (head + marker + tail); None shows all.",
    )
    tool_timeout_s: float = Field(default=10.0, gt=0, le=300)
    tool_memory_mb: int = Field(default=1024, gt=0)
    chat: ChatConfig = Field(default_factory=ChatConfig)


class RolloutRunner:
    """Runs rollouts of one tokenizer's chat format against any engine and sandbox.

    The template is checked to be prefix-preserving for the tokenizer when the runner is made.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sandbox: Sandbox,
        config: RolloutConfig | None = None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self.config = config or RolloutConfig()
        self.sandbox = sandbox
        self.chat = ChatProtocol(tokenizer, self.config.chat, tools=tools)
        check_prefix_preserving(self.chat)
        self.parser = ToolCallParser(self.chat.tools)
        self.formatter = ToolOutputFormatter(self.config.tool_output_chars)

    def prompt_ids(self, problem: MathProblem) -> list[int]:
        """The first turn's prompt ids for ``problem``."""
        return Conversation(self.chat, self.chat.initial_messages(problem.problem)).prompt_ids

    def max_tokens(self, problem: MathProblem) -> int:
        """Most KV tokens a rollout of ``problem`` can hold: prompt plus the response budget."""
        return len(self.prompt_ids(problem)) + self.config.max_response_tokens

    async def rollout(
        self,
        problem: MathProblem,
        engine: Engine,
        *,
        rollout_id: str | None = None,
        seed: int | None = None,
    ) -> Trajectory:
        """One rollout of ``problem``, every turn on ``engine`` (its prefix cache stays warm)."""
        rollout_id = rollout_id or uuid.uuid4().hex
        config = self.config
        conversation = Conversation(self.chat, self.chat.initial_messages(problem.problem))
        turns: list[TurnRecord] = []
        texts: list[str] = []
        stop: StopReason = "max_turns"
        error: str | None = None
        # Budget spent: the engine's count of its tokens plus the glue. It differs from the ids
        # held when a text server's completions are re-encoded (the server's count is the truth).
        spent = 0
        for index in range(config.max_turns):
            budget_left = config.max_response_tokens - spent
            request = GenerationRequest(
                request_id=f"{rollout_id}-{index}",
                prompt_ids=tuple(conversation.ids),
                sampling=SamplingParams(
                    max_new_tokens=budget_left,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    top_k=config.top_k,
                    return_support=config.return_support,
                    stop_token_ids=self.chat.stop_token_ids,
                    seed=None if seed is None else (seed * _SEED_STRIDE + index) % 2**63,
                ),
            )
            started = time.perf_counter()
            result = await engine.generate(request)
            generation_s = time.perf_counter() - started
            if result.finish_reason in ("error", "abort"):
                stop, error = "engine_error", result.error or f"request {result.finish_reason}"
                logger.warning(
                    "rollout %s turn %d: engine %s: %s", rollout_id, index, engine.name, error
                )
                break
            text = conversation.add_model_turn(
                result.token_ids,
                result.logprobs,
                result.loss_mask,
                version=result.weights_version,
                support=result.support,
            )
            texts.append(text)
            spent += result.generated_tokens
            record: dict[str, Any] = {
                "index": index,
                "text": text,
                "model_tokens": result.generated_tokens,
                "reencoded_tokens": len(result.token_ids) if result.reencoded else None,
                "finish_reason": result.finish_reason,
                "generation_s": generation_s,
                "weights_version": result.weights_version,
            }
            ending = self._turn_ending(result, index)
            if ending is not None:
                stop = ending
                turns.append(TurnRecord(**record))
                break
            parsed = self.parser.parse(text)
            if not parsed.attempted:
                stop = "no_tool_call"
                turns.append(TurnRecord(**record))
                break
            record.update(
                tool_call=parsed.call,
                parse_error=parsed.error,
                ignored_tool_calls=parsed.ignored_calls,
            )
            if index == config.max_turns - 1:
                # The last allowed turn: its call would get no turn to read the result.
                turns.append(TurnRecord(**record))
                break
            tool_text = await self._answer(parsed, record)
            glue = conversation.tool_response_glue(tool_text)
            if spent + len(glue.ids) >= config.max_response_tokens:
                stop = "budget"
                turns.append(TurnRecord(**record))
                break
            conversation.append_glue(glue)
            spent += len(glue.ids)
            turns.append(TurnRecord(**record, tool_response=tool_text, glue_tokens=len(glue.ids)))

        quality = count_quality(
            turns, answer_tags=sum(count_answer_tags(text) for text in texts), stop_reason=stop
        )
        return Trajectory(
            rollout_id=rollout_id,
            problem_id=problem.id,
            engine=engine.name,
            prompt_ids=conversation.prompt_ids,
            response_ids=conversation.response_ids,
            loss_mask=conversation.loss_mask,
            logprobs=conversation.logprobs,
            versions=conversation.versions,
            support=conversation.support if config.return_support else None,
            turns=turns,
            stop_reason=stop,
            error=error,
            quality=quality,
            response_text=self.chat.decode(conversation.response_ids),
        )

    def _turn_ending(self, result: GenerationResult, index: int) -> StopReason | None:
        """Why the rollout ends after this turn regardless of tool calls, if it does."""
        if result.finish_reason == "length" or not result.token_ids:
            return "budget"
        if result.token_ids[-1] != self.chat.end_of_turn_id:
            return "end_of_sequence"
        return None

    async def _answer(self, parsed: ParsedTurn, record: dict[str, Any]) -> str:
        """Run the parsed call (or explain why it did not parse); fills the turn record."""
        record["answered"] = True
        if parsed.call is None:
            return self.formatter.format_error(parsed.error or "Error: invalid tool call.")
        try:
            request = self._run_request(parsed.call)
        except ValidationError as invalid:
            message = f"Error: invalid tool arguments: {invalid.errors()[0]['msg']}"
            record["parse_error"] = message
            return self.formatter.format_error(message)
        started = time.perf_counter()
        result = await self._run(request)
        record.update(
            executed=True,
            sandbox_status=result.status,
            tool_latency_s=time.perf_counter() - started,
        )
        return self.formatter.format_result(result)

    def _run_request(self, call: ToolCall) -> RunRequest:
        return RunRequest(
            code=call.arguments.get("code", ""),
            stdin=call.arguments.get("input", ""),
            timeout_s=self.config.tool_timeout_s,
            memory_mb=self.config.tool_memory_mb,
            display_last_expr=True,
        )

    async def _run(self, request: RunRequest) -> RunResult:
        try:
            return await self.sandbox.run(request)
        except Exception as failure:  # a sandbox outage is this call's failure, not the rollout's
            logger.warning("sandbox call failed: %r", failure)
            return RunResult(status=RunStatus.INTERNAL_ERROR, stderr=repr(failure))
