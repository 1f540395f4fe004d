"""The agent protocol's text and types: one definition for SFT data, rollouts and evaluation.

Everything a model reads or writes that the protocol fixes is defined here and nowhere else in
rstar2: the chat markers, the tags (reasoning, answer, tool list, tool call, tool response), the
default system prompt, the instructions around the tool list, the user turn, and the one
``ToolCall`` type. The chat template (``CHAT_TEMPLATE``) is rendered from these constants, and
every package (the scheduler's rollouts, the evaluator's answer extraction, the demo transcripts,
the trainer's checkpoints) imports them rather than writing a tag again; a test fails when a tag
appears anywhere else in the packages' sources. The Python tool's schema is in ``tools``.

rstar2-data holds the protocol because it is below the scheduler and the evaluator in the
dependency order, and its SFT data needs the protocol too.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (TURN_START, TURN_END)
"""The chat markers, which a tokenizer must hold as single tokens."""

REASON_OPEN = "<reason>"
REASON_CLOSE = "</reason>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TOOLS_OPEN = "<tools>"
TOOLS_CLOSE = "</tools>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

PROTOCOL_TAGS: tuple[str, ...] = (
    TURN_START,
    TURN_END,
    REASON_OPEN,
    REASON_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
    TOOLS_OPEN,
    TOOLS_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
)
"""Every marker and tag of the protocol."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems. Reason step by step inside "
    f"{REASON_OPEN} {REASON_CLOSE}, using the Python tool whenever a computation helps, then give "
    f"the final answer inside {ANSWER_OPEN} {ANSWER_CLOSE} with the final result in \\boxed{{}}."
)
"""The system prompt when a conversation brings none."""

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call the functions described as JSON schemas inside "
    f"{TOOLS_OPEN}{TOOLS_CLOSE}:\n{TOOLS_OPEN}\n"
)
"""Appended to the system prompt before the tools' JSON schemas (one per line)."""

TOOLS_INSTRUCTIONS = (
    f"{TOOLS_CLOSE}\n\nTo call a function, write one JSON object with its name and arguments "
    f"inside {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} tags:\n{TOOL_CALL_OPEN}\n"
    '{"name": <function-name>, "arguments": <arguments-object>}\n'
    f"{TOOL_CALL_CLOSE}\nOnly the first call of a turn runs. Its result comes back in the next "
    f"user turn inside {TOOL_RESPONSE_OPEN}{TOOL_RESPONSE_CLOSE} tags."
)
"""Closes the tool list and says how to call a tool."""


def user_prompt(problem: str) -> str:
    """The user turn for one problem: the statement and how to present the answer.

    SFT data must wrap its user messages with this too, so that training and rollouts match.
    """
    return (
        f"{problem}\n\nPut the final answer inside {ANSWER_OPEN} {ANSWER_CLOSE}, with the final "
        "result in \\boxed{}."
    )


def count_answer_tags(text: str) -> int:
    """Number of answer blocks the model opened in ``text`` (Resample-on-Correct penalizes a
    response with none or several)."""
    return text.count(ANSWER_OPEN)


class FunctionCall(BaseModel):
    """The function a tool call names, with its arguments as a JSON object (not a string)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(BaseModel):
    """One tool call, in the OpenAI chat format: an assistant message's ``tool_calls`` entry in
    SFT data, and what the rollout parser reads from a model's tool-call block (no ``id``: a
    model-written call has none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(
        default=None, min_length=1, description="Links the call to its tool message."
    )
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def of(cls, name: str, arguments: dict[str, Any], *, id: str | None = None) -> ToolCall:
        """A call of ``name`` with ``arguments``."""
        return cls(id=id, function=FunctionCall(name=name, arguments=arguments))

    @property
    def name(self) -> str:
        return self.function.name

    @property
    def arguments(self) -> dict[str, Any]:
        return self.function.arguments


def _jinja_string(value: str) -> str:
    # A JSON string literal (ASCII, with \n and \uXXXX escapes) is also a Jinja string literal.
    return json.dumps(value)


def _render_chat_template() -> str:
    """The chat template: the protocol's text as Jinja variables, then the template's body."""
    constants = {
        "turn_start": TURN_START,
        "turn_end": TURN_END,
        "default_system": DEFAULT_SYSTEM_PROMPT,
        "tools_preamble": TOOLS_PREAMBLE,
        "tools_instructions": TOOLS_INSTRUCTIONS,
        "tool_call_open": TOOL_CALL_OPEN,
        "tool_call_close": TOOL_CALL_CLOSE,
        "tool_response_open": TOOL_RESPONSE_OPEN,
        "tool_response_close": TOOL_RESPONSE_CLOSE,
    }
    header = "".join(
        f"{{%- set {name} = {_jinja_string(value)} -%}}\n" for name, value in constants.items()
    )
    body = files("rstar2_data").joinpath("chat_template.jinja").read_text("utf-8")
    return header + body


CHAT_TEMPLATE: str = _render_chat_template()
"""rstar2's chat template (Jinja, as ``tokenizer.chat_template``): ChatML turns, the tools listed
in the system prompt, tool calls as JSON in tool-call tags, tool results as user turns in
tool-response tags. It renders SFT transcripts (assistant messages with structured
``tool_calls``, ``tool`` messages), RL rollouts (raw assistant text) and evaluation prompts
alike, so training and evaluation see the same text."""
