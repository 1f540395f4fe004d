"""Installing rstar2's chat template on a tokenizer.

The template and the protocol's text (chat markers, tags, system prompt, user turn) live in
rstar2-data (``rstar2_data.protocol``), the one definition that SFT data, rollouts and evaluation
share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rstar2_data.protocol import CHAT_TEMPLATE, SPECIAL_TOKENS

if TYPE_CHECKING:  # transformers loads only where a tokenizer is used: configs stay light
    from transformers import PreTrainedTokenizerBase


def install_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Set rstar2's template on ``tokenizer``, replacing any it ships (e.g. before saving it).

    The turn markers must be single tokens of the vocabulary: the end-of-turn marker is the stop
    token of every assistant turn.
    """
    vocab = tokenizer.get_vocab()
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(
            f"tokenizer lacks the chat template's special tokens {missing}; add them with "
            "tokenizer.add_special_tokens and resize the model's embeddings"
        )
    tokenizer.chat_template = CHAT_TEMPLATE
