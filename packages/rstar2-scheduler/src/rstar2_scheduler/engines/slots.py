"""Slot decoding: the accelerator path of ``TransformersEngine``.

``PaddedBatch`` grows a ``DynamicCache`` by concatenation, so every decode step copies the
whole cache of every layer, and transformers' ``sdpa`` path repeats the key/value heads of a
grouped-query model for a padded batch (a masked ``sdpa`` call cannot take them grouped on
CUDA): at 256 rows that is several times the cache's bytes moved per generated token, plus a
few hundred small kernel launches per step. ``SlotBatch`` instead:

- keeps each row in a *slot* of a preallocated cache (a transformers ``StaticLayer`` per model
  layer, ``[slots, kv heads, columns, head dim]``), left-aligned from column 0; a decode step
  writes each row's new key and value at its own column, in place, and a row that finishes
  frees its slot without moving anything;
- attends with ``grouped_decode_attention``: one query per row against the slot's columns,
  each key/value head read once for its whole query group, masked to the row's length, over a
  window of ``COLUMN_BLOCK`` x a power of two columns (so shapes repeat);
- can run the decode step under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs: one
  replay per step instead of a launch per kernel), within a compile budget: past
  ``compile_budget_s`` seconds of compiling, more than ``max_compiled_graphs`` graphs (a
  recompile storm) or on any compiler error, it decodes eagerly for the rest of its life, and
  says so in the log. Off by default: on an H200 the compiled step decoded 7x faster than
  ``model.generate`` once compiled, but its first pass took 52 s, 45 s of them compiling, and
  eager slot decoding has not been measured there against it.

Prefill (new rows, rows back from a tool call) runs as in ``PaddedBatch`` (rows with the same
context once) and its keys and values are copied into free slots. Models with sliding-window
or other non-standard cache layers use ``PaddedBatch``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rstar2_scheduler.compilation import compile_count, compile_seconds
from rstar2_scheduler.engines.padded import PaddedBatch

logger = logging.getLogger(__name__)

DECODE_ATTENTION = "rstar2_decode"
"""The attention implementation a slot-decoding model runs: ``grouped_decode_attention`` for
decode steps, ``sdpa`` (and its masks) for everything else."""

DEFAULT_COMPILE_BUDGET_S = 120.0
"""Seconds of compiling the decode step may take before it decodes eagerly instead."""

DEFAULT_MAX_COMPILED_GRAPHS = 16
"""Decode-step graphs (cache and window shapes) compiled before it decodes eagerly instead: a
shape that keeps changing would otherwise recompile without end."""

COLUMN_BLOCK = 256
"""Slot lengths and attention windows are multiples of this many columns."""


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one query per row with a boolean ``[rows, 1, 1, columns]`` mask, each
    key/value head read once for its group of query heads (no repeated heads); any other call
    goes to transformers' ``sdpa``. Returns ``[rows, 1, heads, head_dim]`` like ``sdpa``."""
    one_query = query.shape[2] == 1
    if not (one_query and attention_mask is not None and attention_mask.dtype == torch.bool):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rows, heads, _, size = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, size)
    scale = scaling if scaling is not None else size**-0.5
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scale)
    scores.masked_fill_(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [rows, kv heads, group, head_dim]
    return out.reshape(rows, 1, heads, size), None


def _register() -> None:
    AttentionInterface.register(DECODE_ATTENTION, grouped_decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


def slots_unsupported(model: PreTrainedModel) -> str | None:
    """Why ``model`` cannot decode in slots (None when it can)."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"its layers are {sorted(kinds)}, not all full attention"
    if not getattr(model, "_supports_attention_backend", False):
        return "it does not take transformers' attention interface"
    return None


class SlotCache(Cache):
    """A transformers ``Cache`` of ``SlotLayer``s sharing where each slot writes next."""

    def __init__(
        self,
        template: Sequence[tuple[torch.Tensor, torch.Tensor]],
        slots: int,
        columns: int,
        *,
        static: bool,
    ) -> None:
        device = template[0][0].device
        self.slot_index = torch.arange(slots, device=device)
        self.columns = torch.zeros(slots, dtype=torch.long, device=device)
        """The column each slot's next token goes to (its cached tokens)."""
        self.window = COLUMN_BLOCK
        """Columns the next decode step attends over (``COLUMN_BLOCK`` x a power of two, or all)."""
        self.slot_layers = [
            SlotLayer(self, keys, values, slots, columns, static=static)
            for keys, values in template
        ]
        self.column_count = columns
        super().__init__(layers=list(self.slot_layers))


class SlotLayer(StaticLayer):  # type: ignore[no-untyped-call]  # transformers' untyped hook
    """One model layer's slots: keys and values ``[slots, kv heads, columns, head dim]``."""

    def __init__(
        self,
        owner: SlotCache,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: int,
        columns: int,
        *,
        static: bool,
    ) -> None:
        super().__init__(max_cache_len=columns)
        self.owner = owner
        # Shaped after a prefill's keys and values; zeros, so a free slot attends to finite
        # values.
        self.dtype, self.device = keys.dtype, keys.device
        self.batch_size, self.num_heads = slots, keys.shape[1]
        self.k_head_dim, self.v_head_dim = keys.shape[3], values.shape[3]
        self.key_slots = keys.new_zeros((slots, keys.shape[1], columns, keys.shape[3]))
        self.value_slots = values.new_zeros((slots, values.shape[1], columns, values.shape[3]))
        self.keys, self.values = self.key_slots, self.value_slots
        if static:  # fixed addresses for CUDA graphs (importing the compiler costs seconds)
            torch._dynamo.mark_static_address(self.key_slots)
            torch._dynamo.mark_static_address(self.value_slots)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[2] != 1 or key_states.shape[0] != self.key_slots.shape[0]:
            raise RuntimeError("a slot cache takes one new token for each of its slots")
        rows, columns = self.owner.slot_index, self.owner.columns
        self.key_slots[rows, :, columns] = key_states[:, :, 0]
        self.value_slots[rows, :, columns] = value_states[:, :, 0]
        window = self.owner.window
        return self.key_slots[:, :, :window], self.value_slots[:, :, :window]


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block


class SlotBatch:
    """``KVBatch`` over per-row slots of a preallocated cache (see the module docstring).

    The cache has a power-of-two number of slots (at most ``max_slots``) and columns for the
    longest reservation seen, in ``COLUMN_BLOCK`` multiples; both grow when a row needs more
    (the cache is then reallocated and the decode step compiled again), and the allocation is
    kept while the batch empties and refills, until ``release``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        device: torch.device,
        *,
        max_slots: int,
        compile: bool,
        compile_budget_s: float = DEFAULT_COMPILE_BUDGET_S,
        max_compiled_graphs: int = DEFAULT_MAX_COMPILED_GRAPHS,
    ) -> None:
        _register()
        model.set_attn_implementation(DECODE_ATTENTION)
        self.model = model
        self.device = device
        self.max_slots = max_slots
        self.compile = compile
        self.compile_budget_s = compile_budget_s
        self.max_compiled_graphs = max_compiled_graphs
        self.compile_s = 0.0
        """Seconds spent compiling the decode step so far."""
        self.compiled_graphs = 0
        """Graphs compiled for the decode step so far (one per cache and window shape)."""
        self.cache: SlotCache | None = None
        self.lengths: list[int] = []
        """Tokens cached per slot (0 for a free slot)."""
        self.row_slots: list[int] = []
        """The slot of each row, in row order."""
        self._step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def rows(self) -> int:
        return len(self.row_slots)

    def can_join(self) -> bool:
        return True

    def clear(self) -> None:
        self.row_slots = []
        self.lengths = [0] * len(self.lengths)

    def release(self) -> None:
        self.clear()
        self.cache = None
        self.lengths = []
        self._step = None

    def keep(self, rows: Sequence[int]) -> None:
        if len(set(rows)) != len(rows):
            raise ValueError("a slot batch keeps each row at most once")
        kept = [self.row_slots[row] for row in rows]
        for slot in set(self.row_slots) - set(kept):
            self.lengths[slot] = 0
        self.row_slots = kept

    def start(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        self.clear()
        return self.join(contexts, reserved)

    def join(self, contexts: Sequence[Sequence[int]], reserved: Sequence[int]) -> torch.Tensor:
        prefill = PaddedBatch(self.model, self.device)
        logits = prefill.start(contexts, reserved)
        assert prefill.cache is not None
        layers = prefill.cache.layers
        template = []
        for layer in layers:
            assert isinstance(layer, DynamicLayer)
            assert layer.keys is not None
            assert layer.values is not None
            template.append((layer.keys, layer.values))
        self._ensure(template, self.rows + len(contexts), max(reserved))
        assert self.cache is not None
        used = set(self.row_slots)
        slots = [slot for slot in range(len(self.lengths)) if slot not in used][: len(contexts)]
        # Left-padded prefill rows move to column 0 of their slots: column j of row i is the
        # prefill's column width - len_i + j.
        width = template[0][0].shape[2]
        lengths = torch.tensor([len(context) for context in contexts], device=self.device)
        source = torch.arange(width, device=self.device) + (width - lengths).unsqueeze(-1)
        source = source.clamp(max=width - 1)
        index = torch.tensor(slots, device=self.device)
        for (keys, values), layer in zip(template, self.cache.slot_layers, strict=True):
            for prefilled, target in ((keys, layer.key_slots), (values, layer.value_slots)):
                gather = source[:, None, :, None].expand(
                    -1, prefilled.shape[1], -1, prefilled.shape[3]
                )
                target[index, :, :width] = prefilled.gather(2, gather)
        for slot, context in zip(slots, contexts, strict=True):
            self.lengths[slot] = len(context)
        self.row_slots.extend(slots)
        return logits

    def _ensure(
        self, template: Sequence[tuple[torch.Tensor, torch.Tensor]], slots: int, columns: int
    ) -> None:
        """Enough slots and columns, keeping what the held rows cached."""
        have_slots = len(self.lengths)
        have_columns = 0 if self.cache is None else self.cache.column_count
        if slots <= have_slots and columns <= have_columns:
            return
        want_slots = max(have_slots, min(self.max_slots, 1 << (slots - 1).bit_length()), slots)
        want_columns = max(have_columns, _round_up(columns, COLUMN_BLOCK))
        grown = SlotCache(template, want_slots, want_columns, static=self.compile)
        if self.cache is not None:
            # Held rows keep their keys and values; a free slot's columns need not be copied.
            for old, new in zip(self.cache.slot_layers, grown.slot_layers, strict=True):
                new.key_slots[:have_slots, :, :have_columns] = old.key_slots
                new.value_slots[:have_slots, :, :have_columns] = old.value_slots
        logger.info("slot cache: %d slots x %d columns", want_slots, want_columns)
        self.cache = grown
        self.lengths += [0] * (want_slots - have_slots)
        self._step = None  # new shapes: compile again

    def step(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        cache = self.cache
        assert cache is not None
        slot_count = len(self.lengths)
        index = torch.tensor(self.row_slots)
        input_ids = torch.zeros((slot_count, 1), dtype=torch.long)
        input_ids[index, 0] = torch.tensor(list(tokens), dtype=torch.long)
        position_ids = torch.zeros((slot_count, 1), dtype=torch.long)
        position_ids[index, 0] = torch.tensor(list(positions), dtype=torch.long)
        cache.columns.copy_(torch.tensor(self.lengths), non_blocking=True)
        # Windows of COLUMN_BLOCK x a power of two: few distinct shapes, so few compilations
        # (each window is a graph of its own), at most twice the columns needed.
        longest = max(self.lengths[slot] for slot in self.row_slots) + 1
        window = COLUMN_BLOCK << max(
            0, (_round_up(longest, COLUMN_BLOCK) // COLUMN_BLOCK - 1).bit_length()
        )
        cache.window = min(window, cache.column_count)
        logits = self._decode(input_ids.to(self.device), position_ids.to(self.device))
        for slot in self.row_slots:
            self.lengths[slot] += 1
        return logits[index.to(self.device)]

    def _decode(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if not self.compile:
            return self._forward(input_ids, position_ids)
        if self._step is None:
            self._step = torch.compile(self._forward, mode="reduce-overhead")
        seconds, graphs = compile_seconds(), compile_count()
        try:
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
            logits = self._step(input_ids, position_ids)
        except Exception:  # any compiler failure: decode eagerly from now on
            logger.exception("compiling the slot decode step failed; decoding eagerly")
            self._stop_compiling()
            return self._forward(input_ids, position_ids)
        self.compile_s += compile_seconds() - seconds
        self.compiled_graphs += compile_count() - graphs
        if (
            self.compile_s > self.compile_budget_s
            or self.compiled_graphs > self.max_compiled_graphs
        ):
            logger.warning(
                "slot decode: compiling took %.1f s over %d graphs (budget %.0f s, %d graphs); "
                "decoding eagerly from now on",
                self.compile_s,
                self.compiled_graphs,
                self.compile_budget_s,
                self.max_compiled_graphs,
            )
            self._stop_compiling()
        return logits

    def _stop_compiling(self) -> None:
        self.compile = False
        self._step = None

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """One decode step over every slot (free slots compute a throwaway token)."""
        cache = self.cache
        assert cache is not None
        visible = torch.arange(cache.window, device=input_ids.device) <= cache.columns[:, None]
        output = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=visible[:, None, None, :],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits
