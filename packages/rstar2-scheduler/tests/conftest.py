"""Shared fixtures: a tiny tokenizer trained on the fly and tiny random-weight models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rstar2_data import build_tokenizer
from rstar2_data.demo import demo_transcripts
from rstar2_scheduler.protocol import CHAT_TEMPLATE, SPECIAL_TOKENS, ChatProtocol

# Test helpers (tiny models, scripted engines, an OpenAI-compatible test server) live next to the
# tests.
sys.path.insert(0, str(Path(__file__).parent / "helpers"))

from tiny import Score, make_model, make_scorer

EOS = "<|endoftext|>"


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on rendered demo SFT transcripts, with ChatML tokens."""
    specials = [EOS, *SPECIAL_TOKENS]
    bootstrap = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(["bootstrap"], special_tokens=specials, vocab_size=300)
    )
    chat = ChatProtocol(bootstrap)
    texts = [
        chat.render(chat.to_messages(example.messages), add_generation_prompt=False)
        for example in demo_transcripts(24, seed=7)
    ]
    trained = build_tokenizer(texts, special_tokens=specials, vocab_size=700)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=trained, eos_token=EOS, pad_token=EOS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A tiny random-weight model over the test tokenizer's vocabulary."""
    return make_model(len(tokenizer))


@pytest.fixture(scope="session")
def score(model: Qwen2ForCausalLM) -> Score:
    """Log-probs under the session's tiny model, recomputed as a trainer does."""
    return make_scorer(model)
