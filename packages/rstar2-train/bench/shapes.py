"""The model shapes the GPU benchmark builds (random weights, from their configs): importable
without torch or rstar2, so tests can plan for them."""

from __future__ import annotations

from typing import Any

QWEN3: dict[str, Any] = {
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
}
SHAPES: dict[str, dict[str, Any]] = {
    "0.6b": {
        **QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
    },
    "4b": {
        **QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
}
