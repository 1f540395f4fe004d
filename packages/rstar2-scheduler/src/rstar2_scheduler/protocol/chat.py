"""The chat format of one tokenizer: which template, tools and system prompt render the turns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rstar2_data import ChatMessage, python_tool_schema
from rstar2_data.protocol import CHAT_TEMPLATE, REASON_OPEN, TURN_END, user_prompt

if TYPE_CHECKING:  # transformers loads only where a tokenizer is used: configs stay light
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]


class TemplateError(ValueError):
    """The chat template and tokenizer cannot build a conversation turn by turn."""


class ChatConfig(BaseModel):
    """How prompts are rendered; train and evaluation must use the same settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    use_checkpoint_template: bool = Field(
        default=False,
        description="Render with the tokenizer's own chat template (e.g. to evaluate a released "
        "checkpoint exactly) instead of rstar2's.",
    )
    system_prompt: str | None = Field(
        default=None, description="Replaces the template's default system prompt."
    )
    reason_prefill: str = Field(
        default=REASON_OPEN,
        description="Text pre-filled after the first assistant turn's header; '' for none. "
        "The reasoning block stays open across tool turns, so later turns get no prefill.",
    )
    end_of_turn: str = Field(
        default=TURN_END, description="The token that ends an assistant turn (one token)."
    )


class ChatProtocol:
    """Renders conversations for one tokenizer and encodes and decodes their pieces.

    ``tools`` defaults to rstar2-data's Python tool, the one definition SFT data uses too.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: ChatConfig | None = None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config or ChatConfig()
        self.tools: list[dict[str, Any]] = (
            list(tools) if tools is not None else [python_tool_schema()]
        )
        if self.config.use_checkpoint_template:
            if not tokenizer.chat_template:
                raise ValueError(
                    "use_checkpoint_template is set but the tokenizer ships no chat_template"
                )
            self.template = str(tokenizer.chat_template)
        else:
            self.template = CHAT_TEMPLATE
        self.end_of_turn_id = self._single_token(self.config.end_of_turn, "end_of_turn")
        stops = [self.end_of_turn_id]
        eos = tokenizer.eos_token_id
        if isinstance(eos, int) and eos != self.end_of_turn_id:
            stops.append(eos)
        self.stop_token_ids: tuple[int, ...] = tuple(stops)

    def _single_token(self, token: str, field: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise ValueError(
                f"{field} {token!r} must be a single token of the tokenizer; it encodes to {ids}"
            )
        return ids[0]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as it is (no BOS/EOS added)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids``, special tokens included."""
        text = self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if not isinstance(text, str):
            raise TypeError(f"tokenizer.decode returned {type(text).__name__}, not str")
        return text

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        """The text of a conversation (the tools go into the system prompt)."""
        text = self.tokenizer.apply_chat_template(
            list(messages),
            tools=list[dict[Any, Any] | Callable[..., Any]](self.tools),
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        if not isinstance(text, str):
            raise TemplateError(f"the chat template rendered {type(text).__name__}, not text")
        return text

    def initial_messages(self, problem: str) -> list[Message]:
        """The system (when overridden) and user messages that open a rollout for ``problem``."""
        messages: list[Message] = []
        if self.config.system_prompt is not None:
            messages.append({"role": "system", "content": self.config.system_prompt})
        messages.append({"role": "user", "content": user_prompt(problem)})
        return messages

    @staticmethod
    def to_messages(messages: Sequence[ChatMessage]) -> list[Message]:
        """rstar2-data chat messages (SFT transcripts) as the template's input."""
        return [message.model_dump(exclude_none=True) for message in messages]
