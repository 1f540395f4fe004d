"""A paged KV cache: fixed-size blocks, reference counts, and a prefix cache with LRU eviction.

Modelled on vLLM's block pool: a full block is identified by a hash chained over its tokens and
every block before it, so two sequences with a common prefix share blocks. A block nobody holds
stays cached in the free queue until an allocation evicts it, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def extend_hashes(chain: list[int], tail: Sequence[int], block_size: int) -> list[int]:
    """``chain`` extended over the full blocks of ``tail``, the tokens that follow it."""
    out = list(chain)
    parent = out[-1] if out else 0
    for start in range(0, len(tail) - block_size + 1, block_size):
        parent = hash((parent, tuple(tail[start : start + block_size])))
        out.append(parent)
    return out


class BlockPool:
    """Allocates KV blocks and keeps freed full blocks reusable until they are evicted."""

    def __init__(self, num_blocks: int, *, prefix_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds (cached or empty): what an allocation can take."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks matching the longest prefix of ``hashes`` (not yet acquired)."""
        hits: list[int] = []
        if not self.prefix_caching:
            return hits
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def unreferenced(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (acquiring them uses up free blocks)."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks found by ``cached_prefix``."""
        for block in blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks from the free queue, evicting the cached content they hold."""
        free, hash_of, by_hash, refs = self._free, self._hash_of, self._by_hash, self._refs
        if count > len(free):
            raise RuntimeError(f"asked for {count} KV blocks, {len(free)} free")
        blocks: list[int] = []
        for _ in range(count):
            block = free.popitem(last=False)[0]
            old = hash_of[block]
            if old is not None:
                del by_hash[old]
                hash_of[block] = None
            refs[block] = 1
            blocks.append(block)
        return blocks

    def forget_prefixes(self) -> None:
        """Make every cached prefix unfindable (blocks in use stay allocated to their owners)."""
        for block in self._by_hash.values():
            self._hash_of[block] = None
        self._by_hash.clear()

    def release(self, blocks: Sequence[int], hashes: Sequence[int] = ()) -> None:
        """Drop one reference on each block; unreferenced ones join the free queue.

        ``hashes`` (one per full block, in order) make the blocks findable by a later prefix.
        Blocks are freed tail first so that a sequence's last blocks are evicted before its
        prefix, which other sequences are more likely to share.
        """
        free, hash_of, by_hash, refs = self._free, self._hash_of, self._by_hash, self._refs
        if self.prefix_caching:
            for block, h in zip(blocks, hashes, strict=False):
                if hash_of[block] is None and h not in by_hash:
                    hash_of[block] = h
                    by_hash[h] = block
        for block in reversed(blocks):
            refs[block] -= 1
            if refs[block] == 0:
                free[block] = None
                if hash_of[block] is None:
                    # Nothing to keep in it: let the next allocation take it before cached blocks.
                    free.move_to_end(block, last=False)
