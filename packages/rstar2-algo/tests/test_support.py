"""Log-probs restricted to each row's sampling support (a top-p / top-k nucleus), both paths,
against a brute-force renormalisation over the same tokens."""

import pytest
import torch

from rstar2_algo import SUPPORT_PAD, fused_linear_logprobs, selective_log_softmax, support_tensor


def nucleus_sets(logits: torch.Tensor, top_p: float, temperature: float) -> list[list[int]]:
    """Each row's smallest set of most likely tokens whose mass reaches ``top_p``."""
    sets = []
    for row in torch.softmax(logits.double() / temperature, dim=-1):
        probs, order = torch.sort(row, descending=True)
        before = torch.cumsum(probs, 0) - probs
        sets.append(order[before < top_p].tolist())
    return sets


def brute_force(
    logits: torch.Tensor, token_ids: torch.Tensor, sets: list[list[int]], temperature: float
) -> torch.Tensor:
    """log p(token) under softmax(logits / T) renormalised over each row's set (whole if empty)."""
    out = []
    for row, token, ids in zip(logits / temperature, token_ids.tolist(), sets, strict=True):
        allowed = ids if ids else list(range(row.shape[0]))
        out.append(row[token] - torch.logsumexp(row[allowed], dim=0))
    return torch.stack(out)


def draw(sets: list[list[int]], vocab: int, generator: torch.Generator) -> torch.Tensor:
    """One token per row from its set (any token for an unrestricted row)."""
    return torch.tensor(
        [
            ids[int(torch.randint(len(ids), (), generator=generator))]
            if ids
            else int(torch.randint(vocab, (), generator=generator))
            for ids in sets
        ]
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [None, 3])
def test_selective_log_softmax_renormalises_over_the_support(
    temperature: float, chunk: int | None
) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(10, 50, generator=generator, dtype=torch.float64)).requires_grad_()
    sets = nucleus_sets(logits.detach(), 0.8, temperature)
    sets[4] = []  # a token the sampler drew from the whole vocabulary (or glue: never restricted)
    tokens = draw(sets, 50, generator)
    got = selective_log_softmax(
        logits, tokens, temperature, chunk_size=chunk, support=support_tensor(sets)
    )
    want = brute_force(logits, tokens, sets, temperature)
    torch.testing.assert_close(got, want)
    assert (
        got > torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None])[:, 0] - 1e-12
    ).all()
    upstream = torch.randn(10, generator=generator, dtype=torch.float64)
    (grad,) = torch.autograd.grad((got * upstream).sum(), logits)
    (want_grad,) = torch.autograd.grad((want * upstream).sum(), logits)
    torch.testing.assert_close(grad, want_grad)
    outside = torch.ones_like(grad, dtype=torch.bool)
    for row, ids in enumerate(sets):
        outside[row, ids if ids else []] = False
    outside[4] = False
    assert (grad[outside] == 0).all()  # tokens the sampler could not draw get no gradient


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy", [False, True])
def test_fused_head_renormalises_over_the_support(temperature: float, entropy: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 6, 8, generator=generator, dtype=torch.float64).requires_grad_()
    weight = (2 * torch.randn(40, 8, generator=generator, dtype=torch.float64)).requires_grad_()
    logits = hidden @ weight.T
    sets = nucleus_sets(logits.detach().reshape(-1, 40), 0.9, temperature)
    sets[0] = []
    tokens = draw(sets, 40, generator).reshape(2, 6)
    support = support_tensor(sets).reshape(2, 6, -1)
    got = fused_linear_logprobs(
        hidden,
        weight,
        tokens,
        temperature=temperature,
        chunk_size=5,
        entropy=entropy,
        support=support,
    )
    want = brute_force(logits.reshape(-1, 40), tokens.reshape(-1), sets, temperature)
    torch.testing.assert_close(got.logprobs.reshape(-1), want)
    loss = got.logprobs.sum()
    want_loss = want.sum()
    if entropy:
        assert got.entropy is not None
        rows = (logits.reshape(-1, 40) / temperature).unbind()
        want_entropy = torch.stack(
            [
                torch.special.entr(torch.softmax(row[ids] if ids else row, dim=-1)).sum()
                for row, ids in zip(rows, sets, strict=True)
            ]
        )
        torch.testing.assert_close(got.entropy.reshape(-1), want_entropy)
        loss = loss + 0.3 * got.entropy.sum()
        want_loss = want_loss + 0.3 * want_entropy.sum()
    grads = torch.autograd.grad(loss, (hidden, weight))
    want_grads = torch.autograd.grad(want_loss, (hidden, weight))
    for one, other in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(one, other)


def test_an_unrestricted_support_changes_nothing() -> None:
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 30, generator=generator)
    tokens = torch.randint(30, (4,), generator=generator)
    whole = torch.full((4, 3), SUPPORT_PAD)
    torch.testing.assert_close(
        selective_log_softmax(logits, tokens, 0.9, support=whole),
        selective_log_softmax(logits, tokens, 0.9),
    )


@pytest.mark.parametrize(
    ("support", "message"),
    [
        ([[1, 2], [3, 4]], "outside their own support, the first at index \\(1,\\)"),
        ([[1, 30], [3, SUPPORT_PAD]], "vocabulary ids in \\[0, 30\\)"),
        ([[1, -2], [3, SUPPORT_PAD]], "vocabulary ids in \\[0, 30\\)"),
    ],
)
def test_bad_support_is_rejected(support: list[list[int]], message: str) -> None:
    logits = torch.randn(2, 30)
    tokens = torch.tensor([1, 5])
    with pytest.raises(ValueError, match=message):
        selective_log_softmax(logits, tokens, support=torch.tensor(support))
    hidden, weight = torch.randn(2, 4), torch.randn(30, 4)
    with pytest.raises(ValueError, match=message):
        fused_linear_logprobs(hidden, weight, tokens, support=torch.tensor(support))
    with pytest.raises(ValueError, match="support shape"):
        selective_log_softmax(logits, tokens, support=torch.tensor([1, 5]))


def test_support_tensor_pads_and_refuses_overlong_sets() -> None:
    assert support_tensor([[3, 1], [], [7]]).tolist() == [[3, 1], [-1, -1], [7, -1]]
    with pytest.raises(ValueError, match="holds 2 ids, more than width 1"):
        support_tensor([[3, 1]], width=1)
