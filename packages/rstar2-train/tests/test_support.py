"""Under top-p / top-k sampling the trainer's log-probs equal the engine's sampling log-probs
exactly when it renormalises over the supports the engine reports (the PPO ratio is 1 on
policy); without them they differ by the nucleus mass."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from models import tiny_model
from scored import scored_rollout

from rstar2_scheduler import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.engine import GenerationRequest, GenerationResult, SamplingParams
from rstar2_train import TokenSequence, batching
from rstar2_train.batching import micro_batches, token_logprobs
from rstar2_train.rl.selection import Selection
from rstar2_train.rl.update import training_sequences

TEMPERATURE = 0.7


def generate(model: torch.nn.Module, prompts: list[list[int]]) -> list[GenerationResult]:
    sampling = SamplingParams(
        max_new_tokens=10, temperature=TEMPERATURE, top_p=0.8, top_k=30, return_support=True
    )

    async def run() -> list[GenerationResult]:
        engine = TransformersEngine(
            copy.deepcopy(model), TransformersEngineConfig(kv_budget_tokens=1024)
        )
        async with engine:
            return await asyncio.gather(
                *(
                    engine.generate(
                        GenerationRequest(
                            request_id=f"r{i}",
                            prompt_ids=tuple(prompt),
                            sampling=sampling.model_copy(update={"seed": i}),
                        )
                    )
                    for i, prompt in enumerate(prompts)
                )
            )

    return asyncio.run(run())


def sequences(
    prompts: list[list[int]], results: list[GenerationResult], *, with_support: bool
) -> list[TokenSequence]:
    out = []
    for prompt, result in zip(prompts, results, strict=True):
        assert result.support is not None
        out.append(
            TokenSequence(
                ids=prompt + list(result.token_ids),
                mask=[0] * len(prompt) + [1] * len(result.token_ids),
                support=[[] for _ in prompt] + [list(ids) for ids in result.support]
                if with_support
                else None,
            )
        )
    return out


def trainer_logprobs(
    model: torch.nn.Module, chosen: list[TokenSequence], **planning: bool
) -> list[float]:
    """The trained tokens' log-probs, sequence by sequence, in token order."""
    found: dict[int, list[float]] = {}
    for batch in micro_batches(
        chosen,
        64,
        pad_id=0,
        device=torch.device("cpu"),
        **planning,  # type: ignore[arg-type]
    ):
        logprobs = token_logprobs(model, batch, temperature=TEMPERATURE)
        for row, member in enumerate(batch.members):
            found[member] = logprobs[row][batch.mask[row] > 0].tolist()
    return [value for member in sorted(found) for value in found[member]]


PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11]]


@pytest.mark.parametrize(
    "planning",
    [
        {"packing": True},
        {"packing": False},
        {"packing": False, "share_prefixes": True},
    ],
)
@pytest.mark.parametrize("fused", [True, False])
def test_the_trainer_recomputes_the_engines_nucleus_log_probs(
    planning: dict[str, bool], fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # a peaked distribution: the nucleus cuts most of it
    model.eval()
    if not fused:  # a model whose head cannot be fused: log-probs from its own logits
        monkeypatch.setattr(batching, "fusable_head", lambda model: None)
    results = generate(model, PROMPTS)
    engine = [value for result in results for value in result.logprobs]
    restricted = sum(1 for r in results for ids in r.support or () if ids)
    assert restricted > len(engine) // 2  # most tokens were drawn from a nucleus
    exact = trainer_logprobs(model, sequences(PROMPTS, results, with_support=True), **planning)
    assert exact == pytest.approx(engine, abs=2e-4)
    whole = trainer_logprobs(model, sequences(PROMPTS, results, with_support=False), **planning)
    assert max(abs(a - b) for a, b in zip(whole, engine, strict=True)) > 1e-2


def test_gradients_flow_through_renormalised_log_probs() -> None:
    model = tiny_model(seed=3)
    results = generate(model, PROMPTS)
    chosen = sequences(PROMPTS, results, with_support=True)
    (batch,) = micro_batches(chosen, 256, packing=True, pad_id=0, device=torch.device("cpu"))
    token_logprobs(model, batch, temperature=TEMPERATURE).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads
    assert all(torch.isfinite(g).all() for g in grads)


def test_a_sequence_needs_one_support_per_token() -> None:
    with pytest.raises(ValueError, match="support must have 3 entries each"):
        TokenSequence(ids=[1, 2, 3], mask=[0, 1, 1], support=[[], [2]])


def test_kept_rollouts_carry_their_supports_into_training() -> None:
    with_support = scored_rollout(
        [1, 0, 1], prompt_ids=(1, 4), response_ids=[2, 3, 5], support=[[2, 7], [], [5]]
    )
    without = scored_rollout([1, 0, 1], prompt_ids=(1, 4), response_ids=[2, 3, 5])
    # Only ``kept`` is read here.
    selection = Selection(
        kept=[0, 1],
        advantages=[1.0, -1.0],
        groups=1,
        dropped={},
        roc=None,  # type: ignore[arg-type]
    )
    first, second = training_sequences([with_support, without], selection)
    assert first.support == [[], [], [2, 7], [], [5]]  # the prompt: whole vocabulary
    assert second.support is None
