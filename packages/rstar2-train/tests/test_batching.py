"""Micro-batches: packed, padded and shared-prefix layouts give every sequence its own log-probs."""

from __future__ import annotations

import random

import pytest
import torch
from models import reference_logprobs, tiny_model

from rstar2_train import TokenSequence, micro_batches, token_logprobs
from rstar2_train.batching import plan, plan_shared

CPU = torch.device("cpu")


def sequences(lengths: list[int], seed: int = 0) -> list[TokenSequence]:
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = [rng.randrange(1, 97) for _ in range(n)]
        mask = [0] * (n // 3) + [1] * (n - n // 3)
        out.append(TokenSequence(ids=ids, mask=mask, token_values={"v": [float(t) for t in ids]}))
    return out


@pytest.mark.parametrize("packing", [True, False])
def test_every_sequence_gets_its_own_logprobs(packing: bool) -> None:
    model = tiny_model()
    model.eval()
    seqs = sequences([9, 23, 5, 17, 30, 2])
    batches = micro_batches(seqs, 48, packing=packing, pad_id=0, device=CPU)
    assert sorted(i for batch in batches for i in batch.members) == list(range(len(seqs)))
    for batch in batches:
        with torch.no_grad():
            logprobs = token_logprobs(model, batch, temperature=0.7)
        for row, index in enumerate(batch.members):
            n = len(seqs[index].ids) - 1
            trained = torch.tensor(seqs[index].mask[1:], dtype=torch.bool)
            expected = reference_logprobs(model, seqs[index].ids, 0.7)
            # Trained targets get their log-probs; untrained ones and padding get 0.
            assert torch.allclose(logprobs[row, :n][trained], expected[trained], atol=1e-5)
            assert torch.all(logprobs[row, :n][~trained] == 0)
            assert torch.all(logprobs[row, n:] == 0)
            assert batch.mask[row, :n].tolist() == [float(b) for b in seqs[index].mask[1:]]
            # Per-token values are shifted like the targets: position t holds token t + 1's.
            assert batch.token_values["v"][row, :n].tolist() == [
                float(t) for t in seqs[index].ids[1:]
            ]


def test_plans_respect_the_token_budget() -> None:
    lengths = [50, 10, 40, 30, 30, 5, 120]
    packed = plan(lengths, 100, packing=True)
    padded = plan(lengths, 100, packing=False)
    for groups, cost in (
        (packed, lambda g: sum(lengths[i] for i in g)),
        (padded, lambda g: len(g) * max(lengths[i] for i in g)),
    ):
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for group in groups:
            assert cost(group) <= 100 or len(group) == 1  # an over-long sequence stands alone
    assert [6] in packed
    assert len(packed) <= len(padded)


def test_gradients_through_packed_and_padded_layouts_agree() -> None:
    seqs = sequences([12, 7, 19])
    grads = []
    for packing in (True, False):
        model = tiny_model(seed=3)
        (batch,) = micro_batches(seqs, 1000, packing=packing, pad_id=0, device=CPU)
        loss = -(token_logprobs(model, batch) * batch.mask).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_sequences_are_validated() -> None:
    with pytest.raises(ValueError, match="at least two tokens"):
        TokenSequence(ids=[1], mask=[1])
    with pytest.raises(ValueError, match="must have 3 entries"):
        TokenSequence(ids=[1, 2, 3], mask=[0, 1])


def grouped(prompts: list[int], tails: list[list[int]]) -> list[TokenSequence]:
    """Sequences of shared prompts (lengths ``prompts``) and responses of ``tails`` lengths;
    responses mix trained and untrained tokens, as tool outputs are in a multi-turn rollout."""
    rng = random.Random(1)
    out = []
    for length, responses in zip(prompts, tails, strict=True):
        prompt = [rng.randrange(1, 97) for _ in range(length)]
        for n in responses:
            response = [rng.randrange(1, 97) for _ in range(n)]
            mask = [0] * length + [0 if 2 <= i < 4 else 1 for i in range(n)]
            values = [float(t) for t in prompt + response]
            out.append(TokenSequence(ids=prompt + response, mask=mask, token_values={"v": values}))
    return out


def test_shared_prefix_batches_run_each_prompt_once_with_the_same_logprobs_and_gradient() -> None:
    seqs = [*grouped([9, 14], [[5, 8, 3], [6, 2]]), *sequences([11])]
    results = []
    for share in (False, True):
        model = tiny_model(seed=3)
        batches = micro_batches(
            seqs, 1000, packing=False, pad_id=0, device=CPU, share_prefixes=share
        )
        total = torch.zeros(())
        logprobs = {}
        for batch in batches:
            out = token_logprobs(model, batch, temperature=0.8)
            total = total - (out * batch.mask).sum()
            for row, index in enumerate(batch.members):
                logprobs[index] = out[row, : len(seqs[index].ids) - 1]
                assert batch.token_values["v"][row, : len(seqs[index].ids) - 1].tolist() == [
                    float(t) for t in seqs[index].ids[1:]
                ]
        total.backward()  # type: ignore[no-untyped-call]
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((batches, logprobs, grad))
    (plain, plain_logprobs, plain_grad), (shared, shared_logprobs, shared_grad) = results
    assert len(plain) == 1
    # One micro-batch per prompt, its head once; the sequence with no twin is padded as usual.
    assert [b.prefix_ids.shape[1] if b.prefix_ids is not None else None for b in shared] == [
        9,
        14,
        None,
    ]
    assert [sorted(b.members) for b in shared] == [[0, 1, 2], [3, 4], [5]]
    for index, sequence in enumerate(seqs):
        expected = reference_logprobs(tiny_model(seed=3), sequence.ids, 0.8)
        trained = torch.tensor(sequence.mask[1:], dtype=torch.bool)
        assert torch.allclose(shared_logprobs[index][trained], expected[trained], atol=1e-5)
        assert torch.all(shared_logprobs[index][~trained] == 0)
        assert torch.allclose(shared_logprobs[index], plain_logprobs[index], atol=1e-5)
    assert torch.allclose(shared_grad, plain_grad, atol=1e-5)


def test_shared_prefix_plans_split_a_group_over_the_budget() -> None:
    seqs = grouped([20], [[10, 10, 10, 10]])
    shared, alone = plan_shared(seqs, 45)
    # Each part costs the 20-token head plus padded rows of the rest: two rows of 10 fit 45.
    assert shared == [(20, [0, 1]), (20, [2, 3])]
    assert alone == []
