"""The conformance suite every ``Engine`` passes.

Each implementation is an entry of ``FACTORIES``: an async context manager that takes the shared
test resources and yields an ``EngineCase``. Add an engine by adding a factory.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import os
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from openai_server import create_app, serve
from tiny import Score, make_model, make_scorer
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rstar2_scheduler.engine import (
    Capability,
    Engine,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    UnsupportedOperationError,
)
from rstar2_scheduler.engines import (
    OpenAIEngine,
    OpenAIEngineConfig,
    ProcessEngine,
    ProcessEngineConfig,
    TransformersEngine,
    TransformersEngineConfig,
)
from rstar2_scheduler.sim import SimEngine, SimEngineConfig

pytestmark = pytest.mark.asyncio

CAPACITY = 2048  # a multiple of the test server's KV block size


@dataclass
class Resources:
    tokenizer: PreTrainedTokenizerFast
    model: Qwen2ForCausalLM
    score: Score


@dataclass
class EngineCase:
    engine: Engine
    vocab_size: int
    capacity_tokens: int
    score: Score | None  # recomputes log-probs when the engine runs a known model
    # Weights of another model of the same shape, and its scorer: what update_weights must load.
    new_weights: tuple[list[tuple[str, Any]], Score] | None = None


@contextlib.asynccontextmanager
async def transformers_case(res: Resources) -> AsyncIterator[EngineCase]:
    config = TransformersEngineConfig(kv_budget_tokens=CAPACITY, max_batch_size=4)
    # A private copy: weight updates must not leak into the session's shared model.
    async with TransformersEngine(copy.deepcopy(res.model), config) as engine:
        other = make_model(len(res.tokenizer), seed=1)
        new_weights = (list(other.state_dict().items()), make_scorer(other))
        yield EngineCase(engine, len(res.tokenizer), CAPACITY, res.score, new_weights)


@contextlib.asynccontextmanager
async def transformers_slots_case(res: Resources) -> AsyncIterator[EngineCase]:
    """Slot decoding (the accelerator path), here eager on the CPU."""
    config = TransformersEngineConfig(kv_budget_tokens=CAPACITY, max_batch_size=4, decode="slots")
    async with TransformersEngine(copy.deepcopy(res.model), config) as engine:
        other = make_model(len(res.tokenizer), seed=1)
        new_weights = (list(other.state_dict().items()), make_scorer(other))
        yield EngineCase(engine, len(res.tokenizer), CAPACITY, res.score, new_weights)


@contextlib.asynccontextmanager
async def process_case(res: Resources) -> AsyncIterator[EngineCase]:
    """A TransformersEngine in a child process, pinned to one core."""
    config = ProcessEngineConfig(
        engine=TransformersEngineConfig(kv_budget_tokens=CAPACITY, max_batch_size=4),
        cpus=(0,),
    )
    async with ProcessEngine(copy.deepcopy(res.model), config) as engine:
        other = make_model(len(res.tokenizer), seed=1)
        new_weights = (list(other.state_dict().items()), make_scorer(other))
        assert engine.pid is not None
        assert os.sched_getaffinity(engine.pid) == {0}
        yield EngineCase(engine, len(res.tokenizer), CAPACITY, res.score, new_weights)


@contextlib.asynccontextmanager
async def openai_case(res: Resources) -> AsyncIterator[EngineCase]:
    """Through the OpenAI-compatible test server with token-id prompts.

    Text prompts are exact only when the model's text re-encodes to the tokens it sampled, which
    a random model's output does not: text mode has its own tests in test_openai_engine.py.
    """
    backend = TransformersEngine(res.model, TransformersEngineConfig(kv_budget_tokens=CAPACITY))
    async with backend, serve(create_app(backend, res.tokenizer)) as url:
        config = OpenAIEngineConfig(
            base_url=url, model="tiny", prompt_format="token_ids", metrics_interval_s=0.05
        )
        async with OpenAIEngine(config) as engine:
            yield EngineCase(engine, len(res.tokenizer), CAPACITY, res.score)


@contextlib.asynccontextmanager
async def sim_case(res: Resources) -> AsyncIterator[EngineCase]:
    """The simulator on the real event loop, with millisecond steps; its log-probs are simulated."""
    config = SimEngineConfig(
        num_blocks=CAPACITY // 16,
        block_size=16,
        vocab_size=len(res.tokenizer),
        step_overhead_s=1e-3,
    )
    async with SimEngine(config) as engine:
        yield EngineCase(engine, len(res.tokenizer), CAPACITY, None)


FACTORIES: dict[str, Callable[[Resources], Any]] = {
    "transformers": transformers_case,
    "transformers-slots": transformers_slots_case,
    "openai": openai_case,
    "process": process_case,
    "sim": sim_case,
}


@pytest_asyncio.fixture(params=sorted(FACTORIES))
async def case(
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    model: Qwen2ForCausalLM,
    score: Score,
) -> AsyncIterator[EngineCase]:
    async with FACTORIES[request.param](Resources(tokenizer, model, score)) as engine_case:
        yield engine_case


def ask(
    prompt: list[int], max_new_tokens: int, *, key: str = "r", **sampling: Any
) -> GenerationRequest:
    return GenerationRequest(
        request_id=key,
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(max_new_tokens=max_new_tokens, **sampling),
    )


PROMPT = [5, 17, 42, 99, 3, 250, 11]


def check_shape(result: GenerationResult, request: GenerationRequest) -> None:
    assert result.request_id == request.request_id
    assert result.finish_reason in ("stop", "length"), result.error
    assert result.error is None
    assert 1 <= len(result.token_ids) <= request.sampling.max_new_tokens
    assert len(result.logprobs) == len(result.token_ids)
    assert all(math.isfinite(lp) and lp <= 1e-6 for lp in result.logprobs)


async def test_length_limit(case: EngineCase) -> None:
    request = ask(PROMPT, 6, temperature=1.0, seed=1)
    result = await case.engine.generate(request)
    check_shape(result, request)
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 6
    assert all(0 <= t < case.vocab_size for t in result.token_ids)


async def test_stop_token_ends_generation_and_is_kept(case: EngineCase) -> None:
    # Every token stops generation, so the first sampled one must end it.
    request = ask(PROMPT, 8, temperature=1.0, seed=2, stop_token_ids=tuple(range(case.vocab_size)))
    result = await case.engine.generate(request)
    check_shape(result, request)
    assert result.finish_reason == "stop"
    assert len(result.token_ids) == 1


async def test_same_seed_same_tokens(case: EngineCase) -> None:
    first = await case.engine.generate(ask(PROMPT, 8, temperature=1.0, seed=123))
    second = await case.engine.generate(ask(PROMPT, 8, temperature=1.0, seed=123))
    other = await case.engine.generate(ask(PROMPT, 8, temperature=1.0, seed=124))
    assert first.token_ids == second.token_ids
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-5)
    assert other.token_ids != first.token_ids


async def test_greedy_is_deterministic(case: EngineCase) -> None:
    results = [await case.engine.generate(ask(PROMPT, 6, temperature=0.0)) for _ in range(2)]
    assert results[0].token_ids == results[1].token_ids


async def test_concurrent_requests_all_complete(case: EngineCase) -> None:
    requests = [
        ask([*PROMPT[: 2 + i], 7 * i + 1], 3 + i, key=f"c{i}", temperature=1.0, seed=i)
        for i in range(6)
    ]
    results = await asyncio.gather(*(case.engine.generate(r) for r in requests))
    for request, result in zip(requests, results, strict=True):
        check_shape(result, request)


async def test_logprobs_are_the_sampling_distribution(case: EngineCase) -> None:
    if case.score is None:
        pytest.skip("this engine runs no model whose log-probs can be recomputed")
    for temperature in (0.7, 1.0):
        request = ask(PROMPT, 10, temperature=temperature, seed=9)
        result = await case.engine.generate(request)
        check_shape(result, request)
        expected = case.score(PROMPT, list(result.token_ids), temperature)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_kv_stats_describe_the_cache(case: EngineCase) -> None:
    requests = [ask(PROMPT, 24, key=f"k{i}", temperature=1.0, seed=i) for i in range(3)]
    tasks = [asyncio.create_task(case.engine.generate(r)) for r in requests]
    busy = []
    while not all(t.done() for t in tasks):
        busy.append(case.engine.kv_stats())
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert all(s.used_tokens <= s.capacity_tokens == case.capacity_tokens for s in busy)
    for _ in range(100):  # servers report on their own schedule
        idle = case.engine.kv_stats()
        if idle.running == 0 and idle.used_tokens == 0:
            break
        await asyncio.sleep(0.02)
    assert (idle.running, idle.waiting, idle.used_tokens) == (0, 0, 0)
    assert idle.capacity_tokens == case.capacity_tokens


async def test_impossible_request_fails_alone(case: EngineCase) -> None:
    too_big = ask(PROMPT, case.capacity_tokens, key="big")
    result = await case.engine.generate(too_big)
    assert result.finish_reason == "error"
    assert result.error
    assert result.token_ids == ()
    fine = ask(PROMPT, 4, key="fine", temperature=1.0, seed=3)
    check_shape(await case.engine.generate(fine), fine)


async def operations(engine: Engine) -> dict[Capability, list[Any]]:
    """One call per optional operation, for engines that say they lack it."""
    return {
        "update_weights": [engine.update_weights([])],
        "reset_prefix_cache": [engine.reset_prefix_cache()],
        "sleep": [engine.sleep(), engine.wake_up()],
    }


async def test_unsupported_operations_say_which_engine_and_why(case: EngineCase) -> None:
    engine = case.engine
    for capability, calls in (await operations(engine)).items():
        for call in calls:
            if engine.supports(capability):
                call.close()  # not awaited: the supported paths have their own tests
                continue
            with pytest.raises(UnsupportedOperationError, match=repr(engine.name)) as error:
                await call
            assert engine.unsupported_reason in str(error.value)


async def test_update_weights_switches_the_model(case: EngineCase) -> None:
    if not case.engine.supports("update_weights"):
        pytest.skip("this engine takes no weights")
    request = ask(PROMPT, 8, temperature=1.0, seed=21)
    await case.engine.generate(request)
    if case.new_weights is None:  # no model: updating must at least keep generation working
        await case.engine.update_weights([], version="1")
        after = await case.engine.generate(request)
        check_shape(after, request)
        assert after.weights_version == "1"
        return
    weights, new_score = case.new_weights
    await case.engine.update_weights(iter(weights), version="1")
    after = await case.engine.generate(request)
    check_shape(after, request)
    assert after.weights_version == "1"  # results name the weights that sampled them
    assert list(after.logprobs) == pytest.approx(
        new_score(PROMPT, list(after.token_ids), 1.0), abs=1e-4
    )


async def test_update_weights_rejects_a_wrong_name_or_shape(case: EngineCase) -> None:
    if case.new_weights is None or case.score is None:
        pytest.skip("this engine runs no model whose weights can be named")
    name, tensor = case.new_weights[0][0]
    good = case.new_weights[0][1:]
    with pytest.raises(ValueError, match=re.escape("no weight 'not.a.weight'")):
        await case.engine.update_weights([*good, ("not.a.weight", tensor)])
    with pytest.raises(ValueError, match=re.escape(f"{name!r} has shape")):
        await case.engine.update_weights([*good, (name, tensor.flatten()[:3])])
    # Nothing was loaded: the engine still runs the original model.
    request = ask(PROMPT, 6, temperature=1.0, seed=5)
    result = await case.engine.generate(request)
    expected = case.score(PROMPT, list(result.token_ids), 1.0)
    assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_prefix_cache_reset_keeps_outputs(case: EngineCase) -> None:
    if not case.engine.supports("reset_prefix_cache"):
        pytest.skip("this engine has no prefix cache to reset")
    request = ask(PROMPT * 6, 8, temperature=1.0, seed=31)
    before = await case.engine.generate(request)
    await case.engine.reset_prefix_cache()
    after = await case.engine.generate(request)
    assert after.token_ids == before.token_ids


async def test_sleep_refuses_requests_until_woken(case: EngineCase) -> None:
    if not case.engine.supports("sleep"):
        pytest.skip("this engine cannot sleep")
    request = ask(PROMPT, 6, temperature=1.0, seed=41)
    before = await case.engine.generate(request)
    await case.engine.sleep()
    asleep = await case.engine.generate(request)
    assert asleep.finish_reason == "error"
    assert "asleep" in (asleep.error or "")
    await case.engine.wake_up()
    assert (await case.engine.generate(request)).token_ids == before.token_ids
