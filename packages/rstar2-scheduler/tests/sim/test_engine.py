"""SimEngine: seeded outputs, the cost model in virtual time, preemption and its accounting."""

from __future__ import annotations

import asyncio

import pytest

from rstar2_scheduler.engine import GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.sim import LogNormal, SimEngine, SimEngineConfig, run_virtual


def request(
    rid: str, prompt: tuple[int, ...], max_new: int = 100, **sampling: object
) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        prompt_ids=prompt,
        sampling=SamplingParams(max_new_tokens=max_new, **sampling),  # type: ignore[arg-type]
    )


def fixed(tokens: int) -> LogNormal:
    return LogNormal(median=tokens, sigma=0.0)


def test_outputs_are_seeded_capped_and_end_with_the_stop_token() -> None:
    engine = SimEngine(
        SimEngineConfig(output_tokens=LogNormal(median=40, sigma=0.8), vocab_size=50)
    )

    async def main() -> list[GenerationResult]:
        async with engine:
            return list(
                await asyncio.gather(
                    engine.generate(request("a", (1, 2, 3), seed=7, stop_token_ids=(49,))),
                    engine.generate(request("b", (9, 9), seed=7, stop_token_ids=(49,))),
                    engine.generate(request("c", (1, 2, 3), max_new=5, seed=7)),
                )
            )

    a, b, c = run_virtual(main())
    assert a.token_ids == b.token_ids  # same seed, same draw, on any prompt
    assert a.finish_reason == "stop"
    assert a.token_ids[-1] == 49
    assert 49 not in a.token_ids[:-1]
    assert all(0 <= t < 50 for t in a.token_ids)
    assert a.logprobs == (0.0,) * len(a.token_ids)
    assert c.finish_reason == "length"
    assert len(c.token_ids) == 5


def test_request_longer_than_the_model_allows_is_an_error_result() -> None:
    engine = SimEngine(SimEngineConfig(num_blocks=8, block_size=4, watermark=0.0))

    async def main() -> GenerationResult:
        async with engine:
            return await engine.generate(request("big", tuple(range(20)), max_new=20))

    result = run_virtual(main())
    assert result.finish_reason == "error"
    assert result.error is not None
    assert "max_model_len (31)" in result.error


def test_a_lone_request_takes_prefill_plus_its_decode_steps() -> None:
    config = SimEngineConfig(output_tokens=fixed(5), prefix_caching=False)
    engine = SimEngine(config)

    async def main() -> float:
        async with engine:
            await engine.generate(request("x", tuple(range(10))))
            return asyncio.get_running_loop().time()

    elapsed = run_virtual(main())
    expected = 10 * config.prefill_s_per_token + sum(
        config.decode_step_s(1, 10 + j) for j in range(5)
    )
    assert elapsed == pytest.approx(expected)
    assert engine.counters.busy_s == pytest.approx(expected)
    assert engine.counters.decode_tokens == 5


def test_batching_shares_steps_between_requests() -> None:
    config = SimEngineConfig(output_tokens=fixed(200), prefix_caching=False)

    async def run(count: int) -> float:
        engine = SimEngine(config)
        async with engine:
            await asyncio.gather(
                *(engine.generate(request(str(i), (i + 1,) * 50)) for i in range(count))
            )
            return asyncio.get_running_loop().time()

    one, eight = run_virtual(run(1)), run_virtual(run(8))
    # Eight sequences decode together: far less than eight times as long, more than one.
    assert one < eight < 2 * one


def test_newest_sequence_is_preempted_and_recomputed_when_blocks_run_out() -> None:
    # 4 blocks of 4 tokens; two sequences of 3 prompt + 8 output tokens each need 3 blocks.
    config = SimEngineConfig(
        num_blocks=4, block_size=4, watermark=0.0, prefix_caching=False, output_tokens=fixed(8)
    )
    engine = SimEngine(config)
    finished: list[str] = []
    peak_used = 0

    async def one(rid: str, prompt: tuple[int, ...]) -> GenerationResult:
        result = await engine.generate(request(rid, prompt, max_new=12, seed=1))
        finished.append(rid)
        return result

    async def watch() -> None:
        nonlocal peak_used
        while True:
            peak_used = max(peak_used, engine.kv_stats().used_tokens)
            await asyncio.sleep(1e-4)

    async def main() -> tuple[GenerationResult, GenerationResult]:
        async with engine:
            watcher = asyncio.create_task(watch())
            first = asyncio.create_task(one("first", (1, 2, 3)))
            await asyncio.sleep(0)  # "first" is queued before "second"
            second = await one("second", (4, 5, 6))
            watcher.cancel()
            return await first, second

    first, second = run_virtual(main())
    counters = engine.counters
    # Both grow to 8 tokens (2 blocks each); the next block for both does not exist, so the
    # newer one is preempted after 5 tokens and recomputes its 3 + 5 tokens once readmitted.
    assert counters.preemptions == 1
    assert engine.kv_stats().preemptions == 1
    assert counters.recomputed_tokens == 8
    assert counters.prefill_tokens == 3 + 3 + 8
    assert counters.decode_tokens == 8 + 8  # recompute keeps the tokens, redoes only the KV
    assert finished == ["first", "second"]
    assert len(second.token_ids) == len(first.token_ids) == 8
    assert second.token_ids == first.token_ids  # same seed: preemption does not change output
    assert peak_used <= config.capacity_tokens
    assert engine.kv_stats().used_tokens == 0


def test_next_turn_reuses_the_cached_prefix() -> None:
    engine = SimEngine(SimEngineConfig(output_tokens=fixed(40), block_size=16))

    async def main() -> None:
        async with engine:
            prompt = tuple(range(1, 101))
            first = await engine.generate(request("t0", prompt, seed=3))
            await engine.generate(request("t1", prompt + first.token_ids + (7,) * 20, seed=4))

    run_virtual(main())
    # Turn two finds the 140 tokens of turn one cached, in whole blocks: 128.
    assert engine.counters.cached_tokens == 128
    assert engine.counters.prefill_tokens == 100 + (160 - 128)


def test_cancelled_request_frees_its_cache_and_close_aborts_the_rest() -> None:
    engine = SimEngine(SimEngineConfig(output_tokens=fixed(10_000)))

    async def main() -> tuple[int, GenerationResult]:
        await engine.start()
        doomed = asyncio.create_task(engine.generate(request("doomed", (1,) * 64, max_new=10_000)))
        kept = asyncio.create_task(engine.generate(request("kept", (2,) * 64, max_new=10_000)))
        await asyncio.sleep(1.0)
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        await asyncio.sleep(0.5)
        running = engine.kv_stats().running
        await engine.close()
        return running, await kept

    running, kept = run_virtual(main())
    assert running == 1
    assert kept.finish_reason == "abort"
    assert 0 < len(kept.token_ids) < 10_000
    assert engine.kv_stats().used_tokens == 0


def test_new_weights_make_cached_prefixes_unfindable() -> None:
    engine = SimEngine(SimEngineConfig(block_size=16, output_tokens=fixed(4)))
    prompt = tuple(range(1, 65))  # four full blocks

    async def main() -> list[int]:
        cached = []
        async with engine:
            for update in (False, False, True, False):
                if update:
                    await engine.update_weights([], version="1")
                await engine.generate(request(f"r{len(cached)}", prompt, max_new=4, seed=1))
                cached.append(engine.counters.cached_tokens)
        return cached

    # Second request hits the cache; the one after the update recomputes; the next hits again.
    first, second, after_update, later = run_virtual(main())
    assert first == 0
    assert second >= 48  # at least three of the four blocks (the last token is always computed)
    assert after_update == second
    assert later == 2 * second
