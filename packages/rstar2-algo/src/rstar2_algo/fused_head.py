"""Per-token log-probs (and entropy) straight from hidden states through the LM head, chunked.

The unfused path runs the LM head over every trained position, then a log-softmax: its
``[tokens, vocab]`` logits (bf16 for the head, float32 for the softmax) are the largest tensors
of a policy update, 5 GB of bf16 logits for 16,384 tokens over Qwen's 151,936-token vocabulary,
and autograd keeps them for the backward pass. Here the head and the temperature-scaled
log-softmax run one chunk of rows at a time; the forward pass keeps only the per-row
log-normaliser (and entropy), and the backward pass recomputes each chunk's logits from the
saved hidden states, so the logits of one chunk are all that ever exist. That costs one more
head matmul per chunk in the backward pass (four instead of three), the usual trade of
Liger Kernel's fused linear cross-entropy; unlike a fused cross-entropy, the result is the
per-token log-prob itself, so any loss (the clipped policy loss, its importance weights) can be
built on it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from rstar2_algo.logprobs import (
    ACCELERATOR_CHUNK_ELEMENTS,
    CPU_CHUNK_ELEMENTS,
    _check_chunk_size,
    _check_temperature,
    _check_token_ids,
    _compute_dtype,
    check_support,
    restrict,
)

_LOW_PRECISION = (torch.bfloat16, torch.float16)

CPU_MIN_ROWS = 512
"""Fewest rows per chunk by default on CPU: every chunk's matmul reads the whole head, and on a
2-core CPU 27-row chunks (4M logits over a 152K vocabulary) ran 2-3x slower than one full-size
head, 512-row chunks about as fast."""

ACCELERATOR_MIN_ROWS = 1024
"""Fewest rows per chunk by default on GPUs and other devices, for the same reason (a reasoned
default, not measured: no GPU run)."""


class HeadLogProbs(NamedTuple):
    """What ``fused_linear_logprobs`` returns."""

    logprobs: torch.Tensor
    """``log softmax((hidden @ weight.T + bias) / T)[token_ids]``, shape of ``token_ids``."""
    entropy: torch.Tensor | None
    """The entropy of the same distribution per position, when asked for; else None."""


def _scaled_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """One chunk's ``(hidden @ weight.T + bias) / T`` in the compute dtype (a fresh tensor)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    dtype = _compute_dtype(logits.dtype)
    scaled = logits if logits.dtype == dtype else logits.to(dtype)
    return scaled if temperature == 1.0 else scaled.div_(temperature)


def _accumulate_product(total: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """``total += left @ right``, summed in ``total``'s dtype without a ``[vocab, hidden]``
    product in the inputs' lower precision: on CUDA cuBLAS writes the float32 sum directly
    (``addmm``'s ``out_dtype``, torch 2.8 and later); elsewhere the chunk is upcast, which costs
    one chunk-sized copy rather than a head-sized one."""
    if total.dtype == left.dtype:
        total.addmm_(left, right)
    elif total.device.type == "cuda" and _CUDA_OUT_DTYPE[0]:
        try:
            torch.addmm(total, left, right, out_dtype=total.dtype, out=total)
        except (TypeError, RuntimeError, NotImplementedError):
            # An older torch: the head-sized product in the compute dtype, then the sum.
            _CUDA_OUT_DTYPE[0] = False
            total.add_(left @ right)
    elif total.device.type == "cuda":
        total.add_(left @ right)
    else:
        total.addmm_(left.to(total.dtype), right.to(total.dtype))


_CUDA_OUT_DTYPE = [True]
"""Whether this torch's CUDA ``addmm`` takes ``out_dtype`` (cleared on the first refusal)."""


class _FusedLinearLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        token_ids: torch.Tensor,
        support: torch.Tensor | None,
        temperature: float,
        rows: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        count = hidden.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        logprobs = torch.empty(count, dtype=dtype, device=hidden.device)
        log_norm = torch.empty(count, dtype=dtype, device=hidden.device)
        entropy = torch.empty(count if with_entropy else 0, dtype=dtype, device=hidden.device)
        for start in range(0, count, rows):
            part = slice(start, start + rows)
            scaled = _scaled_logits(hidden[part], weight, bias, temperature)
            restrict(scaled, None if support is None else support[part])
            ids = token_ids[part, None]
            picked_logit = scaled.gather(-1, ids).squeeze(-1)
            # log_softmax is one fused pass with one output (logsumexp makes two temporaries).
            log_probs = torch.log_softmax(scaled, dim=-1)
            del scaled
            picked = log_probs.gather(-1, ids).squeeze(-1)
            logprobs[part] = picked
            log_norm[part] = picked_logit - picked  # the row's logsumexp
            if with_entropy:
                entropy[part] = torch.special.entr(log_probs.exp_()).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, token_ids, support, log_norm, entropy)
        ctx.temperature = temperature
        ctx.rows = rows
        ctx.with_entropy = with_entropy
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, token_ids, support, log_norm, entropy = ctx.saved_tensors
        temperature: float = ctx.temperature
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Chunk products of a bf16/fp16 head are summed in float32, as one full-size matmul
        # would accumulate them, and rounded to the weight's dtype once at the end.
        accumulate = torch.float32 if weight.dtype in _LOW_PRECISION else weight.dtype
        grad_weight = (
            torch.zeros(weight.shape, dtype=accumulate, device=weight.device)
            if need_weight
            else None
        )
        grad_bias = (
            torch.zeros(weight.shape[0], dtype=accumulate, device=weight.device)
            if need_bias
            else None
        )
        if grad_logprobs is None:
            grad_logprobs = torch.zeros_like(log_norm)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        for start in range(0, hidden.shape[0], ctx.rows):
            part = slice(start, start + ctx.rows)
            upstream = grad_logprobs[part].unsqueeze(-1).to(log_norm.dtype)
            log_probs = _scaled_logits(hidden[part], weight, bias, temperature)
            restrict(log_probs, None if support is None else support[part])
            log_probs.sub_(log_norm[part].unsqueeze(-1))
            # For the scaled logits u = z / T: d log p_t / d u_j = 1[j = t] - p_j and
            # d H / d u_j = -p_j (log p_j + H), so the gradient is 1[j = t] g - p_j c_j with
            # c_j = g + g_H (log p_j + H). In place: one chunk-sized buffer (two with entropy).
            if use_entropy:
                assert grad_entropy is not None
                weight_h = grad_entropy[part].unsqueeze(-1).to(log_norm.dtype)
                grad = log_probs.exp()
                coefficient = log_probs.add_(entropy[part].unsqueeze(-1)).mul_(weight_h)
                # A token masked to -inf has p = 0 and contributes nothing (not 0 * inf).
                coefficient.add_(upstream).masked_fill_(grad == 0, 0.0)
                grad.mul_(coefficient).neg_()
                del coefficient
            else:
                grad = log_probs.exp_().mul_(upstream.neg())
            del log_probs
            grad.scatter_add_(-1, token_ids[part, None], upstream)
            if temperature != 1.0:
                grad.div_(temperature)
            grad = grad.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[part] = grad @ weight
            if grad_weight is not None:
                _accumulate_product(grad_weight, grad.T, hidden[part])
            if grad_bias is not None:
                grad_bias.add_(grad.sum(dim=0))
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy: bool = False,
    support: torch.Tensor | None = None,
) -> HeadLogProbs:
    """``log softmax((hidden @ weight.T + bias) / temperature)[token_ids]`` without the logits.

    ``hidden`` is ``[..., hidden_size]`` (the final hidden states of the positions to score),
    ``weight`` the LM head's ``[vocab, hidden_size]`` matrix (the input embeddings when they are
    tied), ``bias`` its optional ``[vocab]`` bias, ``token_ids`` the integer ``[...]`` targets.
    ``hidden``, ``weight`` and ``bias`` share one floating dtype and device; the head runs in
    that dtype and the softmax in float32 (float64 for float64 inputs), which is also the
    dtype of the results. ``entropy=True`` also returns the per-position entropy of the same
    distribution. Both results are differentiable with respect to ``hidden``, ``weight`` and
    ``bias``; the weight's gradient of a bf16/fp16 head is accumulated over chunks in float32.

    ``chunk_size`` is rows per chunk; None picks about 4M logits per chunk on CPU and 64M on
    other devices, and at least 512 rows on CPU and 1024 on other devices (each chunk's matmul
    reads the whole head). Pass the sampling temperature so the log-probs describe the distribution
    that was sampled.

    ``support`` (``[..., K]`` ids padded with ``SUPPORT_PAD``, see
    ``rstar2_algo.logprobs.check_support``) restricts each row to the tokens its sampler could
    draw (a top-p / top-k nucleus): log-prob and entropy are those of the distribution
    renormalised over them, the one that was sampled.
    """
    rows = _check(hidden, weight, bias, token_ids, temperature, chunk_size)
    size = hidden.shape[-1]
    flat_hidden = hidden.reshape(-1, size)
    flat_ids = token_ids.reshape(-1).to(torch.long)
    flat_support = None
    if support is not None:
        flat_support = check_support(support, token_ids, weight.shape[0])
        flat_support = flat_support.reshape(-1, flat_support.shape[-1])
    # torch declares Function.apply without types.
    logprobs, entropies = _FusedLinearLogSoftmax.apply(  # type: ignore[no-untyped-call]
        flat_hidden, weight, bias, flat_ids, flat_support, float(temperature), rows, entropy
    )
    shape = tuple(token_ids.shape)
    return HeadLogProbs(logprobs.view(shape), entropies.view(shape) if entropy else None)


def _check(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    token_ids: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
) -> int:
    """Validate the inputs; return the rows per chunk."""
    if not hidden.is_floating_point():
        raise ValueError(f"hidden must be a floating-point tensor, got {hidden.dtype}")
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape [..., hidden_size]")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1] or weight.shape[0] == 0:
        raise ValueError(
            f"weight must have shape [vocab, {hidden.shape[-1]}] (the hidden size), got "
            f"{tuple(weight.shape)}"
        )
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(
            f"weight ({weight.dtype} on {weight.device}) must have the dtype and device of "
            f"hidden ({hidden.dtype} on {hidden.device})"
        )
    if bias is not None and (
        tuple(bias.shape) != (weight.shape[0],)
        or bias.dtype != weight.dtype
        or bias.device != weight.device
    ):
        raise ValueError(
            f"bias must have shape ({weight.shape[0]},) and the weight's dtype and device, got "
            f"{tuple(bias.shape)} {bias.dtype} on {bias.device}"
        )
    _check_token_ids(token_ids, hidden, "hidden")
    _check_temperature(temperature)
    if chunk_size is None:
        vocab, cpu = weight.shape[0], hidden.device.type == "cpu"
        budget = CPU_CHUNK_ELEMENTS if cpu else ACCELERATOR_CHUNK_ELEMENTS
        return max(CPU_MIN_ROWS if cpu else ACCELERATOR_MIN_ROWS, budget // vocab)
    return _check_chunk_size(chunk_size)
