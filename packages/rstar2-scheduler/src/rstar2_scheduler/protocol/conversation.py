"""Append-only token bookkeeping of one multi-turn conversation.

The conversation is never re-tokenized: the prompt and each piece of template glue (end of the
assistant turn, the tool response as a user turn, the next assistant header) are encoded once and
appended after the model's own token ids. Model tokens get loss mask 1, their sampling
log-probs, the version label of the weights that sampled them and, where the engine reports it,
their sampling support; glue and tool tokens get mask 0, log-prob 0, no version and the whole
vocabulary as support.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rstar2_scheduler.protocol.chat import ChatProtocol, Message, TemplateError


class Glue(NamedTuple):
    """Template glue after a model turn: its ids, its text and the messages it renders."""

    ids: list[int]
    text: str
    messages: list[Message]


class Conversation:
    """The token ids, loss mask and log-probs of one conversation, built turn by turn."""

    def __init__(self, chat: ChatProtocol, messages: Sequence[Message]) -> None:
        self.chat = chat
        self.messages: list[Message] = list(messages)
        prefill = chat.config.reason_prefill
        self.text = chat.render(self.messages, add_generation_prompt=True) + prefill
        self.prompt_ids: list[int] = chat.encode(self.text)
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[str | None] = []
        self.support: list[list[int]] = []
        self._prefill = prefill

    @property
    def ids(self) -> list[int]:
        """Prompt and response ids so far: the next generation's prompt."""
        return self.prompt_ids + self.response_ids

    def add_model_turn(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        loss_mask: Sequence[int] | None = None,
        *,
        version: str | None = None,
        support: Sequence[Sequence[int]] | None = None,
    ) -> str:
        """Append one generated turn; returns its text (without the end-of-turn token).

        Model tokens get mask 1 unless ``loss_mask`` (one per token) says otherwise: a token the
        engine has no sampling log-prob for is not trained on. ``version`` labels the weights
        that sampled them (``GenerationResult.weights_version``), ``support`` (one per token)
        the ids each was drawn from (``GenerationResult.support``; None: the whole vocabulary).
        """
        if (
            len(token_ids) != len(logprobs)
            or (loss_mask is not None and len(loss_mask) != len(token_ids))
            or (support is not None and len(support) != len(token_ids))
        ):
            raise ValueError(
                f"a model turn needs one log-prob (and mask entry) per token: {len(token_ids)} "
                f"tokens, {len(logprobs)} log-probs"
            )
        self.response_ids += token_ids
        self.loss_mask += [1] * len(token_ids) if loss_mask is None else loss_mask
        self.logprobs += logprobs
        self.versions += [version] * len(token_ids)
        self.support += [[]] * len(token_ids) if support is None else [list(s) for s in support]
        self.text += self.chat.decode(token_ids)
        body = (
            token_ids[:-1] if token_ids and token_ids[-1] in self.chat.stop_token_ids else token_ids
        )
        content = self.chat.decode(body)
        self.messages.append({"role": "assistant", "content": self._prefill + content})
        self._prefill = ""
        return content

    def tool_response_glue(self, tool_text: str) -> Glue:
        """The ids that close the assistant turn, show ``tool_text`` and open the next turn.

        Nothing is appended yet (the caller checks the response budget first).
        """
        return self.glue([{"role": "tool", "content": tool_text}])

    def glue(self, messages: Sequence[Message]) -> Glue:
        """The ids that close the assistant turn, render ``messages`` (tool responses, a user
        follow-up) and open the next assistant turn; nothing is appended yet.

        The rendering of the conversation with ``messages`` must extend the text built so far;
        when the template rewrites earlier turns instead, this raises ``TemplateError``.
        """
        rendered = self.chat.render([*self.messages, *messages], add_generation_prompt=True)
        if not rendered.startswith(self.text):
            at = next(
                (i for i, (a, b) in enumerate(zip(rendered, self.text, strict=False)) if a != b),
                min(len(rendered), len(self.text)),
            )
            raise TemplateError(
                "the chat template is not prefix-preserving: rendering the conversation with the "
                f"next messages changes earlier text at character {at}: rendered "
                f"{rendered[at : at + 60]!r}, built turn by turn {self.text[at : at + 60]!r}"
            )
        text = rendered[len(self.text) :]
        return Glue(self.chat.encode(text), text, list(messages))

    def append_glue(self, glue: Glue) -> None:
        """Append template glue and the messages it renders (mask 0), made by ``glue``."""
        self.response_ids += glue.ids
        self.loss_mask += [0] * len(glue.ids)
        self.logprobs += [0.0] * len(glue.ids)
        self.versions += [None] * len(glue.ids)
        self.support += [[]] * len(glue.ids)
        self.text += glue.text
        self.messages.extend(glue.messages)
