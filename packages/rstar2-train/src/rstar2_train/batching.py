"""Token sequences -> micro-batches (packed or padded) -> per-token log-probs of their targets.

Every per-token quantity of a loss lives in the *sequence layout* ``[sequences, positions]``:
position ``t`` of a sequence is the prediction of its token ``t + 1`` from the tokens up to
``t``. Packed micro-batches hold all their sequences in one row (no padding; the attention is
kept within each sequence by resetting ``position_ids``); padded ones hold a row per sequence.
Either way the log-probs come back in the sequence layout, so losses never see the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from rstar2_algo import selective_log_softmax


@dataclass(frozen=True)
class TokenSequence:
    """One training sequence: ``ids``, the ``mask`` of tokens trained on (aligned with ``ids``:
    1 where the token is a target), and optional per-token values aligned with ``ids``."""

    ids: list[int]
    mask: list[int]
    token_values: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.ids) < 2:
            raise ValueError("a training sequence needs at least two tokens")
        lengths = {len(self.mask), *(len(v) for v in self.token_values.values())}
        if lengths != {len(self.ids)}:
            raise ValueError(f"mask and token values must have {len(self.ids)} entries each")


@dataclass(frozen=True)
class MicroBatch:
    """Model inputs for some sequences, and where each sequence's targets are in the output."""

    members: list[int]
    """Positions of these sequences in the list they were planned from."""
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    """None when packed (the packed position ids delimit the sequences)."""
    rows: torch.Tensor
    cols: torch.Tensor
    """``[sequences, positions]``: output row and column that predicts each target."""
    valid: torch.Tensor
    """``[sequences, positions]``: True before the sequence's end."""
    mask: torch.Tensor
    """``[sequences, positions]``: 1.0 where the target is trained on."""
    token_values: dict[str, torch.Tensor]
    """Per-token values in the sequence layout (0.0 past the end)."""

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


def collate(
    sequences: Sequence[TokenSequence],
    members: list[int],
    *,
    packing: bool,
    pad_id: int,
    device: torch.device,
) -> MicroBatch:
    """The micro-batch of ``sequences[i] for i in members``."""
    chosen = [sequences[i] for i in members]
    width = max(len(s.ids) for s in chosen) - 1
    count = len(chosen)
    rows = torch.zeros((count, width), dtype=torch.long)
    cols = torch.zeros((count, width), dtype=torch.long)
    valid = torch.zeros((count, width), dtype=torch.bool)
    mask = torch.zeros((count, width))
    names = sorted({name for s in chosen for name in s.token_values})
    values = {name: torch.zeros((count, width)) for name in names}
    if packing:
        flat = [token for s in chosen for token in s.ids]
        input_ids = torch.tensor([flat])
        position_ids = torch.tensor([[p for s in chosen for p in range(len(s.ids))]])
        attention_mask = None
    else:
        longest = width + 1
        input_ids = torch.full((count, longest), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((count, longest), dtype=torch.long)
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
            attention_mask[row, : n + 1] = 1  # type: ignore[index]  # set in this branch
            rows[row, :n] = row
            cols[row, :n] = torch.arange(n)
        valid[row, :n] = True
        mask[row, :n] = torch.tensor(sequence.mask[1:], dtype=torch.float32)
        for name in names:
            given = sequence.token_values.get(name)
            if given is not None:
                values[name][row, :n] = torch.tensor(given[1:], dtype=torch.float32)
    return MicroBatch(
        members=members,
        input_ids=input_ids.to(device),
        position_ids=position_ids.to(device),
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        rows=rows.to(device),
        cols=cols.to(device),
        valid=valid.to(device),
        mask=mask.to(device),
        token_values={name: tensor.to(device) for name, tensor in values.items()},
    )


def micro_batches(
    sequences: Sequence[TokenSequence],
    budget_tokens: int,
    *,
    packing: bool,
    pad_id: int,
    device: torch.device,
) -> list[MicroBatch]:
    """``sequences`` planned and collated into micro-batches."""
    groups = plan([len(s.ids) for s in sequences], budget_tokens, packing=packing)
    return [
        collate(sequences, members, packing=packing, pad_id=pad_id, device=device)
        for members in groups
    ]


def token_logprobs(
    model: PreTrainedModel, batch: MicroBatch, *, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probs of every target under ``model`` (temperature-scaled, as engines sample),
    ``[sequences, positions]``, 0 past each sequence's end. Differentiable."""
    output = model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,  # packed position ids are only read as separate sequences without one
    )
    # Each output position predicts the next input token; where that token belongs to the next
    # packed sequence (or is padding) the position is never gathered below.
    next_ids = torch.roll(batch.input_ids, shifts=-1, dims=1)
    logprobs = selective_log_softmax(output.logits, next_ids, temperature=temperature or 1.0)
    return torch.where(batch.valid, logprobs[batch.rows, batch.cols], 0.0)
