"""Slot decoding's parts: the grouped-query decode attention, and when slots are chosen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.engines import TransformersEngine, TransformersEngineConfig, slots
from rstar2_scheduler.engines.padded import PaddedBatch
from rstar2_scheduler.engines.slots import SlotBatch, grouped_decode_attention


def tiny_qwen(**settings: Any) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        **settings,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


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
    auto = TransformersEngine(tiny_qwen(), TransformersEngineConfig(kv_budget_tokens=64))
    assert isinstance(auto._batch, PaddedBatch)
    sliding = tiny_qwen(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="not all full attention"):
        TransformersEngine(sliding, TransformersEngineConfig(kv_budget_tokens=64, decode="slots"))
    # A trainer's FlexAttention choice is not used to decode a padded batch.
    flex = tiny_qwen()
    flex.set_attn_implementation("flex_attention")
    TransformersEngine(flex, TransformersEngineConfig(kv_budget_tokens=64))
    assert flex.config._attn_implementation == "sdpa"


class FakeCompiler:
    """``torch.compile`` as slot decoding calls it, without compiling: each call of the
    "compiled" step runs it eagerly and charges ``seconds`` and ``graphs`` to the counters the
    engine reads (torch's own, in a real run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, seconds: float, graphs: int) -> None:
        self.spent, self.graphs, self.calls = 0.0, 0, 0
        monkeypatch.setattr(slots.torch, "compile", self.compile)
        monkeypatch.setattr(slots, "compile_seconds", lambda: self.spent)
        monkeypatch.setattr(slots, "compile_count", lambda: self.graphs)
        self.step_seconds, self.step_graphs = seconds, graphs

    def compile(self, function: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        assert options == {"mode": "reduce-overhead"}

        def compiled(*args: Any) -> Any:
            self.calls += 1
            self.spent += self.step_seconds
            self.graphs += self.step_graphs
            return function(*args)

        return compiled


async def generate(engine: TransformersEngine) -> list[tuple[int, ...]]:
    async with engine:
        results = await asyncio.gather(
            *(
                engine.generate(
                    GenerationRequest(
                        request_id=f"r{i}",
                        prompt_ids=(3, 4 + i, 5),
                        sampling=SamplingParams(max_new_tokens=8, seed=i),
                    )
                )
                for i in range(3)
            )
        )
    return [tuple(result.token_ids) for result in results]


def slot_engine(**settings: Any) -> TransformersEngine:
    config = TransformersEngineConfig(kv_budget_tokens=256, decode="slots", **settings)
    return TransformersEngine(tiny_qwen(), config)


def test_slot_decoding_is_eager_by_default() -> None:
    # On every device: compiling has not been shown to pay for itself on a GPU.
    assert TransformersEngineConfig(kv_budget_tokens=64).compile is False
    engine = slot_engine()
    assert isinstance(engine._batch, SlotBatch)
    assert engine._batch.compile is False


@pytest.mark.parametrize(
    ("cost", "limits", "compiled_steps"),
    [
        # 5 s a step against a 12 s budget: over it after the third compiled step.
        ({"seconds": 5.0, "graphs": 0}, {"compile_budget_s": 12.0}, 3),
        # A recompile on every step against 2 graphs: a storm after the third step.
        ({"seconds": 0.0, "graphs": 1}, {"max_compiled_graphs": 2}, 3),
    ],
    ids=["time", "recompile-storm"],
)
def test_compiling_past_its_budget_decodes_eagerly_for_the_rest_of_the_run(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cost: dict[str, float],
    limits: dict[str, float],
    compiled_steps: int,
) -> None:
    eager = asyncio.run(generate(slot_engine()))
    compiler = FakeCompiler(monkeypatch, seconds=cost["seconds"], graphs=int(cost["graphs"]))
    engine = slot_engine(compile=True, **limits)
    with caplog.at_level(logging.WARNING, logger=slots.__name__):
        tokens = asyncio.run(generate(engine))
    assert compiler.calls == compiled_steps  # then eager: 7 decode steps in all
    assert isinstance(engine._batch, SlotBatch)
    assert engine._batch.compile is False
    assert "decoding eagerly from now on" in caplog.text
    assert tokens == eager  # the same tokens, compiled or not


def test_a_compiler_error_decodes_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(function: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        def compiled(*args: Any) -> Any:
            raise RuntimeError("backend compiler failed")

        return compiled

    eager = asyncio.run(generate(slot_engine()))
    monkeypatch.setattr(slots.torch, "compile", broken)
    engine = slot_engine(compile=True)
    with caplog.at_level(logging.ERROR, logger=slots.__name__):
        assert asyncio.run(generate(engine)) == eager
    assert "compiling the slot decode step failed; decoding eagerly" in caplog.text
