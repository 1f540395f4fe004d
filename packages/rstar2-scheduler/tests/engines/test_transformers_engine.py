"""TransformersEngine: batching under its own KV budget, exact log-probs, cancellation, close;
every test runs with both KV layouts (a padded DynamicCache, and per-row slots)."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import Score, make_model, make_scorer
from transformers import PreTrainedModel, Qwen2ForCausalLM

from rstar2_scheduler.engine import GenerationRequest, KVStats, SamplingParams
from rstar2_scheduler.engines import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engines.slots import COLUMN_BLOCK, SlotBatch

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["padded", "slots"])
def decode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_engine(model: PreTrainedModel, decode: str, **settings: Any) -> TransformersEngine:
    """An engine in ``decode`` mode on a copy of the session's model (slot decoding switches
    the model's attention, and tests hook the engine's model)."""
    return TransformersEngine(
        copy.deepcopy(model), TransformersEngineConfig(decode=decode, **settings)
    )


def record_forwards(
    engine: TransformersEngine, after: int = 0, then: Any = None
) -> list[tuple[int, ...]]:
    """The ``input_ids`` shape of every forward of the engine's model (``then()`` runs once
    ``after`` of them were recorded)."""
    forwards: list[tuple[int, ...]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        forwards.append(tuple(kwargs["input_ids"].shape))
        if then is not None and len(forwards) == after:
            then()

    engine.model.register_forward_pre_hook(record, with_kwargs=True)
    return forwards


def ask(prompt: list[int], n: int, key: str, **sampling: object) -> GenerationRequest:
    return GenerationRequest(
        request_id=key,
        prompt_ids=tuple(prompt),
        sampling=SamplingParams.model_validate({"max_new_tokens": n, **sampling}),
    )


async def test_left_padded_batches_score_like_single_sequences(
    model: Qwen2ForCausalLM, score: Score, decode: str
) -> None:
    """Rows of different lengths, joining mid-decode and leaving early, keep exact log-probs."""
    prompts = [[(7 * i + j) % 600 + 3 for j in range(3 + 5 * i)] for i in range(6)]
    async with make_engine(model, decode, kv_budget_tokens=4096, max_batch_size=8) as engine:
        first = [
            asyncio.create_task(engine.generate(ask(p, 4 + 3 * i, f"a{i}", seed=i)))
            for i, p in enumerate(prompts[:3])
        ]
        await asyncio.sleep(0.05)  # the rest join a batch that is already decoding
        later = [
            asyncio.create_task(engine.generate(ask(p, 12, f"b{i}", seed=10 + i)))
            for i, p in enumerate(prompts[3:])
        ]
        results = await asyncio.gather(*first, *later)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.finish_reason == "length"
        expected = score(prompt, list(result.token_ids), 1.0)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_kv_budget_bounds_admission(model: Qwen2ForCausalLM, decode: str) -> None:
    # Each request reserves 10 + 30 = 40 tokens: a budget of 100 admits two at a time.
    async with make_engine(model, decode, kv_budget_tokens=100, max_batch_size=8) as engine:
        tasks = [
            asyncio.create_task(engine.generate(ask(list(range(3, 13)), 30, f"r{i}", seed=i)))
            for i in range(5)
        ]
        seen: list[KVStats] = []
        while not all(task.done() for task in tasks):
            seen.append(engine.kv_stats())
            await asyncio.sleep(0.005)
        results = await asyncio.gather(*tasks)
        idle = engine.kv_stats()
    assert all(r.finish_reason == "length" and len(r.token_ids) == 30 for r in results)
    assert max(s.running for s in seen) == 2
    assert max(s.waiting for s in seen) >= 1
    assert all(s.used_tokens <= 80 and s.capacity_tokens == 100 for s in seen)
    assert all(s.max_running == 8 for s in seen)  # max_batch_size
    assert max(s.used_tokens for s in seen) > 20
    assert (idle.running, idle.waiting, idle.used_tokens, idle.preemptions) == (0, 0, 0, 0)


async def test_rejections_name_the_limit(model: Qwen2ForCausalLM, decode: str) -> None:
    async with make_engine(model, decode, kv_budget_tokens=50) as engine:
        too_long = await engine.generate(ask([3] * 30, 30, "long"))
        outside = await engine.generate(ask([3, 10**6], 2, "vocab"))
    assert too_long.finish_reason == "error"
    assert "exceeds kv_budget_tokens (50)" in (too_long.error or "")
    assert "outside the vocabulary" in (outside.error or "")


async def test_cancelled_request_leaves_the_batch(
    model: Qwen2ForCausalLM, score: Score, decode: str
) -> None:
    async with make_engine(model, decode, kv_budget_tokens=2048) as engine:
        doomed = asyncio.create_task(engine.generate(ask([4, 5, 6], 500, "doomed", seed=1)))
        kept = asyncio.create_task(engine.generate(ask([7, 8, 9, 10], 40, "kept", seed=2)))
        await asyncio.sleep(0.05)
        doomed.cancel()
        result = await kept
        with pytest.raises(asyncio.CancelledError):
            await doomed
        for _ in range(200):  # the batcher drops the row at its next step
            if engine.kv_stats().running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.kv_stats().running == 0
    assert result.finish_reason == "length"
    assert list(result.logprobs) == pytest.approx(
        score([7, 8, 9, 10], list(result.token_ids), 1.0), abs=1e-4
    )


async def test_close_aborts_pending_requests(model: Qwen2ForCausalLM, decode: str) -> None:
    # One request at a time, each far longer than the wait: none can finish before close().
    engine = make_engine(model, decode, kv_budget_tokens=3000)
    tasks = [asyncio.create_task(engine.generate(ask([3, 4], 2000, f"r{i}"))) for i in range(3)]
    await asyncio.sleep(0.05)
    await engine.close()
    results = await asyncio.gather(*tasks)
    assert {r.finish_reason for r in results} == {"abort"}
    assert all(r.error == "engine closed" for r in results)


async def test_greedy_and_top_p(model: Qwen2ForCausalLM, score: Score, decode: str) -> None:
    prompt = [11, 12, 13, 14]
    async with make_engine(model, decode, kv_budget_tokens=512) as engine:
        greedy = await engine.generate(ask(prompt, 8, "g", temperature=0.0))
        nucleus = await engine.generate(ask(prompt, 8, "p", temperature=1.0, top_p=1e-6, seed=5))
    # Greedy reports plain log-softmax; a vanishing top-p leaves only the most likely token.
    assert list(greedy.logprobs) == pytest.approx(
        score(prompt, list(greedy.token_ids), 1.0), abs=1e-4
    )
    assert nucleus.token_ids == greedy.token_ids
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[*prompt, *greedy.token_ids]])).logits[0]
    assert greedy.token_ids == tuple(int(t) for t in logits[len(prompt) - 1 : -1].argmax(-1))


async def test_a_nucleus_request_returns_its_supports_and_renormalised_log_probs(
    model: Qwen2ForCausalLM, decode: str
) -> None:
    prompt = [11, 12, 13, 14]
    sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 40, "seed": 3}
    async with make_engine(model, decode, kv_budget_tokens=512) as engine:
        plain = await engine.generate(ask(prompt, 12, "plain", **sampling))
        asked = await engine.generate(ask(prompt, 12, "asked", return_support=True, **sampling))
    assert plain.support is None
    assert asked.token_ids == plain.token_ids  # the same draw; only what is reported differs
    assert asked.support is not None
    assert len(asked.support) == len(asked.token_ids)
    with torch.inference_mode():
        ids = torch.tensor([[*prompt, *asked.token_ids]])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / 0.7
    for position, (token, support) in enumerate(zip(asked.token_ids, asked.support, strict=True)):
        probs, order = torch.sort(torch.softmax(logits[position], -1), descending=True)
        kept = order[:40][(torch.cumsum(probs[:40], 0) - probs[:40]) / probs[:40].sum() < 0.8]
        assert set(support) == set(kept.tolist())
        assert token in support
        row = logits[position]
        renormalised = row[token] - torch.logsumexp(row[list(support)], 0)
        assert asked.logprobs[position] == pytest.approx(float(renormalised), abs=1e-4)
        assert plain.logprobs[position] == pytest.approx(
            float(torch.log_softmax(row, -1)[token]), abs=1e-4
        )


async def test_from_pretrained(
    model: Qwen2ForCausalLM, tmp_path: Path, score: Score, decode: str
) -> None:
    model.save_pretrained(tmp_path)
    config = TransformersEngineConfig(kv_budget_tokens=256, name="loaded", decode=decode)
    async with TransformersEngine.from_pretrained(tmp_path, config) as engine:
        result = await engine.generate(ask([5, 6, 7], 5, "x", seed=1))
    assert engine.name == "loaded"
    assert list(result.logprobs) == pytest.approx(
        score([5, 6, 7], list(result.token_ids), 1.0), abs=1e-4
    )


async def test_samples_of_one_prompt_share_a_prefill_and_keep_their_own_streams(
    model: Qwen2ForCausalLM, score: Score, decode: str
) -> None:
    """Eight samples of one prompt (an RL group) are prefilled once and copied; each keeps exact
    log-probs, and its tokens are those it draws when generated alone with the same seed."""
    prompt = [(5 * j) % 600 + 3 for j in range(40)]
    async with make_engine(model, decode, kv_budget_tokens=4096, max_batch_size=16) as engine:
        forwards = record_forwards(engine)
        group = await asyncio.gather(
            *(engine.generate(ask(prompt, 10, f"s{i}", seed=i)) for i in range(8))
        )
        alone = await engine.generate(ask(prompt, 10, "alone", seed=3))
    # The group's prefill ran the prompt once; its decode steps ran all eight rows.
    assert forwards[0] == (1, len(prompt))
    assert forwards[1] == (8, 1)
    assert len({r.token_ids for r in group}) > 1
    assert group[3].token_ids == alone.token_ids
    for result in group:
        expected = score(prompt, list(result.token_ids), 1.0)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_a_joining_request_is_prefilled_alone(
    model: Qwen2ForCausalLM, score: Score, decode: str
) -> None:
    """A request that arrives mid-decode (a rollout back from a tool call) costs its own prefill:
    the running rows keep their cache and continue beside it with exact log-probs."""
    async with make_engine(model, decode, kv_budget_tokens=4096, max_batch_size=8) as engine:
        decoding = asyncio.Event()
        loop = asyncio.get_running_loop()
        forwards = record_forwards(engine, 3, lambda: loop.call_soon_threadsafe(decoding.set))
        early = [[3 + j for j in range(12)], [40 + j for j in range(5)]]
        running = [
            asyncio.create_task(engine.generate(ask(p, 40, f"e{i}", seed=i)))
            for i, p in enumerate(early)
        ]
        await decoding.wait()
        late = [90 + j for j in range(20)]
        joined = await engine.generate(ask(late, 6, "late", seed=7))
        results = [*await asyncio.gather(*running), joined]
    assert forwards[0] == (2, 12)
    assert (1, 20) in forwards  # the late request alone, at its own length
    assert all(shape[1] == 1 for shape in forwards[1:] if shape != (1, 20))
    for prompt, result in zip([*early, late], results, strict=True):
        expected = score(prompt, list(result.token_ids), 1.0)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_slots_grow_for_a_longer_request_and_keep_exact_logprobs(
    model: Qwen2ForCausalLM, score: Score
) -> None:
    """A row that needs more columns than the slot cache has reallocates it; the rows it held
    keep their keys and values and continue exactly."""
    async with make_engine(model, "slots", kv_budget_tokens=4096, max_batch_size=4) as engine:
        held, release = asyncio.Event(), threading.Event()
        loop = asyncio.get_running_loop()

        def hold() -> None:  # in the engine's thread, before its first decode step
            loop.call_soon_threadsafe(held.set)
            release.wait()

        record_forwards(engine, after=2, then=hold)
        short = asyncio.create_task(engine.generate(ask([3, 4, 5], 60, "short", seed=1)))
        prompt = [(3 * j) % 500 + 2 for j in range(300)]
        try:
            # Held after the short row's prefill, however slow the machine: its cache exists.
            await held.wait()
            batch = engine._batch
            assert isinstance(batch, SlotBatch)
            assert batch.cache is not None
            assert batch.cache.column_count == COLUMN_BLOCK
            long_task = asyncio.create_task(engine.generate(ask(prompt, 8, "long", seed=2)))
            await asyncio.sleep(0)  # generate() queues it without waiting for anything
            assert [row.request.request_id for row in engine._pending] == ["long"]
        finally:
            release.set()
        long = await long_task
        assert batch.cache.column_count == 2 * COLUMN_BLOCK
        results = [await short, long]
    for request_prompt, result in zip([[3, 4, 5], prompt], results, strict=True):
        assert result.finish_reason == "length"
        expected = score(request_prompt, list(result.token_ids), 1.0)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)


async def test_weights_change_between_requests_and_results_name_their_version(
    model: Qwen2ForCausalLM, score: Score, decode: str
) -> None:
    """A request running when new weights arrive finishes on the old ones; one arriving while
    the update waits runs on the new ones; each result names its version."""
    other = make_model(model.config.vocab_size, seed=1)
    new_score = make_scorer(other)
    prompt = [5, 17, 42, 99, 3]
    config = TransformersEngineConfig(decode=decode, kv_budget_tokens=4096, max_batch_size=8)
    # A private copy: the update must not reach the session's model (the scorer's).
    async with TransformersEngine(copy.deepcopy(model), config) as engine:
        decoding = asyncio.Event()
        loop = asyncio.get_running_loop()
        record_forwards(engine, after=2, then=lambda: loop.call_soon_threadsafe(decoding.set))
        running = asyncio.create_task(engine.generate(ask(prompt, 24, "old", seed=1)))
        await decoding.wait()
        update = asyncio.create_task(
            engine.update_weights(iter(other.state_dict().items()), version="7")
        )
        await asyncio.sleep(0)
        waiting = asyncio.create_task(engine.generate(ask(prompt, 8, "new", seed=2)))
        old = await running
        assert not waiting.done()
        await update
        new = await waiting
    assert old.weights_version is None
    assert list(old.logprobs) == pytest.approx(score(prompt, list(old.token_ids), 1.0), abs=1e-4)
    assert new.weights_version == "7"
    assert list(new.logprobs) == pytest.approx(
        new_score(prompt, list(new.token_ids), 1.0), abs=1e-4
    )


async def test_padding_a_finished_row_leaves_behind_is_dropped(
    model: Qwen2ForCausalLM, score: Score
) -> None:
    """When the longest row finishes, the left padding it forced on the others goes with it: a
    batch that never empties (continuous batching) attends over its live rows' width only, and
    the remaining rows keep exact log-probs."""
    async with make_engine(model, "padded", kv_budget_tokens=4096, max_batch_size=8) as engine:
        widths: list[int] = []

        def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            widths.append(int(kwargs["attention_mask"].shape[1]))

        engine.model.register_forward_pre_hook(record, with_kwargs=True)
        long, short = [3 + j % 500 for j in range(60)], [7, 8, 9, 10]
        results = await asyncio.gather(
            engine.generate(ask(long, 2, "long", seed=1)),
            engine.generate(ask(short, 30, "short", seed=2)),
        )
    assert widths[0] == 60  # prefill, both rows left-padded to the long one
    # Once the long row has left, the short row's context alone sets the width.
    assert widths[-1] == len(short) + 30 - 1
    for prompt, result in zip([long, short], results, strict=True):
        expected = score(prompt, list(result.token_ids), 1.0)
        assert list(result.logprobs) == pytest.approx(expected, abs=1e-4)
