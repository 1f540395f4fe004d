"""The prefix-preservation check accepts rstar2's template and names what breaks otherwise."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rstar2_data import build_tokenizer
from rstar2_data.demo import demo_transcripts
from rstar2_scheduler.protocol import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    ChatConfig,
    ChatProtocol,
    TemplateError,
    check_prefix_preserving,
    count_answer_tags,
)

# Like templates that drop the reasoning of earlier turns: only the last assistant turn keeps
# its content, so rendering more turns rewrites text already given to the model.
_FORGETFUL = CHAT_TEMPLATE.replace(
    "{{- turn_start + 'assistant\\n' + (message.content or '') -}}",
    "{{- turn_start + 'assistant\\n' + (message.content if loop.last else '') -}}",
)


def test_rstar2_template_is_prefix_preserving(tokenizer: PreTrainedTokenizerFast) -> None:
    check_prefix_preserving(ChatProtocol(tokenizer))
    check_prefix_preserving(ChatProtocol(tokenizer, ChatConfig(reason_prefill="")))


def test_template_rewriting_history_is_rejected(tokenizer: PreTrainedTokenizerFast) -> None:
    assert _FORGETFUL != CHAT_TEMPLATE
    own = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|endoftext|>"
    )
    own.chat_template = _FORGETFUL
    chat = ChatProtocol(own, ChatConfig(use_checkpoint_template=True))
    with pytest.raises(TemplateError, match="not prefix-preserving: rendering the conversation"):
        check_prefix_preserving(chat)


def test_tokenizer_merging_across_turn_pieces_is_rejected() -> None:
    """Without the pre-tokenizer's split, BPE merges text across the pieces rollouts append."""
    bootstrap = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(["x"], special_tokens=list(SPECIAL_TOKENS), vocab_size=300)
    )
    chat = ChatProtocol(bootstrap)
    texts = [
        chat.render(chat.to_messages(example.messages), add_generation_prompt=False)
        for example in demo_transcripts(16, seed=2)
    ]
    merging = Tokenizer(models.BPE())
    merging.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    merging.decoder = decoders.ByteLevel()
    merging.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=800,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    with pytest.raises(TemplateError, match="encoding the conversation piece by piece differs"):
        check_prefix_preserving(ChatProtocol(PreTrainedTokenizerFast(tokenizer_object=merging)))


def test_count_answer_tags() -> None:
    assert count_answer_tags("no answer") == 0
    assert count_answer_tags("<answer>1</answer> then <answer>2</answer>") == 2
