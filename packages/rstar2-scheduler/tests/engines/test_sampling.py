"""Batched inverse-CDF sampling: the right distribution, top-p, greedy, per-row streams."""

from __future__ import annotations

import random

import pytest
import torch

from rstar2_scheduler.engine import SamplingParams
from rstar2_scheduler.engines.sampling import Sampled, sample_next


def params(temperature: float = 1.0, top_p: float = 1.0, **more: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, **more)  # type: ignore[arg-type]


def draw(logits: torch.Tensor, seeds: list[int], **sampling: object) -> Sampled:
    rows = len(seeds)
    return sample_next(
        logits.expand(rows, -1),
        [params(**sampling)] * rows,  # type: ignore[arg-type]
        [random.Random(seed) for seed in seeds],
    )


def test_draws_follow_the_temperature_scaled_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    tokens, logprobs, _ = draw(logits, list(range(20_000)), temperature=0.7)
    expected = torch.softmax(logits[0] / 0.7, dim=-1)
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double() / len(tokens)
    # 20,000 draws: a frequency's standard error is at most 0.0036.
    assert counts.tolist() == pytest.approx(expected.tolist(), abs=0.015)
    assert counts[4] == 0  # probability ~1e-13
    reported = torch.log_softmax(logits[0] / 0.7, dim=-1)
    assert logprobs == pytest.approx([float(reported[t]) for t in tokens], abs=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    # Probabilities 0.5, 0.3, 0.15, 0.05: top-p 0.7 keeps the first two tokens.
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    tokens, logprobs, support = draw(logits, list(range(4_000)), top_p=0.7)
    assert support == [None] * 4_000
    assert set(tokens) == {0, 1}
    assert sum(t == 0 for t in tokens) / len(tokens) == pytest.approx(0.5 / 0.8, abs=0.03)
    # The reported log-prob is the unrestricted one.
    assert logprobs[tokens.index(1)] == pytest.approx(float(torch.tensor(0.3).log()), abs=1e-6)


def test_greedy_rows_take_the_argmax_beside_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens, logprobs, _ = sample_next(logits, [params(0.0), params()], [random.Random(1)] * 2)
    assert tokens[0] == 1
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))


def test_a_rows_tokens_depend_on_its_seed_alone() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    alone = [
        sample_next(logits[i : i + 1], [params()], [random.Random(i)]).tokens[0] for i in range(6)
    ]
    batched = sample_next(
        logits, [params(top_p=0.9)] * 3 + [params()] * 3, [random.Random(i) for i in range(6)]
    ).tokens
    assert batched[3:] == alone[3:]
    reordered = sample_next(
        logits.flip(0), [params()] * 6, [random.Random(i) for i in reversed(range(6))]
    ).tokens
    assert reordered[::-1] == alone


def test_top_k_keeps_the_k_most_likely_then_top_p_applies_to_what_it_left() -> None:
    # Probabilities 0.4, 0.3, 0.2, 0.1: top-k 3 leaves 4/9, 3/9, 2/9; top-p 0.7 of that keeps two.
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    tokens, _, _ = draw(logits, list(range(3_000)), top_k=3)
    assert set(tokens) == {0, 1, 2}
    tokens, _, _ = draw(logits, list(range(3_000)), top_k=3, top_p=0.7)
    assert set(tokens) == {0, 1}


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        ({"top_p": 0.7}, (0, 1)),
        ({"top_k": 3}, (0, 1, 2)),
        ({"top_k": 3, "top_p": 0.7}, (0, 1)),
        ({}, ()),
        ({"temperature": 0.0, "top_p": 0.7}, ()),
    ],
)
def test_a_row_that_asks_gets_its_support_and_the_renormalised_log_prob(
    sampling: dict[str, float], expected: tuple[int, ...]
) -> None:
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    tokens, logprobs, support = draw(logits, list(range(200)), return_support=True, **sampling)
    assert set(support) == {expected}
    scaled = logits[0] / (sampling.get("temperature") or 1.0)
    allowed = list(expected) or list(range(4))
    for token, logprob in zip(tokens, logprobs, strict=True):
        assert token in allowed
        renormalised = scaled[token] - torch.logsumexp(scaled[allowed], dim=0)
        assert logprob == pytest.approx(float(renormalised), abs=1e-6)
