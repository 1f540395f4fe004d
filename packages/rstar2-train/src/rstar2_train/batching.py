"""Token sequences -> micro-batches (packed or padded) -> per-token log-probs of their targets.

Every per-token quantity of a loss lives in the *sequence layout* ``[sequences, positions]``:
position ``t`` of a sequence is the prediction of its token ``t + 1`` from the tokens up to
``t``. Packed micro-batches hold all their sequences in one row (no padding; the attention is
kept within each sequence by resetting ``position_ids``); padded ones hold a row per sequence;
shared-prefix ones run the untrained head their sequences share (an RL group's prompt) once,
then a row per sequence of what follows it. Either way the log-probs come back in the sequence
layout, so losses never see the difference.

A packed micro-batch carries its documents' offsets, built here from the packer's own lengths:
``varlen_attention`` (``rstar2_train.attention``) reads them instead of a mask. Under
FlexAttention, which compiles its kernels for each new shape, packed rows are padded to a
multiple of the planned micro-batch tokens, so a run compiles them once, not per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import DynamicCache, PreTrainedModel

from rstar2_algo import SUPPORT_PAD, fused_linear_logprobs, selective_log_softmax
from rstar2_train.attention import VARLEN_ATTENTION, offsets_from_lengths, varlen_kwargs
from rstar2_train.lm_head import final_hidden_states, fusable_head
from rstar2_train.startup import announce_compile, note_forward

COMPILING_ATTENTION = frozenset({"flex_attention"})
"""Attention implementations that compile kernels per input shape."""


@dataclass(frozen=True)
class TokenSequence:
    """One training sequence: ``ids``, the ``mask`` of tokens trained on (aligned with ``ids``:
    1 where the token is a target), and optional per-token values aligned with ``ids``."""

    ids: list[int]
    mask: list[int]
    token_values: dict[str, list[float]] = field(default_factory=dict)
    support: list[list[int]] | None = None
    """Per token, aligned with ``ids``: the ids its sampler could draw (a top-p / top-k
    nucleus; empty: the whole vocabulary). Its log-prob is then renormalised over them."""

    def __post_init__(self) -> None:
        if len(self.ids) < 2:
            raise ValueError("a training sequence needs at least two tokens")
        lengths = {len(self.mask), *(len(v) for v in self.token_values.values())}
        if self.support is not None:
            lengths.add(len(self.support))
        if lengths != {len(self.ids)}:
            raise ValueError(
                f"mask, token values and support must have {len(self.ids)} entries each"
            )


@dataclass(frozen=True)
class MicroBatch:
    """Model inputs for some sequences, and where each sequence's targets are in the output."""

    members: list[int]
    """Positions of these sequences in the list they were planned from."""
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    """``[sequences, positions]``: output row and column that predicts each target."""
    valid: torch.Tensor
    """``[sequences, positions]``: True before the sequence's end."""
    mask: torch.Tensor
    """``[sequences, positions]``: 1.0 where the target is trained on."""
    token_values: dict[str, torch.Tensor]
    """Per-token values in the sequence layout (0.0 past the end)."""
    prefix_ids: torch.Tensor | None = None
    """``[1, prefix length]``: the untrained context every sequence starts with, when the
    micro-batch shares one (an RL group's prompt). It runs once; ``input_ids`` then holds what
    follows it, a padded row per sequence, and output column ``c`` predicts ``input_ids[:, c]``
    (column 0 from the prefix's last position)."""
    documents: torch.Tensor | None = None
    """Packed micro-batches: the cumulative offsets (int32, ``[sequences + 1]``) of the
    sequences in the row."""
    longest: int = 0
    """Packed micro-batches: the longest sequence's length."""
    row_tokens: int | None = None
    """The token budget the micro-batch was planned with (a compiling attention pads packed
    rows to a multiple of it)."""
    support: torch.Tensor | None = None
    """``[sequences, positions, K]`` (int32): each target's sampling support, padded with
    ``rstar2_algo.SUPPORT_PAD`` (a row of padding alone: the whole vocabulary); None when no
    sequence has one."""

    def to(self, device: torch.device) -> MicroBatch:
        """This micro-batch with every tensor on ``device`` (itself when already there)."""
        if self.input_ids.device == device:
            return self
        return MicroBatch(
            members=self.members,
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            rows=self.rows.to(device),
            cols=self.cols.to(device),
            valid=self.valid.to(device),
            mask=self.mask.to(device),
            token_values={name: value.to(device) for name, value in self.token_values.items()},
            prefix_ids=None if self.prefix_ids is None else self.prefix_ids.to(device),
            documents=None if self.documents is None else self.documents.to(device),
            longest=self.longest,
            row_tokens=self.row_tokens,
            support=None if self.support is None else self.support.to(device),
        )

    @property
    def tokens(self) -> int:
        """Trained target tokens."""
        return int(self.mask.sum().item())

    @property
    def width(self) -> int:
        """Positions of the sequence layout."""
        return int(self.mask.shape[1])


def plan(lengths: Sequence[int], budget_tokens: int, *, packing: bool) -> list[list[int]]:
    """Group sequence positions into micro-batches of at most ``budget_tokens`` model tokens
    (packed: the sum of lengths; padded: rows x the longest). Longest first, deterministic; a
    sequence longer than the budget gets a micro-batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        candidate = [*current, index]
        cost = (
            sum(lengths[i] for i in candidate)
            if packing
            else len(candidate) * max(lengths[i] for i in candidate)
        )
        if current and cost > budget_tokens:
            batches.append(current)
            candidate = [index]
        current = candidate
    if current:
        batches.append(current)
    return batches


def shared_prefix(sequence: TokenSequence) -> tuple[int, ...]:
    """The untrained head of a sequence: its ids before the first trained token."""
    first = next((i for i, m in enumerate(sequence.mask) if m), len(sequence.ids) - 1)
    return tuple(sequence.ids[:first])


def plan_shared(
    sequences: Sequence[TokenSequence], budget_tokens: int
) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Micro-batches of sequences that share an untrained head of at least two tokens:
    ``(head length, members)``, costed as the head once plus padded rows of what follows; and
    the positions of sequences that share their head with no other (planned as usual)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, sequence in enumerate(sequences):
        groups.setdefault(shared_prefix(sequence), []).append(index)
    shared: list[tuple[int, list[int]]] = []
    alone: list[int] = []
    for head, members in groups.items():
        if len(members) < 2 or len(head) < 2:
            alone.extend(members)
            continue
        tails = [len(sequences[i].ids) - len(head) for i in members]
        budget = max(budget_tokens - len(head), 1)
        for part in plan(tails, budget, packing=False):
            shared.append((len(head), [members[i] for i in part]))
    return shared, sorted(alone)


class _Targets(NamedTuple):
    valid: torch.Tensor
    mask: torch.Tensor
    values: dict[str, torch.Tensor]
    support: torch.Tensor | None


def _targets(chosen: Sequence[TokenSequence], width: int) -> _Targets:
    """``valid``, ``mask``, the per-token values and supports of ``chosen`` in the sequence
    layout."""
    count = len(chosen)
    valid = torch.zeros((count, width), dtype=torch.bool)
    mask = torch.zeros((count, width))
    names = sorted({name for s in chosen for name in s.token_values})
    values = {name: torch.zeros((count, width)) for name in names}
    for row, sequence in enumerate(chosen):
        n = len(sequence.ids) - 1
        valid[row, :n] = True
        mask[row, :n] = torch.tensor(sequence.mask[1:], dtype=torch.float32)
        for name in names:
            given = sequence.token_values.get(name)
            if given is not None:
                values[name][row, :n] = torch.tensor(given[1:], dtype=torch.float32)
    return _Targets(valid, mask, values, _supports(chosen, width))


def _supports(chosen: Sequence[TokenSequence], width: int) -> torch.Tensor | None:
    """The targets' supports, ``[sequences, width, K]`` int32 (None when no sequence has one)."""
    given = [s.support for s in chosen]
    if all(support is None for support in given):
        return None
    size = max(len(ids) for support in given if support is not None for ids in support[1:])
    out = torch.full((len(chosen), width, max(size, 1)), SUPPORT_PAD, dtype=torch.int32)
    for row, support in enumerate(given):
        for position, ids in enumerate(support[1:] if support is not None else ()):
            if ids:
                out[row, position, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return out


def collate(
    sequences: Sequence[TokenSequence],
    members: list[int],
    *,
    packing: bool,
    pad_id: int,
    device: torch.device,
    row_tokens: int | None = None,
) -> MicroBatch:
    """The micro-batch of ``sequences[i] for i in members`` (planned with ``row_tokens`` per
    micro-batch, when known)."""
    chosen = [sequences[i] for i in members]
    width = max(len(s.ids) for s in chosen) - 1
    count = len(chosen)
    rows = torch.zeros((count, width), dtype=torch.long)
    cols = torch.zeros((count, width), dtype=torch.long)
    targets = _targets(chosen, width)
    if packing:
        flat = [token for s in chosen for token in s.ids]
        input_ids = torch.tensor([flat])
        position_ids = torch.tensor([[p for s in chosen for p in range(len(s.ids))]])
    else:
        # Padding goes on the right, where under the causal mask no real token attends to it:
        # no padding mask is needed, and attention can take its fused causal kernel.
        longest = width + 1
        input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
        position_ids = torch.arange(longest).repeat(count, 1)
    start = 0
    for row, sequence in enumerate(chosen):
        n = len(sequence.ids) - 1
        ids = torch.tensor(sequence.ids)
        if packing:
            rows[row, :n] = 0
            cols[row, :n] = torch.arange(start, start + n)
            start += n + 1
        else:
            input_ids[row, : n + 1] = ids
            rows[row, :n] = row
            cols[row, :n] = torch.arange(n)
    lengths = [len(s.ids) for s in chosen]
    return MicroBatch(
        members=members,
        input_ids=input_ids,
        position_ids=position_ids,
        rows=rows,
        cols=cols,
        valid=targets.valid,
        mask=targets.mask,
        token_values=targets.values,
        documents=offsets_from_lengths(lengths) if packing else None,
        longest=max(lengths) if packing else 0,
        row_tokens=row_tokens,
        support=targets.support,
    ).to(device)


def collate_shared(
    sequences: Sequence[TokenSequence],
    members: list[int],
    head: int,
    *,
    pad_id: int,
    device: torch.device,
) -> MicroBatch:
    """The micro-batch of ``sequences[i] for i in members``, which all start with the same
    ``head`` untrained ids: the head runs once and every row holds the rest of a sequence."""
    chosen = [sequences[i] for i in members]
    width = max(len(s.ids) for s in chosen) - 1
    tail = width + 1 - head
    count = len(chosen)
    input_ids = torch.full((count, tail), pad_id, dtype=torch.long)
    rows = torch.arange(count).unsqueeze(-1).expand(count, width).clone()
    # Sequence position t predicts token t + 1, which is the output column t - (head - 1); the
    # positions before it predict head tokens, never trained (their column is a placeholder).
    cols = (torch.arange(width) - (head - 1)).clamp(min=0).expand(count, width).clone()
    targets = _targets(chosen, width)
    for row, sequence in enumerate(chosen):
        input_ids[row, : len(sequence.ids) - head] = torch.tensor(sequence.ids[head:])
    return MicroBatch(
        members=members,
        input_ids=input_ids,
        position_ids=torch.arange(head, head + tail).repeat(count, 1),
        rows=rows,
        cols=cols,
        valid=targets.valid,
        mask=targets.mask,
        token_values=targets.values,
        prefix_ids=torch.tensor([chosen[0].ids[:head]]),
        support=targets.support,
    ).to(device)


def micro_batches(
    sequences: Sequence[TokenSequence],
    budget_tokens: int,
    *,
    packing: bool,
    pad_id: int,
    device: torch.device,
    share_prefixes: bool = False,
) -> list[MicroBatch]:
    """``sequences`` planned and collated into micro-batches.

    With ``share_prefixes``, sequences that start with the same untrained ids (the rollouts of
    one prompt) form micro-batches of their own in which that head runs once; the others are
    packed or padded as ``packing`` says.
    """
    shared: list[tuple[int, list[int]]] = []
    rest = list(range(len(sequences)))
    if share_prefixes:
        shared, rest = plan_shared(sequences, budget_tokens)
    groups = plan([len(sequences[i].ids) for i in rest], budget_tokens, packing=packing)
    return [
        *(
            collate_shared(sequences, members, head, pad_id=pad_id, device=device)
            for head, members in shared
        ),
        *(
            collate(
                sequences,
                [rest[i] for i in members],
                packing=packing,
                pad_id=pad_id,
                device=device,
                row_tokens=budget_tokens,
            )
            for members in groups
        ),
    ]


def token_logprobs(
    model: PreTrainedModel, batch: MicroBatch, *, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probs of every trained target (``mask`` 1) under ``model``, temperature-scaled as
    engines sample, ``[sequences, positions]``; 0 at every other position. Differentiable.

    The trained positions' final hidden states go through the LM head and the log-softmax in
    chunks (``rstar2_algo.fused_linear_logprobs``), forward and backward, so the micro-batch's
    logits never exist at once; a model whose logits are more than a linear head of its hidden
    states gets them from its own head instead, for the kept columns only.
    """
    trained = batch.mask > 0
    # Only columns where some row has a trained target are computed: an RL sequence is mostly
    # prompt, and a real vocabulary makes its logits the largest tensors of a step.
    keep = torch.unique(batch.cols[trained])
    if keep.numel() == 0:  # nothing trained: one column keeps the graph (its gradient is 0)
        keep = batch.cols[:1, -1]
    head = fusable_head(model)
    note_forward()
    columns = _output_columns(model, batch, keep, hidden=head is not None)
    # Output column c predicts the next input token (packed or padded rows; where it belongs to
    # the next packed sequence or is padding, the position is never trained), or in a
    # shared-prefix micro-batch input column c.
    targets = batch.input_ids if batch.prefix_ids is not None else batch.input_ids.roll(-1, 1)
    kept_col = torch.searchsorted(keep, batch.cols).clamp(max=keep.numel() - 1)
    temperature = temperature or 1.0
    rows, cols = batch.rows[trained], kept_col[trained]
    support = None if batch.support is None else batch.support[trained]
    if head is None:
        if support is not None:  # each trained target's support, in the output layout
            shape = (*columns.shape[:2], support.shape[-1])
            support = support.new_full(shape, SUPPORT_PAD).index_put((rows, cols), support)
        logprobs = selective_log_softmax(
            columns, targets[:, keep], temperature=temperature, support=support
        )
        return torch.where(trained, logprobs[batch.rows, kept_col], 0.0)
    picked = fused_linear_logprobs(
        columns[rows, cols],
        head.weight,
        targets[:, keep][rows, cols],
        bias=head.bias,
        temperature=temperature,
        support=support,
    ).logprobs
    out = torch.zeros(trained.shape, dtype=picked.dtype, device=picked.device)
    # Differentiable in ``picked``, also when it is empty (the graph still reaches the model).
    return out.index_put(trained.nonzero(as_tuple=True), picked)


def _output_columns(
    model: PreTrainedModel, batch: MicroBatch, keep: torch.Tensor, *, hidden: bool
) -> torch.Tensor:
    """``[rows, len(keep), *]``: the final hidden states (``hidden``) or the logits of output
    columns ``keep``. A shared-prefix micro-batch runs its prefix once into a KV cache, which
    every row's forward then reads (gradients through it add up)."""
    with final_hidden_states(model) as states:

        def forward(
            input_ids: torch.Tensor,
            position_ids: torch.Tensor,
            wanted: torch.Tensor,
            cache: DynamicCache | None = None,
            documents: dict[str, Any] | None = None,
        ) -> torch.Tensor:
            output = model(
                input_ids=input_ids,
                position_ids=position_ids,
                past_key_values=cache,
                # Without a cache, packed position ids are read as separate sequences.
                use_cache=cache is not None,
                # The fused head needs no logits at all, only the hidden states.
                logits_to_keep=wanted[:0] if hidden else wanted,
                **(documents or {}),
            )
            columns: torch.Tensor = states[-1][:, wanted] if hidden else output.logits
            return columns

        if batch.prefix_ids is None:
            return forward(*_packed_inputs(model, batch), keep, documents=_documents(model, batch))
        rows, head = batch.input_ids.shape[0], batch.prefix_ids.shape[1]
        cache = DynamicCache(config=model.config)
        positions = torch.arange(head, device=batch.prefix_ids.device)
        first = forward(batch.prefix_ids, positions.unsqueeze(0), positions[-1:], cache)
        if cache.get_seq_length() != head:
            raise RuntimeError(
                "shared-prefix micro-batches need the model's KV cache in training, which "
                "gradient checkpointing turns off: set rl.shared_prefix=false"
            )
        cache.batch_repeat_interleave(rows)
        # Column c > 0 is the rest's position c - 1; its last position predicts nothing.
        rest = keep[keep > 0] - 1
        parts = [first.expand(rows, -1, -1)] if bool(keep[0] == 0) else []
        if rest.numel():
            parts.append(forward(batch.input_ids, batch.position_ids, rest, cache))
        return torch.cat(parts, dim=1)


def _documents(model: PreTrainedModel, batch: MicroBatch) -> dict[str, Any]:
    """The packed row's document offsets as model keyword arguments, for ``varlen_attention``
    (other implementations find the documents from the position ids)."""
    if batch.documents is None or model.config._attn_implementation != VARLEN_ATTENTION:
        return {}
    return varlen_kwargs(batch.documents, batch.longest)


def _packed_inputs(model: PreTrainedModel, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``position_ids``; under a compiling attention, a packed row padded
    with a throwaway sequence to a multiple of its planned tokens (its own document: nothing
    real attends to it, and its outputs are never read), so that its kernels see one shape."""
    attention = model.config._attn_implementation
    if attention not in COMPILING_ATTENTION:
        return batch.input_ids, batch.position_ids
    announce_compile(attention)
    if batch.documents is None or not batch.row_tokens:
        return batch.input_ids, batch.position_ids
    width = batch.input_ids.shape[1]
    pad = -width % batch.row_tokens
    if not pad:
        return batch.input_ids, batch.position_ids
    filler = torch.arange(pad, device=batch.input_ids.device).unsqueeze(0)
    return (
        torch.cat([batch.input_ids, torch.zeros_like(filler)], dim=1),
        torch.cat([batch.position_ids, filler], dim=1),
    )
