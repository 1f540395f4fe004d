"""Micro-batches: packed, padded and shared-prefix layouts give every sequence its own log-probs."""

from __future__ import annotations

import random

import pytest
import torch
from models import reference_logprobs, tiny_model
from transformers import Gemma2Config, Gemma2ForCausalLM

from rstar2_train import MicroBatch, TokenSequence, batching, micro_batches, token_logprobs
from rstar2_train.batching import plan, plan_shared
from rstar2_train.lm_head import fusable_head

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


def _logprobs_and_gradient(
    model: torch.nn.Module, batches: list[MicroBatch]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    total = torch.zeros(())
    outs = []
    for batch in batches:
        out = token_logprobs(model, batch, temperature=0.8)  # type: ignore[arg-type]
        total = total - (out * batch.mask * batch.token_values["v"]).sum() / 1000
        outs.append(out.detach())
    total.backward()  # type: ignore[no-untyped-call]
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return outs, grad


@pytest.mark.parametrize("layout", ["packed", "padded", "shared"])
@pytest.mark.parametrize("tied", [False, True])
def test_fused_head_gives_the_logprobs_and_gradients_of_the_models_logits(
    layout: str, tied: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = [*grouped([9, 6], [[5, 8, 3], [6, 2]]), *sequences([11, 4, 16])]
    results = []
    for fused in (True, False):
        if not fused:  # the model's own head and logits, for the kept columns
            monkeypatch.setattr(batching, "fusable_head", lambda model: None)
        model = tiny_model(seed=4, tied=tied)
        batches = micro_batches(
            seqs,
            40,
            packing=layout == "packed",
            pad_id=0,
            device=CPU,
            share_prefixes=layout == "shared",
        )
        assert len(batches) > 1
        results.append(_logprobs_and_gradient(model, batches))
    (fused_out, fused_grad), (plain_out, plain_grad) = results
    for ours, theirs in zip(fused_out, plain_out, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert fused_grad.abs().max() > 0
    torch.testing.assert_close(fused_grad, plain_grad, atol=1e-5, rtol=1e-4)


def test_a_micro_batch_with_nothing_trained_still_reaches_every_parameter() -> None:
    # Data-parallel padding passes backpropagate 0 through the whole model, so every rank runs
    # the same collectives.
    model = tiny_model(seed=5, tied=True)
    (batch,) = micro_batches(
        [TokenSequence(ids=[3, 4, 5, 6], mask=[0, 0, 0, 0])],
        100,
        packing=True,
        pad_id=0,
        device=CPU,
    )
    out = token_logprobs(model, batch)
    assert torch.all(out == 0)
    (out.sum() * 0.0).backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None and torch.all(p.grad == 0) for p in model.parameters())


def test_a_soft_capped_head_takes_the_models_own_logits() -> None:
    # Gemma 2 soft-caps its logits: the fused linear head cannot reproduce them, so the
    # log-probs come from the model's logits.
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        final_logit_softcapping=2.0,
    )
    model = Gemma2ForCausalLM(config)
    assert fusable_head(model) is None
    seqs = sequences([9, 13])
    (batch,) = micro_batches(seqs, 100, packing=False, pad_id=0, device=CPU)
    with torch.no_grad():
        out = token_logprobs(model, batch, temperature=0.8)
    for row, index in enumerate(batch.members):
        sequence = seqs[index]
        n = len(sequence.ids) - 1
        trained = torch.tensor(sequence.mask[1:], dtype=torch.bool)
        expected = reference_logprobs(model, sequence.ids, 0.8)
        torch.testing.assert_close(out[row, :n][trained], expected[trained], atol=1e-5, rtol=0)


@pytest.mark.slow  # compiles FlexAttention's CPU kernel (10-20 s)
def test_flex_attention_agrees_with_sdpa_on_a_packed_batch() -> None:
    # FlexAttention reads the packed rows' document mask (from the reset position ids) as a
    # block mask. Its CPU kernel has no backward pass, so this compares forward log-probs (the
    # gradients of the packed layout are compared with padded rows under sdpa above). One
    # micro-batch: every new shape compiles the kernel again.
    seqs = sequences([11, 4, 16, 9])
    (batch,) = micro_batches(seqs, 100, packing=True, pad_id=0, device=CPU)
    results = []
    for attention in ("sdpa", "flex_attention"):
        with torch.no_grad():
            results.append(token_logprobs(tiny_model(seed=6, attention=attention), batch))
    assert results[0].abs().sum() > 0
    torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=1e-5)
