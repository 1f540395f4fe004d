"""Tiny random-weight models and the trainer-style log-prob recomputation the tests compare with."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

Score = Callable[[list[int], list[int], float], list[float]]


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


Score = Callable[[list[int], list[int], float], list[float]]


def make_scorer(model: Qwen2ForCausalLM) -> Score:
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
