"""Log-probabilities of chosen tokens and entropies from logits, chunked over rows.

A naive ``log_softmax(logits.float(), -1).gather(...)`` materialises a float32 copy of the whole
``[tokens, vocab]`` logits (19.9 GB for 8 x 4096 tokens over Qwen's 151,936-token vocabulary),
and autograd keeps it for the backward pass. Here each chunk of rows is upcast, normalised and
reduced on its own, and the backward pass recomputes the softmax chunk by chunk from the saved
per-row log-normaliser, so the extra memory is a few chunks plus O(tokens), in both passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

CPU_CHUNK_ELEMENTS = 1 << 22
"""Default logits per chunk on CPU (16 MiB of float32): a chunk stays in a server's last-level
cache and under glibc's mmap threshold, so its buffers are reused rather than page-faulted in
anew; this is what makes the chunked loop faster than one full-size log-softmax on CPU."""

ACCELERATOR_CHUNK_ELEMENTS = 1 << 26
"""Default logits per chunk on GPUs and other devices (256 MiB of float32): few, large kernels."""

Block = tuple[torch.Tensor, tuple[int, ...], slice]

SUPPORT_PAD = -1
"""The padding entry of a ``support`` tensor; a row of padding alone is the whole vocabulary."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_temperature(temperature: float) -> None:
    if not temperature > 0 or temperature == float("inf"):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")


def _check_common(logits: torch.Tensor, temperature: float, chunk_size: int | None) -> int:
    """Validate; return the rows per chunk."""
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
    if logits.dim() < 2:
        raise ValueError(
            f"logits must have shape [..., vocab] with at least 2 dims, got {tuple(logits.shape)}"
        )
    if logits.shape[-1] == 0:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    _check_temperature(temperature)
    if chunk_size is None:
        budget = CPU_CHUNK_ELEMENTS if logits.device.type == "cpu" else ACCELERATOR_CHUNK_ELEMENTS
        return max(1, budget // logits.shape[-1])
    return _check_chunk_size(chunk_size)


def _check_chunk_size(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (rows per chunk), got {chunk_size!r}")
    return chunk_size


def _check_ids(
    ids: torch.Tensor,
    name: str,
    shape: tuple[int, ...],
    shape_of: str,
    other: torch.Tensor,
    other_name: str,
) -> None:
    """``ids`` (called ``name``) are integers of ``shape`` (described as ``shape_of``) on the
    device of ``other`` (called ``other_name``)."""
    if tuple(ids.shape) != shape:
        raise ValueError(f"{name} shape {tuple(ids.shape)} must equal {shape_of}, {shape}")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {ids.dtype}")
    if ids.device != other.device:
        raise ValueError(f"{name} is on {ids.device} but {other_name} on {other.device}")


def _check_token_ids(token_ids: torch.Tensor, scored: torch.Tensor, name: str) -> None:
    """``token_ids`` name one target per row of ``scored`` (its shape without the last dim):
    integers on ``scored``'s device."""
    shape_of = f"the shape without the last dim of {name}"
    _check_ids(token_ids, "token_ids", tuple(scored.shape[:-1]), shape_of, scored, name)


def support_tensor(sets: Sequence[Sequence[int]], width: int | None = None) -> torch.Tensor:
    """``[len(sets), K]`` ids padded with ``SUPPORT_PAD`` from per-row support sets (an empty
    set: the whole vocabulary); ``K`` is the largest set, or ``width`` when given."""
    size = max((len(ids) for ids in sets), default=0) if width is None else width
    out = torch.full((len(sets), size), SUPPORT_PAD, dtype=torch.long)
    for row, ids in enumerate(sets):
        if len(ids) > size:
            raise ValueError(f"support set {row} holds {len(ids)} ids, more than width {size}")
        out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def check_support(support: torch.Tensor, token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Validate ``support``, ``[..., K]`` per row of ``token_ids`` ``[...]``: the ids a sampler
    could draw (its top-p / top-k set), padded with ``SUPPORT_PAD``; return it as long.

    A row whose entries are all padding is unrestricted (the whole vocabulary). A restricted row
    must hold its own token, whose log-prob would otherwise be minus infinity."""
    width = support.shape[-1] if support.dim() else 0
    shape = (*token_ids.shape, width)
    _check_ids(support, "support", shape, "[*shape, K] of token_ids", token_ids, "token_ids")
    support = support.to(torch.long)
    if support.numel() == 0:
        return support
    low, high = int(support.min().item()), int(support.max().item())
    if low < SUPPORT_PAD or high >= vocab:
        raise ValueError(
            f"support ids must be vocabulary ids in [0, {vocab}) or the padding {SUPPORT_PAD}, "
            f"got values from {low} to {high}"
        )
    restricted = (support >= 0).any(dim=-1)
    holds = (support == token_ids.unsqueeze(-1).to(torch.long)).any(dim=-1)
    missing = (restricted & ~holds).nonzero()
    if missing.numel():
        where = tuple(missing[0].tolist())
        raise ValueError(
            f"{missing.shape[0]} token(s) lie outside their own support, the first at index "
            f"{where} (token {int(token_ids[where].item())}): a sampler cannot have drawn them"
        )
    return support


def restrict(scaled: torch.Tensor, support: torch.Tensor | None) -> torch.Tensor:
    """``scaled`` (a writable ``[rows, vocab]`` chunk) with every entry outside its row's
    ``support`` (``[rows, K]``, see ``check_support``) set to minus infinity, in place; rows of
    padding alone and a ``support`` of None leave it whole."""
    if support is None:
        return scaled
    allowed = torch.zeros(scaled.shape, dtype=torch.bool, device=scaled.device)
    # Padding is pointed at an id already in the row (its largest), so every write is True and
    # duplicate indices cannot race; rows of padding alone are then opened whole.
    largest = support.amax(dim=-1, keepdim=True)
    allowed.scatter_(-1, torch.where(support >= 0, support, largest).clamp(min=0), True)
    allowed[largest.squeeze(-1) < 0] = True
    return scaled.masked_fill_(~allowed, float("-inf"))


def _blocks(logits: torch.Tensor, rows: int, prefix: tuple[int, ...] = ()) -> Iterator[Block]:
    """Yield ``[rows, vocab]`` views of ``logits`` with where they go in a ``[..., ]`` output.

    Each item is (block, leading index, row slice): the block's results belong at
    ``out[leading index].view(-1)[row slice]``. A tensor whose leading dims cannot be flattened
    without a copy (e.g. ``logits[:, :-1]``) is walked one leading index at a time instead.
    """
    try:
        flat = logits.view(-1, logits.shape[-1])
    except RuntimeError:
        for i in range(logits.shape[0]):
            yield from _blocks(logits[i], rows, (*prefix, i))
        return
    for start in range(0, flat.shape[0], rows):
        yield flat[start : start + rows], prefix, slice(start, start + rows)


def _scaled(block: torch.Tensor, temperature: float, *, writable: bool) -> torch.Tensor:
    """``block / temperature`` in the compute dtype; a fresh tensor if ``writable``, else
    ``block`` itself when it needs neither upcast nor scaling (saves a pass over the chunk)."""
    dtype = _compute_dtype(block.dtype)
    if not writable and block.dtype == dtype and temperature == 1.0:
        return block
    scaled = block.to(dtype, copy=True)
    return scaled if temperature == 1.0 else scaled.div_(temperature)


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        support: torch.Tensor | None,
        temperature: float,
        rows: int,
    ) -> torch.Tensor:
        dtype = _compute_dtype(logits.dtype)
        out = torch.empty(token_ids.shape, dtype=dtype, device=logits.device)
        log_norm = torch.empty(token_ids.shape, dtype=dtype, device=logits.device)
        for block, prefix, rows_slice in _blocks(logits, rows):
            ids = token_ids[prefix].reshape(-1, 1)[rows_slice]
            scaled = restrict(
                _scaled(block, temperature, writable=support is not None),
                _support_rows(support, prefix, rows_slice),
            )
            picked_logit = scaled.gather(-1, ids).squeeze(-1)
            picked = torch.log_softmax(scaled, dim=-1).gather(-1, ids).squeeze(-1)
            out[prefix].view(-1)[rows_slice] = picked
            # logsumexp of the row, recovered without a second pass over the vocabulary.
            log_norm[prefix].view(-1)[rows_slice] = picked_logit - picked
        ctx.save_for_backward(logits, token_ids, support, log_norm)
        ctx.temperature = temperature
        ctx.rows = rows
        return out

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, token_ids, support, log_norm = ctx.saved_tensors
        temperature: float = ctx.temperature
        grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        # d log p_t / d z_j = (1[j = t] - softmax_j) / T
        grad_out = grad_out.contiguous() / temperature
        for block, prefix, rows_slice in _blocks(logits, ctx.rows):
            ids = token_ids[prefix].reshape(-1, 1)[rows_slice]
            upstream = grad_out[prefix].reshape(-1, 1)[rows_slice]
            norm = log_norm[prefix].reshape(-1, 1)[rows_slice]
            target = grad_logits[prefix].view(-1, logits.shape[-1])[rows_slice]
            if target.dtype == _compute_dtype(target.dtype):
                # Work in the gradient's own memory: no chunk buffer and no final copy.
                work = target.copy_(block)
                if temperature != 1.0:
                    work.div_(temperature)
            else:
                work = _scaled(block, temperature, writable=True)
            restrict(work, _support_rows(support, prefix, rows_slice))
            work.sub_(norm).exp_().mul_(-upstream).scatter_add_(-1, ids, upstream)
            if work is not target:
                target.copy_(work)
        return grad_logits, None, None, None, None


def _support_rows(
    support: torch.Tensor | None, prefix: tuple[int, ...], rows_slice: slice
) -> torch.Tensor | None:
    """The ``[rows, K]`` support of one block from ``_blocks``."""
    if support is None:
        return None
    return support[prefix].reshape(-1, support.shape[-1])[rows_slice]


def selective_log_softmax(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    support: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log softmax(logits / temperature)[token_ids]`` without the full log-softmax tensor.

    ``logits`` is ``[..., vocab]`` in any floating dtype on any device, ``token_ids`` the integer
    ``[...]`` ids to pick. The result is float32 (float64 for float64 logits); bf16/fp16 logits
    are upcast one chunk at a time. ``chunk_size`` is rows per chunk; None picks about 4M logits
    per chunk on CPU and 64M on other devices. Differentiable with respect to ``logits``, with
    the same memory bound.
    Pass the sampling temperature so the log-probs match the distribution that was sampled.

    ``support`` (``[..., K]`` ids padded with ``SUPPORT_PAD``, see ``check_support``) restricts
    each row's softmax to the tokens its sampler could draw (a top-p / top-k nucleus): the
    log-prob is then renormalised over them, as the sampled distribution was.
    """
    rows = _check_common(logits, temperature, chunk_size)
    _check_token_ids(token_ids, logits, "logits")
    ids = token_ids.to(torch.long).contiguous()
    if support is not None:
        support = check_support(support, ids, logits.shape[-1]).contiguous()
    # torch declares Function.apply without types.
    result: torch.Tensor = _SelectiveLogSoftmax.apply(  # type: ignore[no-untyped-call]
        logits, ids, support, float(temperature), rows
    )
    return result


@torch.no_grad()
def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position, ``[...]`` from ``[..., vocab]``.

    For metrics: computed chunk by chunk in float32 (float64 for float64 logits) and returned
    without gradient. Tokens masked to ``-inf`` contribute 0.
    """
    rows = _check_common(logits, temperature, chunk_size)
    out = torch.empty(logits.shape[:-1], dtype=_compute_dtype(logits.dtype), device=logits.device)
    for block, prefix, rows_slice in _blocks(logits, rows):
        probs = torch.log_softmax(_scaled(block, temperature, writable=False), dim=-1).exp_()
        out[prefix].view(-1)[rows_slice] = torch.special.entr(probs).sum(dim=-1)
    return out
