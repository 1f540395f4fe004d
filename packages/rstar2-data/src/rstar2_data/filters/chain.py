"""Filters applied in order to a stream of rows, with the state a resumed run restores.

``FilterChain.judge`` takes each filter's verdict on a row (computed here, or beforehand in
worker processes), keeps the keys of key filters (dedup) and the row ids (an id may occur once
in a build), and counts removals per filter and reason. ``state`` and ``restore`` save and
reload all of it: counters as JSON, keys as an append-only log of fixed-size records.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from rstar2_data.filters.base import Filter, FilterReport, Verdict
from rstar2_data.filters.text import Item

KEY_BYTES = 16
_RECORD = KEY_BYTES + 1  # one byte: which key set; then the key
_ID_SET = 255  # the key set of row ids (filters use 0..254)
_REPEATED_SET = 254  # ids seen more than once
MAX_FILTERS = 250


class DuplicateIdsError(ValueError):
    """Rows kept by the filters share ids."""


def id_key(row_id: str) -> bytes:
    """The fixed-size key a row id is remembered by."""
    return hashlib.blake2b(row_id.encode("utf-8"), digest_size=KEY_BYTES).digest()


class FilterChain:
    """Applies ``filters`` in order; ``unique_ids`` also checks that kept rows' ids differ."""

    def __init__(self, filters: Sequence[Filter], *, unique_ids: bool = True) -> None:
        if len(filters) > MAX_FILTERS:
            raise ValueError(f"at most {MAX_FILTERS} filters, got {len(filters)}")
        self.filters = list(filters)
        self.unique_ids = unique_ids
        self.rows_in = [0] * len(filters)
        self.removed: list[Counter[str]] = [Counter() for _ in filters]
        self.also_matched: list[Counter[str]] = [Counter() for _ in filters]
        self.keys: dict[int, set[bytes]] = {}
        self._new_keys: list[bytes] = []
        self.repeated_id_examples: list[str] = []

    # -- judging --------------------------------------------------------------------------

    def _remember(self, which: int, key: bytes) -> bool:
        """Add ``key`` to key set ``which``; False when it was there already."""
        seen = self.keys.setdefault(which, set())
        if key in seen:
            return False
        seen.add(key)
        self._new_keys.append(bytes((which,)) + key)
        return True

    def judge(self, verdict: Callable[[int], Verdict], row_id: str) -> bool:
        """Whether the row passes every filter; ``verdict(k)`` is filter ``k``'s check of it."""
        for k, filt in enumerate(self.filters):
            self.rows_in[k] += 1
            found = verdict(k)
            if isinstance(found, bytes):
                found = None if self._remember(k, found) else filt.repeat_reason()
            if found is not None:
                self.removed[k][found] += 1
                for later in range(k + 1, len(self.filters)):
                    if self.filters[later].judges_removed:
                        also = verdict(later)
                        if isinstance(also, str):
                            self.also_matched[later][also] += 1
                return False
        if (
            self.unique_ids
            and not self._remember(_ID_SET, id_key(row_id))
            and self._remember(_REPEATED_SET, id_key(row_id))
        ):
            self.repeated_id_examples = sorted({*self.repeated_id_examples, row_id})[:3]
        return True

    def judge_item(self, item: Item) -> bool:
        """``judge`` with the verdicts computed here, only as far as they are needed."""
        return self.judge(lambda k: self.filters[k].check(item), item.row.id)

    def check_duplicate_ids(self) -> None:
        """Raise ``DuplicateIdsError`` when kept rows shared ids."""
        repeated = len(self.keys.get(_REPEATED_SET, ()))
        if repeated:
            raise DuplicateIdsError(
                f"{repeated} ids occur more than once (e.g. {self.repeated_id_examples}); "
                "add a dedup filter or give the sources distinct ids"
            )

    def reports(self) -> list[FilterReport]:
        """One report per filter."""
        return [
            FilterReport(
                name=filt.name,
                rows_in=self.rows_in[k],
                kept=self.rows_in[k] - sum(self.removed[k].values()),
                removed=dict(sorted(self.removed[k].items())),
                also_matched=dict(sorted(self.also_matched[k].items())),
            )
            for k, filt in enumerate(self.filters)
        ]

    # -- checkpoints ----------------------------------------------------------------------

    def take_keys(self) -> bytes:
        """The keys remembered since the last call, as records of the key log."""
        records = b"".join(self._new_keys)
        self._new_keys.clear()
        return records

    def state(self) -> dict[str, Any]:
        """The counters, as JSON-ready data (the keys go to the log: ``take_keys``)."""
        return {
            "rows_in": self.rows_in,
            "removed": [dict(c) for c in self.removed],
            "also_matched": [dict(c) for c in self.also_matched],
            "repeated_id_examples": self.repeated_id_examples,
        }

    def restore(self, state: dict[str, Any], log: bytes) -> None:
        """Counters from ``state`` and keys from the bytes of the key log."""
        self.rows_in = list(state["rows_in"])
        self.removed = [Counter(c) for c in state["removed"]]
        self.also_matched = [Counter(c) for c in state["also_matched"]]
        self.repeated_id_examples = list(state["repeated_id_examples"])
        self.keys = {}
        self._new_keys = []
        if len(log) % _RECORD:
            raise ValueError(f"key log of {len(log)} bytes is not whole {_RECORD}-byte records")
        for start in range(0, len(log), _RECORD):
            self.keys.setdefault(log[start], set()).add(log[start + 1 : start + _RECORD])
