"""What VLLMEngine's log-probs mean: the trainer's recomputation, ``log_softmax(logits / T)`` at
the sampled token, for the ``logprobs_mode`` the engine is started with for its sampling.

Where vLLM is installed, its own sampler (the V1 model runner's ``Sampler``, which runs on a CPU)
draws tokens from a tiny model's logits in each mode, and its log-probs are compared with
``rstar2_algo.selective_log_softmax``, the trainer's recomputation. vLLM's default GPU model
runner (V2) needs Triton and does not run here; its sampler, read in vLLM 0.32 and 0.33's source,
takes processed log-probs after the same top-k/top-p masking.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm_standin import SMALLEST, StandInAsyncLLM

from rstar2_algo import selective_log_softmax
from rstar2_scheduler.engine import GenerationRequest, SamplingParams
from rstar2_scheduler.engines.vllm import (
    LogprobsMode,
    VLLMEngine,
    VLLMEngineConfig,
    engine_arguments,
    logprobs_mode_for,
    temperature_logprobs,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra")

MODES: list[LogprobsMode] = ["processed_logprobs", "raw_logprobs"]
SAMPLINGS = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.0, 1.0), (0.7, 0.9), (1.3, 1.0)]
"""(temperature, top_p): the paper's T = 1, a lower and a higher T, top-p at T = 1, greedy, and
top-p below T = 1, for which no vLLM mode gives the trainer's log-probs."""


def test_the_mode_for_each_sampling() -> None:
    assert logprobs_mode_for(1.0, 1.0) == "processed_logprobs"
    assert logprobs_mode_for(0.7, 1.0) == "processed_logprobs"
    assert logprobs_mode_for(0.0, 0.5) == "processed_logprobs"
    assert logprobs_mode_for(1.0, 0.9) == "raw_logprobs"
    with pytest.raises(ValueError, match=r"temperature-0\.7 log-probs for top_p 0\.9"):
        logprobs_mode_for(0.7, 0.9)
    for temperature, top_p in SAMPLINGS:
        sampling = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p)
        matching = [mode for mode in MODES if temperature_logprobs(mode, sampling)]
        if matching:
            assert logprobs_mode_for(temperature, top_p) in matching
        else:
            assert (temperature, top_p) == (0.7, 0.9)


def test_with_supports_processed_log_probs_are_the_trainers_at_any_nucleus() -> None:
    assert logprobs_mode_for(0.7, 0.9, top_k=20, return_support=True) == "processed_logprobs"
    assert logprobs_mode_for(1.0, 0.9, return_support=True) == "processed_logprobs"
    with pytest.raises(ValueError, match=r"top_p 1, top_k 20.*return_support"):
        logprobs_mode_for(0.7, 1.0, top_k=20)
    # Without supports a top-k cut is vLLM's processed mode renormalised, not the trainer's.
    top_k = SamplingParams(max_new_tokens=1, temperature=0.7, top_k=20)
    assert not temperature_logprobs("processed_logprobs", top_k)
    assert temperature_logprobs(
        "processed_logprobs", top_k.model_copy(update={"return_support": True})
    )
    assert not temperature_logprobs(
        "raw_logprobs", SamplingParams(max_new_tokens=1, return_support=True, top_p=0.9)
    )


@needs_vllm
@pytest.mark.asyncio
@pytest.mark.parametrize("started_with_masks", [True, False])
async def test_supports_come_from_vllms_sampling_mask(started_with_masks: bool) -> None:
    llm = StandInAsyncLLM(SMALLEST, sampling_masks=[[1, 7, 3], [2]])
    args = {"return_sampling_mask": True} if started_with_masks else {}
    engine = VLLMEngine(
        VLLMEngineConfig(model="m", engine_args=args), llm=llm, transport=llm.memory.engine()
    )
    sampling = SamplingParams(max_new_tokens=2, temperature=0.7, top_p=0.9, top_k=8)
    request = GenerationRequest(
        request_id="r",
        prompt_ids=(1,),
        sampling=sampling.model_copy(update={"return_support": True}),
    )
    running = asyncio.create_task(engine.generate(request))
    if started_with_masks:
        await llm.held.wait()
        llm.release()
    result = await running
    if started_with_masks:
        assert result.support == ((1, 7, 3), (2,))
        assert result.token_ids == (1, 2)
    else:
        assert result.finish_reason == "error"
        assert result.error is not None
        assert "return_sampling_mask: true" in result.error


@needs_vllm
def test_vllm_requests_carry_top_k() -> None:
    from rstar2_scheduler.engines.vllm import vllm_sampling_params

    assert vllm_sampling_params(SamplingParams(max_new_tokens=3, top_k=20)).top_k == 20
    assert vllm_sampling_params(SamplingParams(max_new_tokens=3)).top_k == 0


def test_the_engine_starts_vllm_with_its_configured_mode() -> None:
    assert engine_arguments(VLLMEngineConfig(model="m"))["logprobs_mode"] == "processed_logprobs"
    raw = VLLMEngineConfig(model="m", logprobs_mode=logprobs_mode_for(1.0, 0.9))
    assert engine_arguments(raw)["logprobs_mode"] == "raw_logprobs"
    with pytest.raises(ValueError, match="logprobs_mode as the config's own field"):
        VLLMEngineConfig(model="m", engine_args={"logprobs_mode": "processed_logits"})
    with pytest.raises(ValueError, match="logprobs_mode"):
        VLLMEngineConfig.model_validate({"model": "m", "logprobs_mode": "raw_logits"})


@needs_vllm
@pytest.mark.asyncio
async def test_a_request_whose_log_probs_differ_from_the_trainers_is_served_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = StandInAsyncLLM(SMALLEST)
    engine = VLLMEngine(VLLMEngineConfig(model="m"), llm=llm, transport=llm.memory.engine())
    nucleus = SamplingParams(max_new_tokens=2, top_p=0.9)
    with caplog.at_level(logging.WARNING, logger="rstar2_scheduler.engines.vllm"):
        for index, sampling in enumerate([nucleus, nucleus, SamplingParams(max_new_tokens=2)]):
            request = GenerationRequest(request_id=f"r{index}", prompt_ids=(1,), sampling=sampling)
            running = asyncio.create_task(engine.generate(request))
            await llm.held.wait()
            llm.release()
            assert (await running).finish_reason == "stop"  # served all the same
    warnings = [r.getMessage() for r in caplog.records if "a trainer recomputes" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        "top_p 0.9, top_k 0 are vLLM's processed_logprobs, renormalised over the top-p nucleus"
        in (warnings[0])
    )


def tiny_logits() -> torch.Tensor:
    """Next-token logits of a tiny random Qwen2 at a few prompts: rows of a decode step."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)  # a peaked distribution: top-p cuts it
        prompts = torch.randint(0, config.vocab_size, (8, 6))
        return model(prompts).logits[:, -1].float()


def vllm_sample(logits: torch.Tensor, mode: LogprobsMode, temperature: float, top_p: float) -> Any:
    """One step of vLLM's own sampler over ``logits``, sampled-token log-probs requested as
    ``VLLMEngine`` requests them (``logprobs=0``), seeded per row."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    rows = logits.shape[0]
    metadata = SamplingMetadata(
        temperature=torch.full((rows,), temperature),
        all_greedy=temperature == 0,
        all_random=temperature > 0,
        top_p=None if top_p == 1 else torch.full((rows,), top_p),
        top_k=None,
        generators={row: torch.Generator().manual_seed(row) for row in range(rows)},
        max_num_logprobs=0,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    return Sampler(logprobs_mode=mode)(logits.clone(), metadata)


@needs_vllm
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("temperature", "top_p"), SAMPLINGS)
def test_vllms_sampler_gives_the_trainers_log_probs_exactly_where_the_engine_says(
    mode: LogprobsMode, temperature: float, top_p: float
) -> None:
    logits = tiny_logits()
    output = vllm_sample(logits, mode, temperature, top_p)
    tokens = output.sampled_token_ids[:, 0].long()
    reported = output.logprobs_tensors.logprobs[:, 0]  # the sampled token's, first
    assert torch.equal(output.logprobs_tensors.logprob_token_ids[:, 0].long(), tokens)
    trainer = selective_log_softmax(logits, tokens, temperature=temperature or 1.0)
    if top_p < 1 and temperature > 0:  # every drawn token is in its row's nucleus
        probs = torch.softmax(logits / temperature, -1)
        above = (probs > probs.gather(1, tokens[:, None])).float() * probs
        assert bool((above.sum(-1) < top_p).all())
    sampling = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p)
    gap = float((reported - trainer).abs().max())
    if temperature_logprobs(mode, sampling):
        assert gap < 1e-5
    else:  # what the engine warns of: vLLM's numbers are not the trainer's
        assert gap > 1e-2
