"""SFT transcripts as token ids and a loss mask, built exactly as a rollout builds them.

A rollout encodes its prompt (with the reasoning prefill) once, appends the model's tokens of each
turn (ending with the end-of-turn token, mask 1), and appends template glue around each tool
response (mask 0). Supervised fine-tuning must see the same token layout, or the model learns
boundaries that rollouts never produce: so a transcript is replayed through the same
``Conversation``, with each assistant message standing in for a model turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.protocol.chat import ChatProtocol, Message
from rstar2_scheduler.protocol.conversation import Conversation
from rstar2_scheduler.protocol.tool_response import DEFAULT_TOOL_OUTPUT_CHARS, truncate_middle


class TranscriptError(ValueError):
    """A transcript that cannot be replayed as a rollout; the message says which message."""


class EncodedTranscript(BaseModel):
    """Token ids of one conversation and which of them are trained on (the model's turns)."""

    model_config = ConfigDict(frozen=True)

    ids: list[int]
    loss_mask: list[int] = Field(description="1 on assistant tokens (end-of-turn included).")
    prompt_tokens: int = Field(description="Tokens before the first assistant token.")

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


def _assistant_text(conversation: Conversation, message: Message, *, first: bool) -> str:
    """What the model would generate for ``message``: its rendered body, tool calls included,
    without the end-of-turn marker (and without the prefill the prompt already holds)."""
    chat = conversation.chat
    base = chat.render(conversation.messages, add_generation_prompt=True)
    full = chat.render([*conversation.messages, message], add_generation_prompt=False)
    end = full.rfind(chat.config.end_of_turn)
    if not full.startswith(base) or end < len(base):
        raise TranscriptError(
            "the chat template does not render an assistant message after the generation prompt "
            f"and end it with {chat.config.end_of_turn!r}"
        )
    body = full[len(base) : end]
    prefill = chat.config.reason_prefill
    if first and prefill:
        if not body.startswith(prefill):
            raise TranscriptError(
                f"the first assistant message must start with the reasoning prefill {prefill!r} "
                f"(rollouts pre-fill it); it starts with {body[:40]!r}. Set the chat config's "
                "reason_prefill to '' for data without it"
            )
        body = body[len(prefill) :]
    return body


def encode_transcript(
    chat: ChatProtocol,
    messages: Sequence[Message],
    *,
    tool_output_chars: int | None = DEFAULT_TOOL_OUTPUT_CHARS,
) -> EncodedTranscript:
    """Token ids and loss mask of a chat transcript (system/user messages, then assistant turns
    with tool responses or user follow-ups between them), as a rollout of the same turns.

    Tool messages are truncated to ``tool_output_chars`` like rollout tool responses. The
    transcript must hold an assistant message and end with one; two assistant messages may not
    follow each other (a rollout never produces that).
    """
    roles = [message.get("role") for message in messages]
    if "assistant" not in roles:
        raise TranscriptError("the transcript has no assistant message to train on")
    if roles[-1] != "assistant":
        raise TranscriptError(f"the transcript must end with an assistant message, not {roles[-1]}")
    first = roles.index("assistant")
    conversation = Conversation(chat, messages[:first])
    pending: list[Message] = []
    for position, message in enumerate(messages[first:], start=first):
        if message.get("role") != "assistant":
            if message.get("role") == "tool":
                content = truncate_middle(str(message.get("content", "")), tool_output_chars)
                message = {**message, "content": content}
            pending.append(message)
            continue
        if position > first:
            if not pending:
                raise TranscriptError(
                    f"message {position}: two assistant messages in a row cannot come from a "
                    "rollout"
                )
            conversation.append_glue(conversation.glue(pending))
            pending = []
        text = _assistant_text(conversation, message, first=position == first)
        ids = [*chat.encode(text), chat.end_of_turn_id]
        conversation.add_model_turn(ids, [0.0] * len(ids))
    return EncodedTranscript(
        ids=conversation.ids,
        loss_mask=[0] * len(conversation.prompt_ids) + conversation.loss_mask,
        prompt_tokens=len(conversation.prompt_ids),
    )
