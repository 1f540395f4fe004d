"""rstar2's chat template renders SFT transcripts and rollout prompts as the protocol says."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from rstar2_data import PYTHON_TOOL_NAME, python_tool_schema
from rstar2_data.demo import demo_transcripts
from rstar2_scheduler.protocol import (
    CHAT_TEMPLATE,
    ChatConfig,
    ChatProtocol,
    install_chat_template,
    user_prompt,
)


def test_transcript_renders_tools_calls_and_responses(tokenizer: PreTrainedTokenizerFast) -> None:
    chat = ChatProtocol(tokenizer)
    example = demo_transcripts(1, seed=3, failure_share=0.0)[0]
    text = chat.render(chat.to_messages(example.messages), add_generation_prompt=False)

    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\n")
    assert "<reason> </reason>" in system
    assert "<answer> </answer>" in system
    tools = system.split("<tools>\n", 1)[1].split("</tools>", 1)[0].strip().splitlines()
    assert [json.loads(line) for line in tools] == [python_tool_schema()]

    call = example.messages[1].tool_calls[0].function  # type: ignore[index]
    rendered_call = rest.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0]
    assert json.loads(rendered_call) == {"name": PYTHON_TOOL_NAME, "arguments": call.arguments}
    # The tool result comes back as a user turn wrapped in <tool_response>.
    tool_output = example.messages[2].content
    assert f"<|im_start|>user\n<tool_response>\n{tool_output}\n</tool_response><|im_end|>\n" in rest
    assert text.endswith("</answer><|im_end|>\n")


def test_generation_prompt_opens_the_assistant_turn(tokenizer: PreTrainedTokenizerFast) -> None:
    chat = ChatProtocol(tokenizer)
    messages = chat.initial_messages("What is 2 + 2?")
    text = chat.render(messages, add_generation_prompt=True)
    assert text.endswith(
        f"<|im_start|>user\n{user_prompt('What is 2 + 2?')}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "\\boxed{}" in user_prompt("x")
    assert "<answer>" in user_prompt("x")


def test_system_prompt_override(tokenizer: PreTrainedTokenizerFast) -> None:
    chat = ChatProtocol(tokenizer, ChatConfig(system_prompt="Be brief."))
    text = chat.render(chat.initial_messages("p"), add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_unknown_role_is_rejected(tokenizer: PreTrainedTokenizerFast) -> None:
    chat = ChatProtocol(tokenizer)
    with pytest.raises(Exception, match="unknown role critic"):
        chat.render([{"role": "critic", "content": "x"}], add_generation_prompt=False)


def test_checkpoint_template_option(tokenizer: PreTrainedTokenizerFast) -> None:
    own = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    own.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    chat = ChatProtocol(own, ChatConfig(use_checkpoint_template=True, reason_prefill=""))
    assert (
        chat.render([{"role": "user", "content": "hi"}], add_generation_prompt=True) == "[user]hi"
    )
    # Without the option the tokenizer's own template is ignored.
    default = ChatProtocol(own)
    assert default.template == CHAT_TEMPLATE

    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="ships no chat_template"):
        ChatProtocol(bare, ChatConfig(use_checkpoint_template=True))


def test_install_requires_chatml_tokens() -> None:
    vocab = {"a": 0, "b": 1}
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "a")))
    with pytest.raises(ValueError, match=r"lacks the chat template's special tokens"):
        install_chat_template(bare)


def test_install_sets_template(tokenizer: PreTrainedTokenizerFast) -> None:
    copy = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    install_chat_template(copy)
    assert copy.chat_template == CHAT_TEMPLATE


def test_end_of_turn_must_be_one_token(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="end_of_turn 'END OF TURN' must be a single token"):
        ChatProtocol(tokenizer, ChatConfig(end_of_turn="END OF TURN"))
    chat = ChatProtocol(tokenizer)
    assert chat.stop_token_ids == (
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.eos_token_id,
    )
