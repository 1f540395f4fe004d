"""Parameters loaded in parts beyond fused q/k/v and gate/up: an MoE layer's experts (vLLM's
``FusedMoE`` loader signature, with experts split between ranks), and a fused layer whose loader
takes shard ids rstar2 cannot read (as vLLM 0.33's ``index_q``/``index_k``): after discarded
weights the first is checked part by part, the second refused in one line."""

from __future__ import annotations

import pytest
import torch
from vllm_standin import SMALLEST, ExpertModel, StandInAsyncLLM, expert_weights

from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig

pytestmark = pytest.mark.asyncio


def expert_engine(
    *, fused_shards: tuple[str, str] = ("q", "k")
) -> tuple[VLLMEngine, StandInAsyncLLM]:
    """Two ranks splitting four experts (rank 0: 0 and 1, rank 1: 2 and 3)."""
    llm = StandInAsyncLLM(SMALLEST, tp=2)
    for rank, worker in enumerate(llm.workers):
        worker.model = ExpertModel([2 * rank, 2 * rank + 1], fused_shards=fused_shards)
    llm._account()
    config = VLLMEngineConfig(model="stand-in", weight_bucket_mb=0.001)
    return VLLMEngine(config, llm=llm, transport=llm.memory.engine()), llm


async def test_experts_load_on_their_rank_and_each_part_is_checked_after_sleep_2() -> None:
    engine, llm = expert_engine()
    full = expert_weights()
    workers = await engine.workers()
    assert workers[1].parts["model.experts.w13_weight"] == [
        "expert0.w1",
        "expert0.w3",
        "expert1.w1",
        "expert1.w3",
    ]
    await engine.update_weights(full.items())
    for rank, model in enumerate(llm.models()):
        expert = 2 * rank + 1  # the rank's second expert (local 1)
        w13 = model.params()["model.experts.w13_weight"][1]
        assert torch.equal(w13[4:], full[f"model.experts.{expert}.w3.weight"])
        assert torch.equal(
            model.params()["model.experts.w2_weight"][1], full[f"model.experts.{expert}.w2.weight"]
        )

    await engine.sleep(2)
    without = {n: t for n, t in full.items() if n != "model.experts.3.w3.weight"}
    with pytest.raises(RuntimeError) as refused:
        await engine.update_weights(without.items())
    message = str(refused.value)
    assert "left 1 parameter(s) or part(s) of rank 1 without weights: " in message
    assert message.endswith("model.experts.w13_weight[expert1.w3]")  # local expert 1: global 3
    await engine.update_weights(full.items())
    await engine.wake_up()
    assert engine._refusal() is None


async def test_unreadable_shard_ids_load_but_refuse_a_checked_sync_in_one_line() -> None:
    engine, llm = expert_engine(fused_shards=("index_q", "index_k"))
    full = expert_weights()
    await engine.update_weights(full.items())  # nothing to check: partial syncs load
    fused = llm.models()[0].params()["model.fused_qk.weight"]
    assert torch.equal(fused[4:], full["model.fused_qk.k_part.weight"])

    await engine.sleep(2)
    with pytest.raises(RuntimeError) as refused:
        await engine.update_weights(full.items())
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "cannot tell which part of model.fused_qk.weight its loader wrote (shard id 'index_q'"
        in (message)
    )
    assert "refuses it" in message
    assert engine._refusal() is not None
