"""A batch of rows decoded together, its keys and values in a transformers ``DynamicCache``.

Rows are left-padded to the longest, so every row's context ends at the same column. Rows
that join a decoding batch are prefilled alone and their keys and values appended (both sides
left-padded to the longer); rows with the same context (an RL group's samples) are prefilled
once; finished rows leave the cache at once, and so does the left padding that only they
needed. The cache grows by one column per decode step
(``torch.cat`` of every layer's tensors): simple and exact, and the CPU path of
``TransformersEngine``. ``SlotBatch`` (``slots.py``) is the accelerator path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


class KVBatch(Protocol):
    """The rows an engine decodes together and their KV cache. Every method runs on the
    engine's compute thread, in inference mode; logits are ``[rows, vocab]``, the next-token
    logits of each row, in the order the rows were given."""

    @property
    def rows(self) -> int:
        """Rows held (0 when cleared)."""

    def can_join(self) -> bool:
        """Whether ``join`` can append rows to the held ones (else ``start`` over)."""

    def start(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        """Replace the batch with these rows: their whole contexts (prompt and tokens so far),
        and the most tokens each may reach (prompt + ``max_new_tokens``)."""

    def join(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        """Append these rows after the held ones."""

    def step(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Feed each held row its last token (at ``positions``)."""

    def keep(self, rows: Sequence[int]) -> None:
        """Keep rows ``rows`` (batch indices, each once), in that order."""

    def clear(self) -> None:
        """Drop every row (an allocation may be kept for the next rows)."""

    def release(self) -> None:
        """Drop every row and free the cache's memory."""


class PaddedBatch:
    """``KVBatch`` over a left-padded ``DynamicCache`` (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cache: DynamicCache | None = None
        self.attention: torch.Tensor | None = None
        """``[rows, width]``: 1 on real tokens, 0 on left padding."""

    @property
    def rows(self) -> int:
        return 0 if self.attention is None else int(self.attention.shape[0])

    def clear(self) -> None:
        self.cache = None
        self.attention = None

    release = clear

    def keep(self, rows: Sequence[int]) -> None:
        assert self.cache is not None
        assert self.attention is not None
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.attention = self.attention[index]
        # Columns that are padding in every row left (a finished long row's width) are dropped:
        # every decode step attends over and copies the whole width, so a batch that never
        # empties (continuous batching) would otherwise keep paying for rows long gone.
        live = self.attention.any(dim=0).nonzero()
        first = int(live[0]) if len(live) else 0
        if first:
            self.attention = self.attention[:, first:]
            for layer in self.cache.layers:
                assert isinstance(layer, DynamicLayer)  # the only layer a padded batch keeps
                assert layer.keys is not None
                assert layer.values is not None
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]

    def start(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        del reserved  # the cache grows as needed
        # Rows with the same context (the samples of one prompt, in RL) are computed once and
        # their keys and values copied: most of an RL step's prefill is its repeated prompts.
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(context), len(first)) for context in contexts]
        unique = list(first)
        width = max(len(context) for context in unique)
        input_ids = torch.zeros((len(unique), width), dtype=torch.long)
        attention = torch.zeros((len(unique), width), dtype=torch.long)
        for index, context in enumerate(unique):
            input_ids[index, width - len(context) :] = torch.tensor(context)
            attention[index, width - len(context) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=self.model.config)
        self.attention = attention.to(self.device)
        logits = self._logits(input_ids, positions)
        if len(unique) < len(contexts):
            self.keep(source)
            logits = logits[torch.tensor(source, device=logits.device)]
        return logits

    def step(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        assert self.attention is not None
        input_ids = torch.tensor([[token] for token in tokens])
        ones = torch.ones((len(tokens), 1), dtype=torch.long, device=self.device)
        self.attention = torch.cat([self.attention, ones], dim=-1)
        return self._logits(input_ids, torch.tensor([[p] for p in positions]))

    def can_join(self) -> bool:
        """Every layer's cache is a plain growing tensor (a sliding-window or other cache is
        re-prefilled with the whole batch instead)."""
        return self.cache is not None and all(
            type(layer) is DynamicLayer for layer in self.cache.layers
        )

    def join(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        """The running rows keep their cache, so a rollout back from a tool call costs its own
        prefill, not the whole batch's. Both sides are left-padded to the longer one."""
        cache, attention = self.cache, self.attention
        assert cache is not None
        assert attention is not None
        out = self.start(contexts, reserved)
        joined, joined_attention = self.cache, self.attention
        assert joined is not None
        assert joined_attention is not None
        width = max(attention.shape[1], joined_attention.shape[1])

        def left_pad(tensor: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            missing = width - tensor.shape[-dim_from_end]
            return torch.nn.functional.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0))

        for mine, theirs in zip(cache.layers, joined.layers, strict=True):
            assert isinstance(mine, DynamicLayer)  # checked by can_join
            assert isinstance(theirs, DynamicLayer)
            assert mine.keys is not None
            assert mine.values is not None
            assert theirs.keys is not None
            assert theirs.values is not None
            mine.keys = torch.cat([left_pad(mine.keys, 2), left_pad(theirs.keys, 2)])
            mine.values = torch.cat([left_pad(mine.values, 2), left_pad(theirs.values, 2)])
        self.cache = cache
        self.attention = torch.cat([left_pad(attention, 1), left_pad(joined_attention, 1)])
        return out

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The next-token logits of every batch row, ``[rows, vocab]``; extends the cache."""
        output = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=self.attention,
            position_ids=positions.to(self.device),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits
