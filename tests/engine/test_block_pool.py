"""Block pool and context table: forks share blocks, copy-on-write, exact accounting."""

from __future__ import annotations

import random

import pytest

from parrot.engine.kv.block_pool import BlockPool, OutOfBlocks
from parrot.engine.kv.context import BlockCopy, ContextTable


def grow(table: ContextTable, ctx_id: str, n: int) -> list[BlockCopy]:
    ctx = table.get(ctx_id)
    copies = table.reserve(ctx, ctx.num_computed + n)
    ctx.tokens.extend([7] * n)
    ctx.num_computed += n
    return copies


def test_allocate_and_free_exact_ids() -> None:
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.num_free == 2
    pool.decref([1])
    assert pool.allocate(1) == [1]  # most recently freed first
    with pytest.raises(OutOfBlocks):
        pool.allocate(3)
    assert pool.num_free == 2


def test_fork_shares_full_blocks_and_copies_partial_tail_on_write() -> None:
    table = ContextTable(BlockPool(10), block_size=4)
    table.create("p")
    grow(table, "p", 6)  # blocks [0, 1]; block 1 holds 2 slots
    assert table.get("p").block_table == [0, 1]
    child = table.create("c", table.get("p"))
    assert child.block_table == [0, 1]
    assert table.pool.ref_count(0) == 2 and table.pool.ref_count(1) == 2
    copies = grow(table, "c", 3)  # writes slots 6..8: block 1 is shared -> copy-on-write
    assert copies == [BlockCopy(src=1, dst=2, num_slots=2)]
    assert child.block_table == [0, 2, 3]
    assert table.pool.ref_count(1) == 1  # the parent's tail is its own again
    # The parent writing into its own (no longer shared) tail copies nothing.
    assert grow(table, "p", 1) == []


def test_parent_writing_into_a_shared_tail_copies_too() -> None:
    table = ContextTable(BlockPool(10), block_size=4)
    table.create("p")
    grow(table, "p", 5)
    table.create("c", table.get("p"))
    copies = grow(table, "p", 1)
    assert copies == [BlockCopy(src=1, dst=2, num_slots=1)]
    assert table.get("c").block_table == [0, 1]
    assert table.get("p").block_table == [0, 2]


def test_preemption_keeps_only_shared_full_blocks() -> None:
    table = ContextTable(BlockPool(10), block_size=4)
    table.create("p")
    grow(table, "p", 8)
    child = table.create("c", table.get("p"))
    grow(table, "c", 6)  # [0, 1, 2, 3]; 2 and 3 are the child's own
    freed = table.truncate_to_shared(child)
    assert freed == 2
    assert child.block_table == [0, 1]
    assert child.num_computed == 8
    assert len(child.tokens) == 14  # the tokens stay; their KV is recomputed later


def test_truncate_drops_the_cut_tokens_and_the_blocks_past_them() -> None:
    table = ContextTable(BlockPool(10), block_size=4)
    table.create("p")
    grow(table, "p", 5)
    child = table.create("c", table.get("p"))  # shares [0, 1]
    grow(table, "c", 6)  # 11 computed: [0, 2, 3] (block 1 copied on write)
    child.tokens.append(9)  # a sampled token, not computed yet
    table.truncate(child, 8)  # a stop string began at token 8: block 3 goes back
    assert [len(child.tokens), child.num_computed, child.block_table] == [8, 8, [0, 2]]
    assert table.pool.num_free == 10 - 3
    table.truncate(child, 3)  # into the shared block: it stays shared, writing there copies it
    assert [child.num_computed, child.block_table, table.pool.ref_count(0)] == [3, [0], 2]
    assert grow(table, "c", 1) == [BlockCopy(src=0, dst=2, num_slots=3)]
    assert table.get("p").block_table == [0, 1]


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_random_forks_and_frees_return_every_block(block_size: int) -> None:
    rng = random.Random(block_size)
    table = ContextTable(BlockPool(5000), block_size=block_size)
    start = table.pool.num_free
    live: list[str] = []
    for step in range(300):
        op = rng.random()
        if op < 0.3 or not live:
            cid = f"r{step}"
            table.create(cid)
            grow(table, cid, rng.randint(1, 9))
            live.append(cid)
        elif op < 0.6:
            parent = table.get(rng.choice(live))
            cid = f"f{step}"
            table.create(cid, parent)
            grow(table, cid, rng.randint(0, 9))
            live.append(cid)
        elif op < 0.75:
            grow(table, rng.choice(live), rng.randint(1, 5))
        else:
            victim = live.pop(rng.randrange(len(live)))
            table.free(table.get(victim))
        # Invariant: a block's count equals the number of tables listing it.
        counts: dict[int, int] = {}
        for ctx in table.contexts.values():
            for b in ctx.block_table:
                counts[b] = counts.get(b, 0) + 1
        assert all(table.pool.ref_count(b) == n for b, n in counts.items())
        assert table.pool.num_free == start - len(counts)
    for cid in live:
        table.free(table.get(cid))
    assert table.pool.num_free == start
