"""The rollout loop, token by token, with scripted model turns and a scripted sandbox."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from scripted import FakeSandbox, ScriptedEngine
from transformers import PreTrainedTokenizerFast

from rstar2_algo import TrajectoryQuality
from rstar2_data import PYTHON_TOOL_NAME, MathProblem
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus
from rstar2_scheduler.engine import GenerationRequest, GenerationResult
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner
from rstar2_scheduler.trajectory import Trajectory

PROBLEM = MathProblem(
    id="p1", source="test", problem="What is 6 * 7?", answer="42", answer_kind="integer"
)
ANSWER = "It is 42.\n</reason>\n<answer>\n\\boxed{42}\n</answer>"


def tool_call(code: str, stdin: str = "") -> str:
    payload = {"name": PYTHON_TOOL_NAME, "arguments": {"code": code, "input": stdin}}
    return f"\nLet me run it.\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"


class Script:
    """Encodes assistant turns as token ids ending with the end-of-turn token."""

    def __init__(self, runner: RolloutRunner) -> None:
        self.chat = runner.chat

    def turn(self, text: str, *, end: bool = True) -> list[int]:
        return self.chat.encode(text) + ([self.chat.end_of_turn_id] if end else [])


def make(
    tokenizer: PreTrainedTokenizerFast, sandbox: FakeSandbox | None = None, **config: object
) -> tuple[RolloutRunner, Script, FakeSandbox]:
    sandbox = sandbox or FakeSandbox()
    runner = RolloutRunner(tokenizer, sandbox, RolloutConfig.model_validate(config))
    return runner, Script(runner), sandbox


@pytest.mark.asyncio
async def test_tool_turn_then_answer_token_by_token(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, sandbox = make(tokenizer)
    turns = [script.turn(tool_call("print(6 * 7)")), script.turn(ANSWER)]
    engine = ScriptedEngine(turns)
    trajectory = await runner.rollout(PROBLEM, engine, rollout_id="r", seed=3)

    chat = runner.chat
    # The first prompt is the rendered conversation with <reason> pre-filled.
    prompt_text = chat.render(chat.initial_messages(PROBLEM.problem), add_generation_prompt=True)
    assert trajectory.prompt_ids == chat.encode(prompt_text + "<reason>")
    # Response = turn 1 (mask 1) + glue with the tool response (mask 0) + turn 2 (mask 1).
    glue_text = (
        "\n<|im_start|>user\n<tool_response>\n42\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    glue = chat.encode(glue_text)
    assert trajectory.response_ids == turns[0] + glue + turns[1]
    assert trajectory.loss_mask == [1] * len(turns[0]) + [0] * len(glue) + [1] * len(turns[1])
    expected_logprobs = (
        [-(i + 1) / 100 for i in range(len(turns[0]))]
        + [0.0] * len(glue)
        + [-(i + 1) / 100 for i in range(len(turns[1]))]
    )
    assert trajectory.logprobs == pytest.approx(expected_logprobs)
    # Append-only ids equal the whole conversation rendered at once.
    whole = chat.render(
        [
            *chat.initial_messages(PROBLEM.problem),
            {"role": "assistant", "content": "<reason>" + tool_call("print(6 * 7)")},
            {"role": "tool", "content": "42\n"},
            {"role": "assistant", "content": ANSWER},
        ],
        add_generation_prompt=False,
    )
    assert chat.encode(whole)[: len(trajectory.input_ids)] == trajectory.input_ids
    # The second request's prompt was exactly the ids so far; the budget shrank by what was used.
    assert list(engine.requests[1].prompt_ids) == trajectory.prompt_ids + turns[0] + glue
    budget = runner.config.max_response_tokens
    assert engine.requests[1].sampling.max_new_tokens == budget - len(turns[0]) - len(glue)
    assert engine.requests[0].sampling.seed != engine.requests[1].sampling.seed

    assert sandbox.requests == [
        RunRequest(code="print(6 * 7)", stdin="", timeout_s=10.0, display_last_expr=True)
    ]
    first, second = trajectory.turns
    assert first.tool_call is not None
    assert first.tool_call.arguments["code"] == "print(6 * 7)"
    assert first.executed
    assert first.sandbox_status is RunStatus.SUCCESS
    assert first.tool_latency_s is not None
    assert first.tool_response == "42\n"
    assert (first.model_tokens, first.glue_tokens) == (len(turns[0]), len(glue))
    assert second.tool_call is None
    assert second.text == ANSWER
    assert trajectory.stop_reason == "no_tool_call"
    assert trajectory.quality == TrajectoryQuality(
        tool_calls=1,
        parse_errors=0,
        runtime_errors=0,
        timeouts=0,
        other_errors=0,
        answer_tags=1,
        turns=2,
        truncated=False,
    )
    assert trajectory.quality.penalty == 0.0
    assert trajectory.engine == "scripted"
    assert trajectory.response_text == chat.decode(trajectory.response_ids)


@pytest.mark.parametrize(
    ("status", "field"),
    [
        (RunStatus.RUNTIME_ERROR, "runtime_errors"),
        (RunStatus.TIMEOUT, "timeouts"),
        (RunStatus.MEMORY_EXCEEDED, "other_errors"),
        (RunStatus.OUTPUT_LIMIT_EXCEEDED, "other_errors"),
        (RunStatus.INTERNAL_ERROR, "other_errors"),
    ],
)
@pytest.mark.asyncio
async def test_failed_runs_are_counted_by_kind(
    tokenizer: PreTrainedTokenizerFast, status: RunStatus, field: str
) -> None:
    runner, script, _ = make(tokenizer, FakeSandbox(lambda r: RunResult(status=status)))
    engine = ScriptedEngine([script.turn(tool_call("x")), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    quality = trajectory.quality
    assert quality.tool_calls == 1
    assert getattr(quality, field) == 1
    assert quality.failed_tool_calls == 1
    assert trajectory.turns[0].sandbox_status is status


@pytest.mark.asyncio
async def test_parse_error_is_shown_to_the_model_and_counted(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    runner, script, sandbox = make(tokenizer)
    bad = tool_call("print(1)").replace('"input": ""}}', '"input": ""')  # unbalanced JSON
    engine = ScriptedEngine([script.turn(bad), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    first = trajectory.turns[0]
    assert sandbox.requests == []
    assert first.parse_error is not None
    assert first.parse_error.startswith("Error: the tool call is not valid JSON")
    assert first.tool_response == first.parse_error
    assert f"<tool_response>\n{first.parse_error}\n</tool_response>" in trajectory.response_text
    assert trajectory.quality.parse_errors == 1
    assert trajectory.quality.tool_calls == 1


@pytest.mark.asyncio
async def test_only_the_first_call_runs(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, sandbox = make(tokenizer)
    two = tool_call("print(1)") + tool_call("print(2)")
    engine = ScriptedEngine([script.turn(two), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert [r.code for r in sandbox.requests] == ["print(1)"]
    assert trajectory.turns[0].ignored_tool_calls == 1


@pytest.mark.asyncio
async def test_max_turns_leaves_the_last_call_unrun(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, sandbox = make(tokenizer, max_turns=2)
    engine = ScriptedEngine(
        [script.turn(tool_call("print(1)")), script.turn(tool_call("print(2)"))]
    )
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "max_turns"
    assert [r.code for r in sandbox.requests] == ["print(1)"]
    last = trajectory.turns[-1]
    assert last.tool_call is not None
    assert not last.answered
    assert not last.executed
    assert trajectory.quality.tool_calls == 1
    assert trajectory.truncated
    assert trajectory.loss_mask[-1] == 1  # nothing appended after the last model turn


@pytest.mark.asyncio
async def test_tool_response_overflowing_the_budget_ends_the_rollout(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    long_output = RunResult(status=RunStatus.SUCCESS, stdout="9" * 200)
    runner, script, _ = make(tokenizer, FakeSandbox(lambda r: long_output))
    first = script.turn(tool_call("print('9' * 200)"))
    budget = len(first) + 20  # room for a short tool response, not for this one
    runner, script, _ = make(
        tokenizer, FakeSandbox(lambda r: long_output), max_response_tokens=budget
    )
    engine = ScriptedEngine([first, script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "budget"
    assert trajectory.response_ids == first
    assert len(engine.requests) == 1
    assert trajectory.turns[0].executed
    assert trajectory.turns[0].tool_response is None
    assert trajectory.truncated


@pytest.mark.asyncio
async def test_budget_counts_tool_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, _ = make(tokenizer, max_response_tokens=200)
    first = script.turn(tool_call("print(6 * 7)"))
    engine = ScriptedEngine([first, script.turn(ANSWER * 20)])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "budget"
    assert len(trajectory.response_ids) == 200
    assert trajectory.turns[-1].finish_reason == "length"
    assert trajectory.quality.truncated


@pytest.mark.asyncio
async def test_tool_output_is_truncated_for_the_model(tokenizer: PreTrainedTokenizerFast) -> None:
    output = "a" * 100 + "b" * 100
    runner, script, _ = make(
        tokenizer,
        FakeSandbox(lambda r: RunResult(status=RunStatus.SUCCESS, stdout=output)),
        tool_output_chars=20,
    )
    engine = ScriptedEngine([script.turn(tool_call("x")), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert (
        trajectory.turns[0].tool_response
        == "a" * 10 + "\n... [180 characters omitted] ...\n" + "b" * 10
    )


@pytest.mark.asyncio
async def test_engine_error_ends_the_rollout(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, _ = make(tokenizer)
    engine = ScriptedEngine(
        [
            script.turn(tool_call("print(1)")),
            GenerationResult.failed("x", "device lost"),
        ]
    )
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "engine_error"
    assert trajectory.error == "device lost"
    assert len(trajectory.turns) == 1
    assert trajectory.truncated


@pytest.mark.asyncio
async def test_engine_failing_the_first_request_gives_a_zero_turn_trajectory(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    runner, _, sandbox = make(tokenizer)
    engine = ScriptedEngine([GenerationResult.failed("x", "device lost")])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "engine_error"
    assert (trajectory.turns, trajectory.response_ids, sandbox.requests) == ([], [], [])
    assert trajectory.quality.turns == 0
    assert trajectory.truncated
    # No tool call and no answer: the neutral error ratio plus the full format penalty.
    assert trajectory.quality.penalty == pytest.approx(0.5 + 1.0)
    assert Trajectory.model_validate_json(trajectory.model_dump_json()) == trajectory


@pytest.mark.asyncio
async def test_trajectory_round_trips_through_json(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, _ = make(
        tokenizer, FakeSandbox(lambda r: RunResult(status=RunStatus.RUNTIME_ERROR))
    )
    engine = ScriptedEngine([script.turn(tool_call("1 / 0")), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    data = trajectory.model_dump_json()
    again = Trajectory.model_validate_json(data)
    assert again == trajectory
    assert type(again.quality) is TrajectoryQuality
    assert again.quality.runtime_errors == 1
    assert again.truncated is False
    # The record's own checks run on the way in, as for any other field.
    tampered = json.loads(data)
    tampered["quality"]["parse_errors"] = 2
    with pytest.raises(ValidationError, match="must not exceed tool_calls=1"):
        Trajectory.model_validate(tampered)


@pytest.mark.asyncio
async def test_end_of_sequence_token_ends_the_rollout(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, script, sandbox = make(tokenizer)
    eos = tokenizer.eos_token_id
    engine = ScriptedEngine([[*script.turn(tool_call("print(1)"), end=False), eos]])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.stop_reason == "end_of_sequence"
    assert sandbox.requests == []
    assert not trajectory.truncated


@pytest.mark.asyncio
async def test_sandbox_outage_is_a_failed_call(tokenizer: PreTrainedTokenizerFast) -> None:
    def broken(request: RunRequest) -> RunResult:
        raise ConnectionError("sandbox down")

    runner, script, _ = make(tokenizer, FakeSandbox(broken))
    engine = ScriptedEngine([script.turn(tool_call("print(1)")), script.turn(ANSWER)])
    trajectory = await runner.rollout(PROBLEM, engine)
    assert trajectory.turns[0].sandbox_status is RunStatus.INTERNAL_ERROR
    assert trajectory.quality.other_errors == 1
    assert "could not run" in (trajectory.turns[0].tool_response or "")


def test_max_tokens_is_prompt_plus_budget(tokenizer: PreTrainedTokenizerFast) -> None:
    runner, _, _ = make(tokenizer, max_response_tokens=123)
    assert runner.max_tokens(PROBLEM) == len(runner.prompt_ids(PROBLEM)) + 123


@pytest.mark.asyncio
async def test_tokens_without_a_log_prob_are_not_trained_on(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    """A stop token a text server dropped comes back restored with mask 0 (no log-prob to train
    on); the trajectory keeps that mask, and the engine's own count for the budget."""
    runner, script, _ = make(tokenizer)
    answer = script.turn(ANSWER)
    n = len(answer)
    result = GenerationResult(
        request_id="r-0",
        token_ids=tuple(answer),
        logprobs=(*[-0.5] * (n - 1), 0.0),
        finish_reason="stop",
        loss_mask=(*[1] * (n - 1), 0),
        counted_tokens=n + 2,
        reencoded=True,
    )
    trajectory = await runner.rollout(PROBLEM, ScriptedEngine([result]))
    assert trajectory.loss_mask == [1] * (n - 1) + [0]
    assert trajectory.turns[0].model_tokens == n + 2
    assert trajectory.turns[0].reencoded_tokens == n
    assert trajectory.response_tokens == n + 2


def test_a_result_needs_one_log_prob_and_mask_entry_per_token() -> None:
    with pytest.raises(ValidationError, match="one each"):
        GenerationResult(request_id="r", token_ids=(1, 2), logprobs=(0.0,), finish_reason="stop")
    with pytest.raises(ValidationError, match="loss_mask"):
        GenerationResult(
            request_id="r", token_ids=(1,), logprobs=(0.0,), finish_reason="stop", loss_mask=(2,)
        )


class VersionedEngine(ScriptedEngine):
    """A scripted engine whose weights move to the next version after every call."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        return result.model_copy(update={"weights_version": str(len(self.requests))})


@pytest.mark.asyncio
async def test_every_token_records_the_weights_version_that_sampled_it(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    runner, script, _ = make(tokenizer)
    turns = [script.turn(tool_call("print(6 * 7)")), script.turn(ANSWER)]
    trajectory = await runner.rollout(PROBLEM, VersionedEngine(turns), rollout_id="r", seed=3)
    first, second = trajectory.turns
    assert (first.weights_version, second.weights_version) == ("1", "2")
    glue = first.glue_tokens
    assert trajectory.versions == ["1"] * len(turns[0]) + [None] * glue + ["2"] * len(turns[1])
    with pytest.raises(ValidationError, match="versions"):
        Trajectory.model_validate({**trajectory.model_dump(), "versions": ["1"]})


class SupportEngine(ScriptedEngine):
    """A scripted engine that reports a support per token when asked: the token and its
    successor."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        if not request.sampling.return_support:
            return result
        support = tuple((token, token + 1) for token in result.token_ids)
        return result.model_copy(update={"support": support})


@pytest.mark.asyncio
@pytest.mark.parametrize("asked", [True, False])
async def test_supports_are_kept_token_by_token_when_the_rollout_asks(
    tokenizer: PreTrainedTokenizerFast, asked: bool
) -> None:
    runner, script, _ = make(tokenizer, top_p=0.9, top_k=50, return_support=asked)
    turns = [script.turn(tool_call("print(6 * 7)")), script.turn(ANSWER)]
    engine = SupportEngine(turns)
    trajectory = await runner.rollout(PROBLEM, engine, rollout_id="r", seed=3)
    assert {(r.sampling.top_k, r.sampling.return_support) for r in engine.requests} == {(50, asked)}
    if not asked:
        assert trajectory.support is None
        return
    glue = trajectory.turns[0].glue_tokens
    assert trajectory.support == [
        *([t, t + 1] for t in turns[0]),
        *([] for _ in range(glue)),
        *([t, t + 1] for t in turns[1]),
    ]
    with pytest.raises(ValidationError, match="support must have one entry per response token"):
        Trajectory.model_validate({**trajectory.model_dump(), "support": [[1]]})
