"""Tiny random-weight Qwen3 models for unit tests."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_model(
    vocab_size: int = 97, *, seed: int = 0, tied: bool = False, attention: str = "sdpa"
) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
    )
    config._attn_implementation = attention
    return Qwen3ForCausalLM(config)


def reference_logprobs(
    model: torch.nn.Module, ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """Log-prob of each token after the first, from one plain forward pass of ``ids`` alone."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
