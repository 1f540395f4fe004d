"""Shared fixtures: a tiny tokenizer trained on the fly and tiny random-weight models."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rstar2_data import build_tokenizer
from rstar2_data.demo import demo_transcripts
from rstar2_scheduler.protocol import CHAT_TEMPLATE, SPECIAL_TOKENS, ChatProtocol

# Test helpers (scripted engines, an OpenAI-compatible test server) live next to the tests.
sys.path.insert(0, str(Path(__file__).parent / "helpers"))

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


def make_model(vocab_size: int, *, seed: int = 0, hidden_size: int = 32) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 with random weights (seeded)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="session")
def model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """A tiny random-weight model over the test tokenizer's vocabulary."""
    return make_model(len(tokenizer))


@pytest.fixture(scope="session")
def score(model: Qwen2ForCausalLM) -> Callable[[list[int], list[int], float], list[float]]:
    """Recompute log-probs of ``completion`` after ``prompt`` with one plain forward pass.

    This is what a trainer does: no cache, no padding, temperature-scaled log-softmax.
    """

    def _score(prompt: list[int], completion: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + completion])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0].float()
        scaled = logits / temperature if temperature > 0 else logits
        log_probs = torch.log_softmax(scaled, dim=-1)
        start = len(prompt) - 1
        return [float(log_probs[start + i, token]) for i, token in enumerate(completion)]

    return _score
