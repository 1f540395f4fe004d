"""selective_log_softmax and entropy_from_logits against the naive full log-softmax."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import entropy_from_logits, selective_log_softmax


def naive(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    lsm = torch.log_softmax(logits.to(torch.float64) / temperature, dim=-1)
    return lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.integers(1, 300),
    st.sampled_from([0.6, 1.0, 1.3]),
    st.sampled_from([None, 1, 3, 7, 1000]),
    st.integers(0, 2**31),
)
def test_matches_naive_log_softmax_for_any_shape_and_chunking(
    leading: list[int], vocab: int, temperature: float, chunk_size: int | None, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(*leading, vocab, generator=generator)
    ids = torch.randint(0, vocab, tuple(leading), generator=generator)
    out = selective_log_softmax(logits, ids, temperature, chunk_size)
    assert out.shape == tuple(leading)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), naive(logits, ids, temperature), atol=1e-5, rtol=0)


def test_bfloat16_logits_are_computed_in_float32() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(6, 1000, generator=generator)).bfloat16()
    ids = torch.randint(0, 1000, (6,), generator=generator)
    out = selective_log_softmax(logits, ids, chunk_size=4)
    assert out.dtype == torch.float32
    # Exactly the float32 log-softmax of the bf16 values, not a bf16 log-softmax.
    torch.testing.assert_close(out.double(), naive(logits.float(), ids), atol=1e-5, rtol=0)
    bf16_naive = torch.log_softmax(logits, -1).gather(-1, ids[:, None]).squeeze(-1)
    assert (out - naive(logits.float(), ids).float()).abs().max() < (
        (bf16_naive.float() - naive(logits.float(), ids).float()).abs().max()
    )


def test_non_contiguous_shifted_logits_are_not_copied_wrongly() -> None:
    # The usual causal-LM slice logits[:, :-1] cannot be flattened without a copy.
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 6, 50, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 50, (3, 6), generator=generator)
    shifted, targets = logits[:, :-1], ids[:, 1:]
    assert not shifted.is_contiguous()
    out = selective_log_softmax(shifted, targets, chunk_size=2)
    torch.testing.assert_close(out, naive(shifted, targets))
    transposed = logits.transpose(0, 1)
    torch.testing.assert_close(
        selective_log_softmax(transposed, ids.T, chunk_size=4), naive(transposed, ids.T)
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([0.7, 1.0]), st.sampled_from([1, 4, None]))
def test_gradient_matches_autograd_of_naive(
    seed: int, temperature: float, chunk: int | None
) -> None:
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(3, 5, 40, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 40, (3, 5), generator=generator)
    upstream = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    ours = base.clone().requires_grad_()
    theirs = base.clone().requires_grad_()
    (
        selective_log_softmax(ours[:, :-1], ids[:, 1:], temperature, chunk) * upstream
    ).sum().backward()
    (naive(theirs[:, :-1], ids[:, 1:], temperature) * upstream).sum().backward()
    assert ours.grad is not None
    assert theirs.grad is not None
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_bfloat16_gradient_has_the_input_dtype() -> None:
    logits = torch.randn(4, 30).bfloat16().requires_grad_()
    ids = torch.randint(0, 30, (4,))
    selective_log_softmax(logits, ids, chunk_size=3).sum().backward()
    assert logits.grad is not None
    assert logits.grad.dtype == torch.bfloat16
    reference = logits.detach().float().requires_grad_()
    naive(reference, ids).sum().backward()
    assert reference.grad is not None
    torch.testing.assert_close(logits.grad.float(), reference.grad, atol=1e-2, rtol=1e-2)


def test_masked_vocabulary_entries() -> None:
    logits = torch.tensor([[0.0, -torch.inf, 0.0, 1.0]], requires_grad=True)
    out = selective_log_softmax(logits, torch.tensor([1]))
    assert out.item() == -torch.inf
    picked = selective_log_softmax(logits, torch.tensor([3]))
    picked.backward()
    assert logits.grad is not None
    assert logits.grad[0, 1].item() == 0.0
    assert torch.isfinite(logits.grad).all()
    entropy = entropy_from_logits(logits.detach())
    expected = torch.distributions.Categorical(logits=logits.detach()).entropy()
    torch.testing.assert_close(entropy, expected)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([1, 5, None]))
def test_entropy_matches_categorical(vocab: int, temperature: float, chunk: int | None) -> None:
    logits = 3 * torch.randn(2, 7, vocab, dtype=torch.float64)
    out = entropy_from_logits(logits, temperature, chunk)
    expected = torch.distributions.Categorical(logits=logits / temperature).entropy()
    torch.testing.assert_close(out, expected)
    assert entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_entropy_has_no_gradient() -> None:
    logits = torch.randn(2, 10, requires_grad=True)
    assert not entropy_from_logits(logits).requires_grad


@pytest.mark.parametrize(
    ("logits", "ids", "kwargs", "message"),
    [
        (torch.zeros(2, 5), torch.zeros(3, dtype=torch.long), {}, r"token_ids shape \(3,\)"),
        (torch.zeros(2, 5), torch.zeros(2), {}, "integer tensor"),
        (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, dtype=torch.long), {}, "floating"),
        (torch.zeros(5), torch.zeros((), dtype=torch.long), {}, "at least 2 dims"),
        (torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), {"temperature": 0.0}, "temperature"),
        (torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), {"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_input_is_rejected(
    logits: torch.Tensor, ids: torch.Tensor, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        selective_log_softmax(logits, ids, **kwargs)  # type: ignore[arg-type]
