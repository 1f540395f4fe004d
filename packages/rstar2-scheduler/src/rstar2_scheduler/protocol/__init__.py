"""The agent protocol's mechanics: rendering and tokenizing turns, parsing tool calls,
formatting tool responses, append-only conversations.

The protocol's text and types (tags, system prompt, chat template, ``ToolCall``) live in
``rstar2_data.protocol``; the names users of the scheduler need are re-exported here.
"""

from rstar2_data.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    CHAT_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    PROTOCOL_TAGS,
    REASON_CLOSE,
    REASON_OPEN,
    SPECIAL_TOKENS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOLS_CLOSE,
    TOOLS_OPEN,
    TURN_END,
    TURN_START,
    FunctionCall,
    ToolCall,
    count_answer_tags,
    user_prompt,
)
from rstar2_scheduler.protocol.chat import ChatConfig, ChatProtocol, Message, TemplateError
from rstar2_scheduler.protocol.conversation import Conversation, Glue
from rstar2_scheduler.protocol.prefix import check_prefix_preserving
from rstar2_scheduler.protocol.template import install_chat_template
from rstar2_scheduler.protocol.tool_calls import ParsedTurn, ToolCallParser
from rstar2_scheduler.protocol.tool_response import (
    DEFAULT_TOOL_OUTPUT_CHARS,
    ToolOutputFormatter,
    truncate_middle,
)
from rstar2_scheduler.protocol.transcript import (
    EncodedTranscript,
    TranscriptError,
    encode_transcript,
)

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TOOL_OUTPUT_CHARS",
    "PROTOCOL_TAGS",
    "REASON_CLOSE",
    "REASON_OPEN",
    "SPECIAL_TOKENS",
    "TOOLS_CLOSE",
    "TOOLS_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "TURN_END",
    "TURN_START",
    "ChatConfig",
    "ChatProtocol",
    "Conversation",
    "EncodedTranscript",
    "FunctionCall",
    "Glue",
    "Message",
    "ParsedTurn",
    "TemplateError",
    "ToolCall",
    "ToolCallParser",
    "ToolOutputFormatter",
    "TranscriptError",
    "check_prefix_preserving",
    "count_answer_tags",
    "encode_transcript",
    "install_chat_template",
    "truncate_middle",
    "user_prompt",
]
