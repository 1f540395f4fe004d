"""SFT transcripts encode to exactly the token layout a rollout of the same turns produces."""

from __future__ import annotations

import asyncio

import pytest
from forced import ForcedTurnsEngine
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rstar2_data.demo import generate_tasks, to_problem, to_transcript
from rstar2_sandbox.local import LocalSandbox
from rstar2_scheduler.engines import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.protocol import (
    ChatConfig,
    ChatProtocol,
    ToolOutputFormatter,
    TranscriptError,
    encode_transcript,
    user_prompt,
)
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner


def demo_messages(seed: int, failure: str | None = None) -> tuple[object, list[dict[str, object]]]:
    """A demo task and its transcript in protocol form (user prompt wrapped, outputs formatted)."""
    task = generate_tasks(1, seed=seed, levels=(1,))[0]
    example = to_transcript(
        task,
        example_id="t",
        failure=failure,
        tool_response=ToolOutputFormatter().format_execution,
    )
    messages = ChatProtocol.to_messages(example.messages)
    messages[0] = {**messages[0], "content": user_prompt(str(messages[0]["content"]))}
    return task, messages


def segments(ids: list[int], mask: list[int], chat: ChatProtocol) -> list[tuple[int, str]]:
    out: list[tuple[int, list[int]]] = []
    for token, bit in zip(ids, mask, strict=True):
        if out and out[-1][0] == bit:
            out[-1][1].append(token)
        else:
            out.append((bit, [token]))
    return [(bit, chat.decode(run)) for bit, run in out]


@pytest.mark.parametrize("failure", [None, "name_typo"])
def test_decodes_to_the_rendered_conversation_with_assistant_turns_masked_in(
    tokenizer: PreTrainedTokenizerFast, failure: str | None
) -> None:
    chat = ChatProtocol(tokenizer)
    _, messages = demo_messages(3, failure)
    encoded = encode_transcript(chat, messages)
    whole = chat.render(messages, add_generation_prompt=False)
    assert chat.decode(encoded.ids) == whole.removesuffix("\n")
    parts = segments(encoded.ids, encoded.loss_mask, chat)
    trained = [text for bit, text in parts if bit]
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert len(trained) == len(assistants)
    # The prefill belongs to the prompt, as in rollouts; every trained turn ends the turn.
    assert parts[0][1].endswith("<|im_start|>assistant\n<reason>")
    assert all(text.endswith("<|im_end|>") for text in trained)
    assert trained[-1].startswith("The program printed")
    assert encoded.prompt_tokens == len(chat.encode(parts[0][1]))
    assert encoded.trained_tokens == sum(encoded.loss_mask) > 0


def test_long_tool_output_is_truncated_as_rollouts_show_it(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    chat = ChatProtocol(tokenizer)
    _, messages = demo_messages(4)
    messages[2] = {**messages[2], "content": "9" * 1000}
    encoded = encode_transcript(chat, messages, tool_output_chars=40)
    text = chat.decode(encoded.ids)
    assert "9" * 1000 not in text
    assert "[960 characters omitted]" in text


def test_bad_transcripts_say_what_is_wrong(tokenizer: PreTrainedTokenizerFast) -> None:
    chat = ChatProtocol(tokenizer)
    _, messages = demo_messages(5)
    with pytest.raises(TranscriptError, match="no assistant message"):
        encode_transcript(chat, messages[:1])
    with pytest.raises(TranscriptError, match="must end with an assistant message, not tool"):
        encode_transcript(chat, messages[:3])
    doubled = [*messages[:2], messages[1], *messages[2:]]
    with pytest.raises(TranscriptError, match="two assistant messages in a row"):
        encode_transcript(chat, doubled)
    without_prefill = [messages[0], {"role": "assistant", "content": "Hi."}]
    with pytest.raises(TranscriptError, match="must start with the reasoning prefill"):
        encode_transcript(chat, without_prefill)
    no_prefill = ChatProtocol(tokenizer, ChatConfig(reason_prefill=""))
    plain = encode_transcript(no_prefill, without_prefill)
    assert no_prefill.decode(plain.ids).endswith("<|im_start|>assistant\nHi.<|im_end|>")


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", [None, "missing_stdin", "name_typo"])
async def test_equals_a_rollout_that_makes_the_same_turns(
    tokenizer: PreTrainedTokenizerFast, model: Qwen2ForCausalLM, failure: str | None
) -> None:
    """Force a rollout to generate the transcript's assistant turns, with real tool calls in the
    sandbox: its ids and mask must be the SFT encoding's, token for token."""
    task, messages = demo_messages(6, failure)
    config = RolloutConfig(max_turns=4, max_response_tokens=2048, temperature=1.0)
    async with LocalSandbox() as sandbox:
        runner = RolloutRunner(tokenizer, sandbox, config)
        encoded = encode_transcript(runner.chat, messages)
        turns: dict[int, list[int]] = {}
        start = encoded.prompt_tokens
        for bit_run in _runs(encoded.loss_mask[start:]):
            value, a, b = bit_run
            if value:
                turns[len(turns)] = encoded.ids[start + a : start + b]
        inner = TransformersEngine(model, TransformersEngineConfig(kv_budget_tokens=8192))
        engine = ForcedTurnsEngine(inner, model, {"r": turns})
        async with engine:
            problem = to_problem(task, problem_id="p")
            trajectory = await asyncio.wait_for(runner.rollout(problem, engine, rollout_id="r"), 60)
    assert trajectory.stop_reason == "no_tool_call"
    assert trajectory.input_ids == encoded.ids
    assert [0] * len(trajectory.prompt_ids) + trajectory.loss_mask == encoded.loss_mask


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for position, bit in enumerate(mask):
        if out and out[-1][0] == bit:
            out[-1] = (bit, out[-1][1], position + 1)
        else:
            out.append((bit, position, position + 1))
    return out
