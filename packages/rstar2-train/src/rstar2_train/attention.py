"""Attention over packed micro-batches that needs no compiler: ``varlen_attention``.

A packed micro-batch is one row holding several sequences (documents) back to back, their
position ids restarting at 0. ``sdpa`` attends through a dense ``[tokens, tokens]`` document
mask, FlexAttention compiles Triton kernels in the first forward (minutes on a large row).
``varlen_attention`` instead hands the row to a variable-length kernel as ``[tokens, heads,
dim]`` with the documents' cumulative offsets:

- on CUDA, PyTorch's own FlashAttention for variable-length batches
  (``torch.nn.attention.varlen.varlen_attn``, torch 2.10+; it has a backward pass);
- elsewhere (CPU), causal ``sdpa`` per document: the same result, document by document
  (slow, but it is what tests compare against).

The offsets come from the packer (``MicroBatch.documents``, passed to the model as
transformers' ``cu_seq_lens_q``/``cu_seq_lens_k``/``max_length_q``/``max_length_k`` keyword
arguments), so they are built once per micro-batch on the host; a caller that passes only
position ids gets them derived from the position ids, on every layer. Grouped-query models (fewer
key/value heads than query heads) are handled natively where the installed ``varlen_attn``
takes ``enable_gqa``, else by repeating each key/value head for its group.

Anything that is not a packed row (a padded batch, rows reading a KV cache with a mask) goes to
transformers' ``sdpa``, so one model can run packed, padded and shared-prefix micro-batches.
Importing this module registers the implementation with transformers (``AttentionInterface``
and ``AttentionMaskInterface``).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN_ATTENTION = "varlen_attention"
"""The name of this attention implementation (``model.attn_implementation``)."""

Kernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float | None], torch.Tensor
]
"""``(query [T, Hq, D], key [T, Hkv, D], value [T, Hkv, D], offsets [docs + 1] int32, longest
document, scale) -> [T, Hq, D]``: causal attention within each document."""


def varlen_unavailable(dtype: torch.dtype) -> str | None:
    """Why ``varlen_attention`` cannot run its FlashAttention kernel for a trainer computing in
    ``dtype`` with this torch (and this process's GPU, when it has one); None when it can."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (torch 2.10+)"
    if torch.version.hip is not None:
        return "varlen_attn has not been verified on ROCm builds of torch"
    if not torch.backends.cuda.is_flash_attention_available():
        return "this torch build has no FlashAttention kernels"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"FlashAttention runs in bfloat16 or float16, the trainer computes in {dtype}"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            name = torch.cuda.get_device_name()
            return f"{name} (sm_{major}{minor}) has no FlashAttention kernels (sm_80 and newer)"
    return None


def offsets_from_lengths(lengths: Sequence[int]) -> torch.Tensor:
    """The cumulative offsets ``[0, l0, l0 + l1, ...]`` (int32, on the CPU) of documents packed
    with these lengths."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    offsets[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
    return offsets


def offsets_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The offsets and longest document of one packed row, from its ``[1, tokens]`` position
    ids: a document starts wherever the position is not the previous one plus 1 (transformers'
    rule for packed rows). Reads the longest length back to the host."""
    if position_ids.dim() != 2 or position_ids.shape[0] != 1:
        shape = tuple(position_ids.shape)
        raise ValueError(f"one packed row of position ids expected, got shape {shape}")
    row = position_ids[0]
    starts = torch.ones_like(row, dtype=torch.bool)
    starts[1:] = row[1:] != row[:-1] + 1
    bounds = torch.cat(
        [starts.nonzero().flatten(), torch.tensor([row.numel()], device=row.device)]
    ).to(torch.int32)
    return bounds, int((bounds[1:] - bounds[:-1]).max().item())


def expand_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """``[tokens, kv heads, dim]`` -> ``[tokens, kv heads x groups, dim]``: each key/value head
    repeated for the ``groups`` query heads that read it (query head ``h`` reads key/value head
    ``h // groups``, as transformers' ``repeat_kv``)."""
    if groups == 1:
        return states
    return states.repeat_interleave(groups, dim=1)


def _groups(query: torch.Tensor, key: torch.Tensor) -> int:
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads")
    return heads // kv_heads


def sdpa_document_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    offsets: torch.Tensor,
    longest: int,
    scale: float | None,
) -> torch.Tensor:
    """The reference kernel: causal ``sdpa`` over each document in turn."""
    del longest
    groups = _groups(query, key)
    key, value = expand_kv(key, groups), expand_kv(value, groups)
    bounds = offsets.tolist()
    parts = []
    for start, end in itertools.pairwise(bounds):
        if end > start:
            q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale
            )
            parts.append(out[0].transpose(0, 1))
    return torch.cat(parts)


@functools.cache
def _parameters(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def varlen_takes_gqa() -> bool:
    """Whether the installed ``varlen_attn`` reads grouped keys and values as they are
    (``enable_gqa``); without it each key/value head is repeated for its query group, and the
    repeated copies are what the backward pass keeps."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return False
    from torch.nn.attention import varlen

    return "enable_gqa" in _parameters(varlen.varlen_attn)


def torch_varlen_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    offsets: torch.Tensor,
    longest: int,
    scale: float | None,
) -> torch.Tensor:
    """PyTorch's variable-length FlashAttention (CUDA), called as the installed torch takes it:
    torch 2.10 has ``is_causal`` and no grouped-query or scale argument; later versions take
    ``window_size=(-1, 0)`` for causal attention, ``enable_gqa`` and ``scale``."""
    from torch.nn.attention import varlen

    function = varlen.varlen_attn
    parameters = _parameters(function)
    groups = _groups(query, key)
    options: dict[str, Any] = {}
    if groups > 1 and varlen_takes_gqa():
        options["enable_gqa"] = True
    else:
        key, value = expand_kv(key, groups), expand_kv(value, groups)
    if "window_size" in parameters:
        options["window_size"] = (-1, 0)
    else:
        options["is_causal"] = True
    if "scale" in parameters:
        options["scale"] = scale
    elif scale is not None and not math.isclose(scale, query.shape[-1] ** -0.5):
        raise ValueError(
            f"this torch's varlen_attn takes no scale, and the model scales attention by {scale} "
            "(not 1/sqrt(head_dim)): use model.attn_implementation=flex_attention"
        )
    out = function(query, key, value, offsets, offsets, longest, longest, **options)
    assert isinstance(out, torch.Tensor)  # no auxiliary outputs were asked for
    return out


def kernel_for(device: torch.device) -> Kernel:
    """The variable-length kernel on ``device``: FlashAttention on CUDA (and ROCm builds of
    torch, which present as CUDA), per-document ``sdpa`` elsewhere."""
    return torch_varlen_kernel if device.type == "cuda" else sdpa_document_kernel


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface (``[batch, heads, tokens, dim]`` in, ``[batch, tokens,
    heads, dim]`` out) over one packed row; see the module docstring."""
    offsets: torch.Tensor | None = kwargs.get("cu_seq_lens_q")
    longest: int | None = kwargs.get("max_length_q")
    position_ids: torch.Tensor | None = kwargs.get("position_ids")
    packed_row = (
        attention_mask is None
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2]
        and (offsets is not None or position_ids is not None)
    )
    if not packed_row:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise ValueError(f"{VARLEN_ATTENTION} has no attention dropout (got {dropout})")
    for name in ("sliding_window", "softcap"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"{VARLEN_ATTENTION} does not apply the model's {name}: use "
                "model.attn_implementation=flex_attention for this model"
            )
    if offsets is None or longest is None:
        assert position_ids is not None
        offsets, longest = offsets_from_position_ids(position_ids.expand(1, -1))
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = kernel_for(query.device)(q, k, v, offsets.to(query.device), longest, scaling)
    return out.unsqueeze(0), None


def varlen_mask(
    *,
    kv_length: int,
    kv_offset: Any = 0,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """No mask for a forward without cache or padding mask (causal within documents is the
    kernel's job); ``sdpa``'s mask otherwise (rows reading a KV cache, padded batches). Takes
    the query's extent as recent transformers give it (``q_length``, ``q_offset``) or as
    earlier 5.x releases did (``cache_position``)."""
    q_length, q_offset = kwargs.get("q_length"), kwargs.get("q_offset", 0)
    positions = kwargs.get("cache_position")
    if q_length is None and positions is not None:
        q_length, q_offset = positions.shape[0], int(positions[0])
    plain = (
        attention_mask is None
        and q_length == kv_length
        and all(isinstance(o, int) and o == 0 for o in (q_offset, kv_offset))
    )
    if plain:
        return None
    mask: torch.Tensor | None = sdpa_mask(
        kv_length=kv_length, kv_offset=kv_offset, attention_mask=attention_mask, **kwargs
    )
    return mask


def varlen_kwargs(offsets: torch.Tensor, longest: int) -> dict[str, Any]:
    """The model keyword arguments that carry a packed row's documents to every layer."""
    return {
        "cu_seq_lens_q": offsets,
        "cu_seq_lens_k": offsets,
        "max_length_q": longest,
        "max_length_k": longest,
    }


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
AttentionMaskInterface.register(VARLEN_ATTENTION, varlen_mask)
