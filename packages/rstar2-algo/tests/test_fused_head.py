"""fused_linear_logprobs against the unfused head + full log-softmax: values and gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2_algo import fused_linear_logprobs


def unfused(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook computation: all logits, then the log-softmax; log-probs and entropy."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return picked, entropy


def inputs(
    seed: int, leading: tuple[int, ...], size: int, vocab: int, with_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*leading, size, generator=generator)
    weight = torch.randn(vocab, size, generator=generator) / size**0.5 * 3
    bias = torch.randn(vocab, generator=generator) if with_bias else None
    ids = torch.randint(0, vocab, leading, generator=generator)
    return hidden, weight, bias, ids


@settings(max_examples=20, deadline=None)
@given(
    st.integers(0, 2**31),
    st.lists(st.integers(1, 6), min_size=1, max_size=2),
    st.integers(1, 40),
    st.integers(1, 200),
    st.sampled_from([0.6, 1.0, 1.4]),
    st.sampled_from([None, 1, 3, 1000]),
    st.booleans(),
)
def test_values_and_gradients_match_the_unfused_head(
    seed: int,
    leading: list[int],
    size: int,
    vocab: int,
    temperature: float,
    chunk: int | None,
    with_bias: bool,
) -> None:
    hidden, weight, bias, ids = inputs(seed, tuple(leading), size, vocab, with_bias)
    generator = torch.Generator().manual_seed(seed + 1)
    up_logprobs = torch.randn(*leading, generator=generator)
    up_entropy = torch.randn(*leading, generator=generator)

    def run(fused: bool) -> tuple[torch.Tensor, ...]:
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        b = None if bias is None else bias.clone().requires_grad_()
        if fused:
            out = fused_linear_logprobs(
                h, w, ids, bias=b, temperature=temperature, chunk_size=chunk, entropy=True
            )
            assert out.entropy is not None
            picked, entropy = out.logprobs, out.entropy
        else:
            picked, entropy = unfused(h, w, ids, b, temperature)
        ((picked * up_logprobs).sum() + (entropy * up_entropy).sum()).backward()
        assert h.grad is not None
        assert w.grad is not None
        grads = (h.grad, w.grad) + (() if b is None else (b.grad,))
        return (picked.detach(), entropy.detach(), *grads)

    for ours, reference in zip(run(True), run(False), strict=True):
        assert ours is not None
        assert reference is not None
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1, 2, 5, None]), st.sampled_from([0.7, 1.0]))
def test_log_prob_gradients_match_in_float64(seed: int, chunk: int | None, t: float) -> None:
    hidden, weight, bias, ids = inputs(seed, (9,), 16, 50, True)
    assert bias is not None
    up = torch.randn(9, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    leaves = [x.double().requires_grad_() for x in (hidden, weight, bias)]
    out = fused_linear_logprobs(*leaves[:2], ids, bias=leaves[2], temperature=t, chunk_size=chunk)
    assert out.entropy is None
    assert out.logprobs.dtype == torch.float64
    (out.logprobs * up).sum().backward()
    references = [x.double().requires_grad_() for x in (hidden, weight, bias)]
    picked = torch.log_softmax(
        torch.nn.functional.linear(references[0], references[1], references[2]) / t, -1
    ).gather(-1, ids[:, None])[:, 0]
    (picked * up).sum().backward()
    for ours, theirs in zip(leaves, references, strict=True):
        assert ours.grad is not None
        assert theirs.grad is not None
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_bfloat16_head_softmax_in_float32_and_gradients_in_the_weight_dtype() -> None:
    hidden, weight, _, ids = inputs(3, (40,), 32, 300, False)
    h = hidden.bfloat16().requires_grad_()
    w = weight.bfloat16().requires_grad_()
    out = fused_linear_logprobs(h, w, ids, chunk_size=7)
    assert out.logprobs.dtype == torch.float32
    out.logprobs.sum().backward()
    assert h.grad is not None
    assert w.grad is not None
    assert (h.grad.dtype, w.grad.dtype) == (torch.bfloat16, torch.bfloat16)
    # The same bf16 logits, unfused: equal up to bf16 rounding of the gradients.
    ref_h = hidden.bfloat16().requires_grad_()
    ref_w = weight.bfloat16().requires_grad_()
    picked, _ = unfused(ref_h, ref_w, ids)
    torch.testing.assert_close(out.logprobs, picked, atol=1e-5, rtol=0)
    picked.sum().backward()
    assert ref_h.grad is not None
    assert ref_w.grad is not None
    torch.testing.assert_close(h.grad.float(), ref_h.grad.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(w.grad.float(), ref_w.grad.float(), atol=2e-2, rtol=2e-2)


def test_tied_weight_gets_both_gradients() -> None:
    # A tied head is the embedding matrix: autograd adds the head's gradient to the lookup's.
    embedding = torch.nn.Embedding(30, 8)
    ids = torch.tensor([[1, 4, 7, 2]])
    targets = torch.tensor([[4, 7, 2, 9]])
    hidden = torch.tanh(embedding(ids))
    fused_linear_logprobs(hidden, embedding.weight, targets, chunk_size=3).logprobs.sum().backward()
    assert embedding.weight.grad is not None
    ours = embedding.weight.grad.clone()
    embedding.weight.grad = None
    unfused(torch.tanh(embedding(ids)), embedding.weight, targets)[0].sum().backward()
    torch.testing.assert_close(ours, embedding.weight.grad)


def test_no_gradient_to_a_frozen_head() -> None:
    hidden, weight, _, ids = inputs(4, (5,), 8, 20, False)
    h = hidden.requires_grad_()
    fused_linear_logprobs(h, weight, ids, chunk_size=2).logprobs.sum().backward()
    assert h.grad is not None
    assert weight.grad is None


def test_masked_vocabulary_entries_keep_entropy_and_gradients_finite() -> None:
    hidden = torch.eye(3, requires_grad=True)
    bias = torch.tensor([0.0, -torch.inf, 0.0])
    weight = torch.eye(3)
    out = fused_linear_logprobs(hidden, weight, torch.tensor([0, 2, 0]), bias=bias, entropy=True)
    assert out.entropy is not None
    (out.logprobs.sum() + out.entropy.sum()).backward()
    assert hidden.grad is not None
    assert torch.isfinite(out.entropy).all()
    assert torch.isfinite(hidden.grad).all()
    expected = torch.distributions.Categorical(logits=hidden.detach() @ weight.T + bias).entropy()
    torch.testing.assert_close(out.entropy, expected)


def test_backward_keeps_no_logits() -> None:
    # The unfused head saves its [tokens, vocab] logits for backward; the fused one saves the
    # hidden states, the head and per-row values only.
    hidden, weight, _, ids = inputs(5, (64,), 16, 500, False)
    h = hidden.requires_grad_()
    largest = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal largest
        largest = max(largest, tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fused_linear_logprobs(h, weight, ids, chunk_size=8)
    out.logprobs.sum().backward()
    assert largest == weight.numel()  # the head itself, not the 64 x 500 logits
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        unfused(hidden.detach().requires_grad_(), weight.requires_grad_(), ids)
    assert largest == 64 * 500  # what the same hook sees of the unfused head


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden": torch.zeros(2, 4, dtype=torch.long)}, "floating-point"),
        ({"weight": torch.zeros(10, 5)}, r"weight must have shape \[vocab, 4\]"),
        ({"weight": torch.zeros(10, 4, dtype=torch.float64)}, "dtype and device"),
        ({"bias": torch.zeros(9)}, r"bias must have shape \(10,\)"),
        ({"token_ids": torch.zeros(3, dtype=torch.long)}, r"token_ids shape \(3,\)"),
        ({"token_ids": torch.zeros(2)}, "integer tensor"),
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_input_is_rejected(change: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "hidden": torch.zeros(2, 4),
        "weight": torch.zeros(10, 4),
        "token_ids": torch.zeros(2, dtype=torch.long),
        **change,
    }
    with pytest.raises(ValueError, match=message):
        fused_linear_logprobs(**arguments)  # type: ignore[arg-type]


def test_a_bfloat16_head_gradient_is_summed_in_float32_without_head_sized_products() -> None:
    # Each chunk's product used to be made as a bf16 [vocab, hidden] tensor before its float32
    # sum: one head-sized temporary per chunk (0.78 GB for Qwen3-4B's head). The only bf16
    # head-sized tensor left is the gradient itself, cast once at the end.
    from torch.utils._python_dispatch import TorchDispatchMode

    hidden, weight, _, ids = inputs(6, (40,), 32, 300, False)
    h = hidden.bfloat16().requires_grad_()
    w = weight.bfloat16().requires_grad_()
    made: dict[int, torch.dtype] = {}  # by storage: views of one tensor count once

    class HeadSized(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.shape == w.shape:
                made[out.untyped_storage().data_ptr()] = out.dtype
            return out

    out = fused_linear_logprobs(h, w, ids, chunk_size=5)
    with HeadSized():
        out.logprobs.sum().backward()
    assert list(made.values()).count(torch.bfloat16) == 1
