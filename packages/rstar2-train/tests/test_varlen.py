"""``varlen_attention``: packed rows through a variable-length kernel, no compiler.

Its CUDA kernel (``torch.nn.attention.varlen.varlen_attn``) cannot run here; everything around
it does: the document offsets, grouped-query heads, the registered attention function with the
per-document ``sdpa`` reference kernel (log-probs and gradients equal to padded rows), and the
call into ``varlen_attn`` as each torch version takes it (against stand-ins that check their
arguments and compute the reference result).
"""

from __future__ import annotations

import inspect
import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import tiny_model
from transformers.integrations.sdpa_attention import repeat_kv

from rstar2_train import TokenSequence, micro_batches, token_logprobs
from rstar2_train import attention as varlen
from rstar2_train.attention import (
    VARLEN_ATTENTION,
    expand_kv,
    offsets_from_lengths,
    offsets_from_position_ids,
    sdpa_document_kernel,
    torch_varlen_kernel,
)

CPU = torch.device("cpu")


def sequences(lengths: list[int], seed: int = 0) -> list[TokenSequence]:
    rng = random.Random(seed)
    return [
        TokenSequence(
            ids=[rng.randrange(1, 97) for _ in range(n)], mask=[0] * (n // 3) + [1] * (n - n // 3)
        )
        for n in lengths
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=2, max_value=40), min_size=1, max_size=12))
def test_the_packers_offsets_are_the_ones_the_position_ids_imply(lengths: list[int]) -> None:
    (batch,) = micro_batches(sequences(lengths), 10**6, packing=True, pad_id=0, device=CPU)
    assert batch.documents is not None
    order = [len(sequences(lengths)[i].ids) for i in batch.members]  # the packer's order
    assert batch.documents.tolist() == offsets_from_lengths(order).tolist()
    assert batch.documents.dtype == torch.int32
    assert batch.documents[-1] == batch.input_ids.shape[1]
    derived, longest = offsets_from_position_ids(batch.position_ids)
    assert derived.tolist() == batch.documents.tolist()
    assert longest == batch.longest == max(lengths)


def test_padded_and_shared_prefix_batches_carry_no_offsets() -> None:
    seqs = sequences([6, 9, 4])
    (padded,) = micro_batches(seqs, 1000, packing=False, pad_id=0, device=CPU)
    assert padded.documents is None
    same_head = [
        TokenSequence(ids=[5, 6, 7, *s.ids], mask=[0] * 3 + [1] * len(s.ids)) for s in seqs
    ]
    (shared,) = micro_batches(
        same_head, 1000, packing=True, pad_id=0, device=CPU, share_prefixes=True
    )
    assert shared.prefix_ids is not None
    assert shared.documents is None


def test_grouped_query_heads_are_repeated_for_their_groups() -> None:
    torch.manual_seed(0)
    kv = torch.randn(7, 2, 4)  # [tokens, kv heads, dim]
    expanded = expand_kv(kv, 3)
    # transformers' own layout: [batch, heads, tokens, dim]
    reference = repeat_kv(kv.transpose(0, 1).unsqueeze(0), 3)[0].transpose(0, 1)
    assert torch.equal(expanded, reference)
    assert expand_kv(kv, 1) is kv
    q = torch.randn(1, 6, 7, 4)
    k, v = torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    native = sdpa(q, k, v, is_causal=True, enable_gqa=True)
    by_hand = sdpa(
        q,
        expand_kv(k[0].transpose(0, 1), 3).transpose(0, 1)[None],
        expand_kv(v[0].transpose(0, 1), 3).transpose(0, 1)[None],
        is_causal=True,
    )
    torch.testing.assert_close(by_hand, native)


def test_the_reference_kernel_keeps_attention_inside_each_document() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(9, 4, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    offsets = offsets_from_lengths([4, 5])
    out = sdpa_document_kernel(q, k, v, offsets, 5, None)
    second_alone = sdpa_document_kernel(q[4:], k[4:], v[4:], offsets_from_lengths([5]), 5, None)
    torch.testing.assert_close(out[4:], second_alone)
    k2 = k.clone()
    k2[:4] += 10.0  # the first document's keys change: the second's outputs do not
    assert torch.equal(sdpa_document_kernel(q, k2, v, offsets, 5, None)[4:], out[4:])


def _logprobs_and_grads(
    attention: str, packing: bool, lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = sequences(lengths, seed=4)
    model = tiny_model(seed=2, attention=attention)  # 4 query heads, 2 key/value heads
    out = torch.zeros(len(seqs), max(lengths) - 1)
    loss = torch.zeros(())
    for batch in micro_batches(seqs, 40, packing=packing, pad_id=0, device=CPU):
        logprobs = token_logprobs(model, batch, temperature=0.8)
        out[batch.members, : logprobs.shape[1]] = logprobs.detach()
        loss = loss - (logprobs * batch.mask).sum()
    loss.backward()  # type: ignore[no-untyped-call]
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out, grads


def test_packed_rows_under_varlen_attention_match_padded_rows_under_sdpa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int]] = []

    def counted(*args: Any) -> torch.Tensor:
        calls.append((args[0].shape[1], args[1].shape[1]))  # query and key heads
        return sdpa_document_kernel(*args)

    monkeypatch.setattr(varlen, "sdpa_document_kernel", counted)

    def not_derived(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        raise AssertionError("the packer's offsets reach every layer: nothing to derive")

    monkeypatch.setattr(varlen, "offsets_from_position_ids", not_derived)
    lengths = [12, 7, 19, 3, 25, 9]
    packed = _logprobs_and_grads(VARLEN_ATTENTION, True, lengths)
    assert calls
    assert set(calls) == {(4, 2)}
    padded = _logprobs_and_grads("sdpa", False, lengths)
    assert packed[0].abs().sum() > 0
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-4)


def test_shared_prefix_and_padded_batches_fall_back_to_sdpa() -> None:
    seqs = [
        TokenSequence(ids=[5, 6, 7, 8, *s.ids], mask=[0] * 4 + [1] * len(s.ids))
        for s in sequences([6, 9])
    ]
    for share, packing in ((True, True), (False, False)):
        (batch,) = micro_batches(
            seqs, 1000, packing=packing, pad_id=0, device=CPU, share_prefixes=share
        )
        assert (batch.prefix_ids is not None) == share
        results = []
        for attention in (VARLEN_ATTENTION, "sdpa"):
            with torch.no_grad():
                results.append(token_logprobs(tiny_model(seed=5, attention=attention), batch))
        torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=0)


def _stand_in(signature: str, seen: list[dict[str, Any]]) -> Any:
    """A ``varlen_attn`` of torch 2.10 (``is_causal``, equal heads only) or of later torch
    (``window_size``, ``enable_gqa``, ``scale``) that records its arguments."""

    def check(query: torch.Tensor, key: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
              max_q: int, max_k: int, **options: Any) -> None:  # fmt: skip
        assert cu_q.dtype == torch.int32
        assert cu_q is cu_k
        assert isinstance(max_q, int)
        assert max_q == max_k
        seen.append({"kv_heads": key.shape[1], **options})

    if signature == "2.10":

        def old(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                cu_seq_k: torch.Tensor, max_q: int, max_k: int, is_causal: bool = False,
                return_aux: Any = None) -> torch.Tensor:  # fmt: skip
            check(query, key, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=is_causal)
            assert is_causal
            assert key.shape[1] == query.shape[1]
            return sdpa_document_kernel(query, key, value, cu_seq_q, max_q, None)

        return old

    def new(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
            cu_seq_k: torch.Tensor | None, max_q: int, max_k: int, *, return_aux: Any = None,
            scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
            enable_gqa: bool = False) -> torch.Tensor:  # fmt: skip
        assert cu_seq_k is not None
        check(query, key, cu_seq_q, cu_seq_k, max_q, max_k, window_size=window_size,
              enable_gqa=enable_gqa, scale=scale)  # fmt: skip
        assert window_size == (-1, 0)
        return sdpa_document_kernel(query, key, value, cu_seq_q, max_q, scale)

    return new


@pytest.mark.parametrize("signature", ["2.10", "2.13"])
def test_torchs_varlen_attn_is_called_as_the_installed_version_takes_it(
    signature: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.nn.attention import varlen as torch_varlen

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(torch_varlen, "varlen_attn", _stand_in(signature, seen))
    torch.manual_seed(2)
    q, k, v = torch.randn(11, 4, 8), torch.randn(11, 2, 8), torch.randn(11, 2, 8)
    offsets = offsets_from_lengths([3, 8])
    out = torch_varlen_kernel(q, k, v, offsets, 8, 8**-0.5)
    torch.testing.assert_close(out, sdpa_document_kernel(q, k, v, offsets, 8, None))
    if signature == "2.10":
        assert seen == [{"kv_heads": 4, "is_causal": True}]  # heads repeated here
        with pytest.raises(ValueError, match="takes no scale"):
            torch_varlen_kernel(q, k, v, offsets, 8, 0.5)
    else:
        assert seen == [
            {"kv_heads": 2, "window_size": (-1, 0), "enable_gqa": True, "scale": 8**-0.5}
        ]


def test_the_installed_torch_has_the_varlen_signature_this_code_expects() -> None:
    # The signature the stand-ins above copy: if torch changes it, this fails first.
    varlen_attn = pytest.importorskip("torch.nn.attention.varlen").varlen_attn
    names = set(inspect.signature(varlen_attn).parameters)
    assert {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"} <= names
    assert "is_causal" in names or "window_size" in names


def test_no_mask_is_built_for_a_forward_without_cache_in_either_mask_api() -> None:
    from rstar2_train.attention import varlen_mask

    assert varlen_mask(batch_size=1, q_length=6, kv_length=6, q_offset=0, kv_offset=0) is None
    # transformers releases before q_length/q_offset passed the query's cache positions
    assert varlen_mask(batch_size=1, cache_position=torch.arange(6), kv_length=6) is None
    cached = varlen_mask(batch_size=2, q_length=3, kv_length=5, q_offset=2, kv_offset=0)
    assert cached is not None
    assert cached.shape[-2:] == (3, 5)
    assert cached[0, 0].tolist() == [[True] * 3 + [False] * 2, [True] * 4 + [False], [True] * 5]
