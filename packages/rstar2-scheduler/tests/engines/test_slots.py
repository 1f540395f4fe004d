"""Slot decoding's parts: the grouped-query decode attention, and when slots are chosen."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rstar2_scheduler.engines import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engines.padded import PaddedBatch
from rstar2_scheduler.engines.slots import grouped_decode_attention


def test_grouped_decode_attention_is_sdpa_over_repeated_heads() -> None:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 8, 1, 16, generator=generator)
    key = torch.randn(3, 2, 20, 16, generator=generator)
    value = torch.randn(3, 2, 20, 16, generator=generator)
    lengths = torch.tensor([20, 7, 1])
    mask = (torch.arange(20) < lengths[:, None])[:, None, None, :]
    out, _ = grouped_decode_attention(torch.nn.Module(), query, key, value, mask, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(4, dim=1),
        value.repeat_interleave(4, dim=1),
        attn_mask=mask,
        scale=0.3,
    )
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_auto_decodes_padded_on_cpu_and_slots_need_full_attention() -> None:
    def tiny(**settings: Any) -> Qwen2ForCausalLM:
        config = Qwen2Config(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            **settings,
        )
        return Qwen2ForCausalLM(config)

    auto = TransformersEngine(tiny(), TransformersEngineConfig(kv_budget_tokens=64))
    assert isinstance(auto._batch, PaddedBatch)
    sliding = tiny(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="not all full attention"):
        TransformersEngine(sliding, TransformersEngineConfig(kv_budget_tokens=64, decode="slots"))
    # A trainer's FlexAttention choice is not used to decode a padded batch.
    flex = tiny()
    flex.set_attn_implementation("flex_attention")
    TransformersEngine(flex, TransformersEngineConfig(kv_budget_tokens=64))
    assert flex.config._attn_implementation == "sdpa"
