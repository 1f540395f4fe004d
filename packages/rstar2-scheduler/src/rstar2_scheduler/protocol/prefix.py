"""Checking that a chat template and tokenizer can build conversations append-only.

Rollouts encode the prompt and each piece of template glue separately and never re-tokenize.
That is only sound when rendering turn by turn gives the text of rendering the whole
conversation, and encoding the pieces gives the ids of encoding the whole text.
"""

from __future__ import annotations

import json

from rstar2_data.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    REASON_CLOSE,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)
from rstar2_scheduler.protocol.chat import ChatProtocol, TemplateError
from rstar2_scheduler.protocol.conversation import Conversation


def _sample_turns(chat: ChatProtocol) -> list[tuple[str, str | None]]:
    """(assistant text, tool output or None) pairs of a typical two-turn solution."""
    name = chat.tools[0]["function"]["name"] if chat.tools else "tool"
    call = json.dumps({"name": name, "arguments": {"code": "print(6 * 7)", "input": ""}})
    return [
        (f"\nI will let Python multiply.\n{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}", "42\n"),
        (f"It printed 42.\n{REASON_CLOSE}\n{ANSWER_OPEN}\n\\boxed{{42}}\n{ANSWER_CLOSE}", None),
    ]


def check_prefix_preserving(chat: ChatProtocol) -> None:
    """Raise ``TemplateError`` unless a sample tool conversation builds append-only.

    The sample's assistant turns are encoded as a model would emit them (the tokenizer's own
    encoding followed by the end-of-turn token).
    """
    conversation = Conversation(chat, chat.initial_messages("What is 6 times 7?"))
    for content, tool_output in _sample_turns(chat):
        ids = [*chat.encode(content), chat.end_of_turn_id]
        conversation.add_model_turn(ids, [0.0] * len(ids))
        if tool_output is not None:
            conversation.append_glue(conversation.tool_response_glue(tool_output))
    whole = chat.render(conversation.messages, add_generation_prompt=False)
    if not whole.startswith(conversation.text):
        raise TemplateError(
            "the chat template is not prefix-preserving: the whole conversation renders as "
            f"{whole!r}, but turn by turn it is {conversation.text!r}"
        )
    built = conversation.ids
    encoded = chat.encode(whole)[: len(built)]
    if encoded != built:
        at = next(
            (i for i, (a, b) in enumerate(zip(encoded, built, strict=False)) if a != b),
            min(len(encoded), len(built)),
        )
        whole_piece, built_piece = (
            chat.decode(encoded[at : at + 8]),
            chat.decode(built[at : at + 8]),
        )
        raise TemplateError(
            "the tokenizer is not prefix-preserving for this chat template: encoding the "
            f"conversation piece by piece differs from encoding it whole at token {at}: whole "
            f"{whole_piece!r}, piece by piece {built_piece!r}"
        )
