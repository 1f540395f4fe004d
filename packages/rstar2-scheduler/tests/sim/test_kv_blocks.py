"""The paged KV block pool: reference counts, prefix sharing, LRU eviction of cached blocks."""

from __future__ import annotations

import pytest

from rstar2_scheduler.sim.kv_blocks import BlockPool, extend_hashes


def test_hash_chain_depends_on_every_earlier_block() -> None:
    a = extend_hashes([], (1, 2, 3, 4, 5, 6, 7, 8, 9), 4)
    b = extend_hashes([], (0, 2, 3, 4, 5, 6, 7, 8), 4)
    assert len(a) == 2  # the partial last block has no hash
    assert a[1] != b[1]  # same second block, different prefix
    assert extend_hashes(a[:1], (5, 6, 7, 8, 9), 4) == a


def test_allocate_and_release_account_for_every_block() -> None:
    pool = BlockPool(8)
    first = pool.allocate(5)
    assert (pool.free_blocks, pool.used_blocks) == (3, 5)
    with pytest.raises(RuntimeError, match="asked for 4 KV blocks, 3 free"):
        pool.allocate(4)
    pool.release(first)
    assert pool.free_blocks == 8


def test_cached_blocks_are_shared_and_evicted_oldest_first() -> None:
    pool = BlockPool(4)
    hashes = extend_hashes([], tuple(range(8)), 4)
    blocks = pool.allocate(2)
    assert pool.cached_prefix(hashes) == []  # not findable until released with its hashes
    # A second holder shares the blocks instead of taking new ones.
    pool.acquire(blocks)
    pool.release(blocks, hashes)
    assert pool.free_blocks == 2
    assert pool.cached_prefix(hashes) == blocks
    pool.release(blocks)
    assert pool.free_blocks == 4
    assert pool.cached_prefix(hashes) == blocks  # freed but still cached
    assert pool.unreferenced(blocks) == 2
    # Empty blocks go before cached ones; a sequence's tail is evicted before its prefix.
    taken = pool.allocate(3)
    assert set(taken[:2]).isdisjoint(blocks)
    assert taken[2] == blocks[1]
    assert pool.cached_prefix(hashes) == blocks[:1]


def test_prefix_caching_off_never_hits() -> None:
    pool = BlockPool(4, prefix_caching=False)
    hashes = extend_hashes([], tuple(range(8)), 4)
    pool.release(pool.allocate(2), hashes)
    assert pool.cached_prefix(hashes) == []
