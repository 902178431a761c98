"""Paged KV accounting of the simulated engine: exact block ids through forks, copy-on-write,
frees and reclaim."""

from __future__ import annotations

import pytest

from parrot.sim.kv import BlockTable, OutOfBlocks


def test_fork_shares_full_blocks_and_copies_a_partial_one() -> None:
    kv = BlockTable(num_blocks=8, block_size=4)
    parent = kv.create("p")
    parent.num_tokens = 10
    kv.compute(parent, 10)  # 10 tokens: blocks 0, 1 full, block 2 holds 2 slots
    assert [parent.blocks, kv.num_free] == [[0, 1, 2], 5]
    child = kv.create("c", parent)
    # full blocks shared, the partial one copied into a new block 3
    assert [child.blocks, child.num_computed, child.shared_len, child.root_id] == [[0, 1, 3], 10, 8, "p"]
    assert [kv.refs[:4], kv.num_copies] == [[2, 2, 1, 1], 1]
    kv.compute(child, 3)  # 13 tokens: fills block 3 (2 more slots), then block 4
    assert [child.blocks, kv.num_free] == [[0, 1, 3, 4], 3]


def test_blocks_return_when_no_context_refers_to_them() -> None:
    kv = BlockTable(num_blocks=4, block_size=4)
    parent = kv.create("p")
    kv.compute(parent, 8)
    child = kv.create("c", parent)
    assert [child.blocks, kv.num_free] == [[0, 1], 2]
    kv.remove("p")
    assert [kv.refs[:2], kv.num_free] == [[1, 1], 2]  # the child still holds them
    kv.remove("c")
    assert [kv.num_free, sorted(kv.free)] == [4, [0, 1, 2, 3]]


def test_compute_without_room_changes_nothing() -> None:
    kv = BlockTable(num_blocks=2, block_size=4)
    ctx = kv.create("a")
    with pytest.raises(OutOfBlocks):
        kv.compute(ctx, 9)
    assert [ctx.blocks, ctx.num_computed, kv.num_free] == [[], 0, 2]


def test_reclaim_releases_idle_contexts_least_recently_used_first() -> None:
    kv = BlockTable(num_blocks=6, block_size=4)
    for name, used in (("old", 1.0), ("new", 2.0), ("busy", 0.5)):
        ctx = kv.create(name)
        ctx.num_tokens = 8
        kv.compute(ctx, 8)
        ctx.last_used = used
    kv.contexts["busy"].busy = True
    assert kv.num_free == 0
    assert kv.reclaim_idle(2, keep=set()) == 2
    # "busy" is skipped although it is oldest; "old" goes first, keeps its tokens, recomputes later
    assert [kv.contexts["old"].blocks, kv.contexts["old"].num_computed, kv.contexts["old"].num_tokens] == [[], 0, 8]
    assert [kv.contexts["new"].blocks, kv.contexts["busy"].blocks] == [[2, 3], [4, 5]]
