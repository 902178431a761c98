"""Shared-prefix (cascade) decode attention: grouping, CPU kernel equality (end to end: test_shared_prefix_engine.py).

Tolerances against the per-context reference (`PagedAttention`): fp32 atol=1e-6, rtol=1e-5; bf16
atol=4e-3, rtol=1.6e-2 (the cascade rounds each partial output to bf16 before the fp32 merge, the
reference rounds once). Block tables come from the engine's own ContextTable (forks share full
blocks, a partly filled last block is copied on write), so grouping is tested on real layouts.
"""

from __future__ import annotations

import random

import pytest
import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix import (
    GroupingConfig,
    Segment,
    attend_with_lse,
    attend_with_lse_math,
    merge_into,
    plan_shared_prefixes,
)
from parrot.engine.attention.shared_prefix_backend import SharedPrefixAttention
from parrot.engine.kernels.library import blocks_library
from parrot.engine.kv.block_pool import BlockPool
from parrot.engine.kv.cache import KVCache
from parrot.engine.kv.context import Context, ContextTable

HQ, HKV, D = 9, 3, 64  # the default model's attention shape
NATIVE = kernels.available()  # what a backend built with native=True decodes on, for bf16 caches
NATIVE_F32 = blocks_library() is not None  # ... and for float32 caches (the AVX2 kernels)
needs_native = pytest.mark.skipif(not NATIVE, reason="needs gcc and an AVX512-BF16 CPU")
# The native decode kernels, by the cache's dtype.
NATIVE_DTYPES = [
    pytest.param(torch.bfloat16, id="bf16", marks=needs_native),
    pytest.param(torch.float32, id="fp32", marks=pytest.mark.skipif(not NATIVE_F32, reason="needs gcc and AVX2")),
]
TOL = {torch.float32: {"atol": 1e-6, "rtol": 1e-5}, torch.bfloat16: {"atol": 4e-3, "rtol": 1.6e-2}}

# A batch spec: members are an int (a decode row: a context of that many own tokens, its newest
# token included) or (prefix_len, members) (a context forked by all its members).
Spec = list


def build_batch(spec: Spec, block_size: int, rng: random.Random | None = None) -> tuple[list[SeqSpec], int]:
    """Fork contexts as the engine does; with `rng`, fills interleave with a neighbour's blocks."""
    pool = BlockPool(1 << 20)
    table = ContextTable(pool, block_size)
    seqs: list[SeqSpec] = []
    ids = iter(range(1 << 30))

    def extend(ctx: Context, n: int) -> None:
        end = ctx.num_computed + n
        while ctx.num_computed < end:
            step = (
                end - ctx.num_computed if rng is None else min(end - ctx.num_computed, rng.randint(1, 3 * block_size))
            )
            table.reserve(ctx, ctx.num_computed + step)
            ctx.num_computed += step
            if rng is not None:
                pool.allocate(1)  # so a prefix's block ids are not consecutive

    def walk(members: Spec, parent: Context | None) -> None:
        for m in members:
            ctx = table.create(f"c{next(ids)}", parent)
            if isinstance(m, int):
                extend(ctx, m)
                seqs.append(SeqSpec(1, ctx.num_computed, list(ctx.block_table)))
            else:
                extend(ctx, m[0])
                walk(m[1], ctx)

    walk(spec, None)
    return seqs, pool.num_blocks - pool.num_free


def random_cache(num_blocks: int, block_size: int, dtype: torch.dtype, seed: int) -> KVCache:
    cache = KVCache(1, num_blocks, block_size, HKV, D, dtype)
    gen = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache


def check_decode(
    spec: Spec, block_size: int, dtype: torch.dtype, seed: int, grouping: GroupingConfig, native: bool = NATIVE
) -> SharedPrefixAttention:
    rng = random.Random(seed)
    seqs, num_blocks = build_batch(spec, block_size, rng if seed % 2 else None)
    if seed % 2:
        rng.shuffle(seqs)  # the scheduler's row order interleaves the groups
    cache = random_cache(num_blocks, block_size, dtype, seed)
    q = torch.randn(len(seqs), HQ, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    ref = PagedAttention(cache, HQ, HKV, D, native)
    ref.prepare_decode(seqs)
    shared = SharedPrefixAttention(cache, HQ, HKV, D, native, grouping)
    shared.prepare_decode(seqs)
    torch.testing.assert_close(shared.decode(0, q), ref.decode(0, q), **TOL[dtype])
    return shared


def rows(rng: random.Random, n: int, max_suffix: int) -> list[int]:
    return [rng.randint(1, max_suffix) for _ in range(n)]


def small_specs(seed: int) -> dict[str, Spec]:
    rng = random.Random(seed)
    return {
        "one_group_of_64": [(rng.randint(256, 700), rows(rng, 64, 40))],
        "nested_several_groups": [
            (
                rng.randint(256, 400),  # a system prompt shared by all...
                [
                    (rng.randint(256, 500), rows(rng, 3, 60)),  # ...a document shared by some
                    (rng.randint(256, 300), rows(rng, 2, 60)),
                    (rng.randint(1, 40), rows(rng, 2, 60)),  # a short turn: stays in the tails
                    *rows(rng, 2, 60),
                ],
            ),
            (rng.randint(256, 600), rows(rng, 5, 30)),
            *rows(rng, 2, 300),
        ],
        "long_suffixes": [(rng.randint(256, 400), [2048, 1, *rows(rng, 3, 2048)])],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("case", ["one_group_of_64", "nested_several_groups", "long_suffixes"])
@pytest.mark.parametrize("seed", [0, 1])
def test_shared_equals_per_context(case: str, block_size: int, dtype: torch.dtype, seed: int) -> None:
    """The torch cascade (backends built without native decode)."""
    shared = check_decode(small_specs(seed)[case], block_size, dtype, seed, GroupingConfig(), native=False)
    assert shared.plan is not None and shared.plan.segments and shared.cascade is not None
    assert shared.pieces is None
    if case == "nested_several_groups":  # system prompt, its 2 documents, the other group
        assert len(shared.plan.segments) == 4
        assert max(sum(r in s.rows for s in shared.plan.segments) for r in range(16)) == 2  # two levels
        if seed % 2:
            assert shared.cascade.perm is not None  # shuffled rows: processed in trie order
    if case == "long_suffixes":  # tails of 1-2048 tokens: padded per bucket of similar lengths
        assert len(shared.cascade.tails) > 1


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("case", ["one_group_of_64", "nested_several_groups", "long_suffixes"])
@pytest.mark.parametrize("seed", [0, 1])
def test_native_cascade_equals_per_context(case: str, block_size: int, seed: int, dtype: torch.dtype) -> None:
    """The native cascade against the per-context path (itself native), nested groups included."""
    shared = check_decode(small_specs(seed)[case], block_size, dtype, seed, GroupingConfig(), native=True)
    assert shared.plan is not None and shared.pieces is not None and shared.cascade is None
    pieces = shared.pieces
    # Every row reads its tail plus each segment it is in, split in runs of <= 256 tokens.
    run_tokens = 256 // block_size * block_size
    runs = {i: -(-s.num_tokens // run_tokens) for i, s in enumerate(shared.plan.segments)}
    for row in range(len(shared.plan.tail_lens)):
        expected = 1 + sum(runs[i] for i, s in enumerate(shared.plan.segments) if row in s.rows)
        assert int(pieces.slot_ptr[row + 1] - pieces.slot_ptr[row]) == expected


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_native_cascade_matches_an_fp64_reference(dtype: torch.dtype) -> None:
    """Shared prefix + tails through the native kernel vs attention in float64 over the same KV."""
    rng = torch.Generator().manual_seed(5)
    bs, hq, hkv, d, shared_blocks = 16, 9, 3, 64, 37
    kc = torch.randn(shared_blocks + 40, bs, hkv, d, generator=rng).to(dtype)
    vc = torch.randn(shared_blocks + 40, bs, hkv, d, generator=rng).to(dtype)
    tails = [1, 5, 16, 17, 100]
    pieces_in = [([0, 1, 2, 3, 4], list(range(shared_blocks)), shared_blocks * bs)]
    first = shared_blocks
    tables = []
    for row, n in enumerate(tails):
        blocks = list(range(first, first + -(-n // bs)))
        first += len(blocks)
        pieces_in.append(([row], blocks, n))
        tables.append((list(range(shared_blocks)) + blocks, shared_blocks * bs + n))
    q = torch.randn(len(tails), hq, d, generator=rng).to(dtype)
    out = kernels.cascade_decode(q, kc, vc, kernels.CascadePieces.build(pieces_in, len(tails)), d**-0.5)
    for row, (blocks, n) in enumerate(tables):
        keys = kc[blocks].flatten(0, 1)[:n].double().repeat_interleave(hq // hkv, dim=1)  # [n, Hq, D]
        vals = vc[blocks].flatten(0, 1)[:n].double().repeat_interleave(hq // hkv, dim=1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[row].double(), keys) * d**-0.5, dim=-1)
        ref = torch.einsum("hn,nhd->hd", probs, vals).reshape(-1)
        torch.testing.assert_close(out[row].double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_native_cascade_propagates_nan_and_checks_its_pieces(dtype: torch.dtype) -> None:
    kc = torch.randn(4, 16, 3, 64).to(dtype)
    vc = torch.randn(4, 16, 3, 64).to(dtype)
    kc[1, 3, 0, 0] = float("nan")  # in the shared piece, KV head 0
    pieces = kernels.CascadePieces.build([([0, 1], [0, 1], 32), ([0], [2], 1), ([1], [3], 4)], 2)
    out = kernels.cascade_decode(torch.randn(2, 9, 64).to(dtype), kc, vc, pieces, 0.125).view(2, 9, 64)
    assert bool(out[:, :3].isnan().all()) and not bool(out[:, 3:].isnan().any())
    with pytest.raises(ValueError, match="every row needs a piece"):
        kernels.CascadePieces.build([([0], [0], 16)], 2)
    with pytest.raises(ValueError, match="at least one token"):
        kernels.CascadePieces.build([([0], [0], 0)], 1)
    with pytest.raises(ValueError, match="pieces are for 2 rows"):
        kernels.cascade_decode(torch.randn(3, 9, 64).to(dtype), kc, vc, pieces, 0.125)


@pytest.mark.parametrize(("block_size", "dtype"), [(16, torch.float32), (16, torch.bfloat16), (1, torch.float32)])
def test_long_prefix(block_size: int, dtype: torch.dtype) -> None:
    rng = random.Random(7)
    spec: Spec = [(8192, rows(rng, 12, 200)), (2048, rows(rng, 2, 2000))]
    shared = check_decode(spec, block_size, dtype, 3, GroupingConfig())
    assert shared.plan is not None
    assert [(len(s.rows), s.num_tokens) for s in shared.plan.segments] == [(12, 8192), (2, 2048)]


@pytest.mark.parametrize("block_size", [1, 16])
def test_no_group_pays_falls_back(block_size: int) -> None:
    # Groups of one, no prefix at all, and a shared prefix below the threshold.
    spec: Spec = [(300, [5]), 17, 40, (100, [3, 9])]
    shared = check_decode(spec, block_size, torch.float32, 2, GroupingConfig())
    assert shared.plan is None and shared.num_shared_steps == 0


def test_fork_of_partial_block_shares_only_full_blocks() -> None:
    seqs, _ = build_batch([(40, [3, 5])], block_size=16)
    # 40 tokens = 2 full blocks + 8 slots copied on write into each child's own third block.
    assert seqs[0].block_table[:2] == seqs[1].block_table[:2]
    assert seqs[0].block_table[2] != seqs[1].block_table[2]
    plan = plan_shared_prefixes([s.block_table for s in seqs], [s.seq_len for s in seqs], 16, GroupingConfig(2, 32))
    assert plan.segments == (Segment((0, 1), tuple(seqs[0].block_table[:2]), 32),)
    assert plan.tail(0) == ([seqs[0].block_table[2]], 11)
    assert plan.tail(1) == ([seqs[1].block_table[2]], 13)


# Hand-made tables, block size 4: blocks 0-3 a system prompt; 10-11 and 12-13 two documents.
TABLES = [
    [0, 1, 2, 3, 10, 11, 20],
    [0, 1, 2, 3, 10, 11, 21],
    [0, 1, 2, 3, 12, 13, 22],
    [0, 1, 2, 3, 12, 13, 23, 24],
    [0, 1, 2, 3, 25],
    [30, 31],
]
LENS = [26, 27, 25, 30, 17, 6]


def test_grouping_two_levels() -> None:
    plan = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_shared_tokens=8))
    assert plan.segments == (
        Segment((0, 1, 2, 3, 4), (0, 1, 2, 3), 16),
        Segment((0, 1), (10, 11), 8),
        Segment((2, 3), (12, 13), 8),
    )
    tails = [plan.tail(i) for i in range(6)]
    assert tails == [([20], 2), ([21], 3), ([22], 1), ([23, 24], 6), ([25], 1), ([30, 31], 6)]


def test_grouping_threshold_keeps_short_runs_per_row() -> None:
    plan = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_shared_tokens=12))
    assert plan.segments == (Segment((0, 1, 2, 3, 4), (0, 1, 2, 3), 16),)
    assert plan.tail(0) == ([10, 11, 20], 10)
    assert plan.tail(3) == ([12, 13, 23, 24], 14)


def test_grouping_asks_a_segment_to_spare_enough_token_reads() -> None:
    # The system prompt: 5 rows x 16 tokens spare 64 reads; each document pair 1 x 8 = 8.
    plan = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_shared_tokens=8, min_saved_tokens=64))
    assert plan.segments == (Segment((0, 1, 2, 3, 4), (0, 1, 2, 3), 16),)
    assert plan.tail(0) == ([10, 11, 20], 10)
    # Asking 65: the prompt's 64 fall short; carried down, each pair's 24 tokens spare 24: none.
    none = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_shared_tokens=8, min_saved_tokens=65))
    assert none.segments == () and none.tail(3) == ([0, 1, 2, 3, 12, 13, 23, 24], 30)
    with pytest.raises(ValueError, match="min_saved_tokens"):
        GroupingConfig(min_saved_tokens=-1)


def test_grouping_carries_a_short_parent_into_its_children() -> None:
    # The system prompt alone (16 tokens) is too short; with each document it pays (24).
    plan = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_shared_tokens=20))
    assert plan.segments == (
        Segment((0, 1), (0, 1, 2, 3, 10, 11), 24),
        Segment((2, 3), (0, 1, 2, 3, 12, 13), 24),
    )
    assert plan.tail(4) == ([0, 1, 2, 3, 25], 17)
    assert plan.tail(5) == ([30, 31], 6)


def test_grouping_min_group_size_and_newest_block() -> None:
    plan = plan_shared_prefixes(TABLES, LENS, 4, GroupingConfig(min_group_size=3, min_shared_tokens=8))
    assert plan.segments == (Segment((0, 1, 2, 3, 4), (0, 1, 2, 3), 16),)
    # Identical tables: the block holding the newest token (being written) is never shared.
    plan = plan_shared_prefixes([[5, 6], [5, 6]], [8, 8], 4, GroupingConfig(min_shared_tokens=4))
    assert plan.segments == (Segment((0, 1), (5,), 4),)
    assert [plan.tail(i) for i in range(2)] == [([6], 4), ([6], 4)]
    empty = plan_shared_prefixes([], [], 4)
    assert empty.segments == () and empty.tail_tables.shape == (0, 0)


def test_grouping_config_is_validated() -> None:
    with pytest.raises(ValueError, match="min_group_size"):
        GroupingConfig(min_group_size=1)
    with pytest.raises(ValueError, match="min_shared_tokens"):
        GroupingConfig(min_shared_tokens=0)


def test_merge_of_disjoint_key_sets_is_exact() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, HKV, 5, D, generator=gen) * 3  # [n, Hkv, G, D] with G=5 query rows
    k, v = torch.randn(2, HKV, 300, D, generator=gen), torch.randn(2, HKV, 300, D, generator=gen)
    full, full_lse = attend_with_lse_math(q, k, v, None, D**-0.5)
    parts = [attend_with_lse(q, k[:, :, a:b], v[:, :, a:b], None, D**-0.5) for a, b in [(0, 1), (1, 120), (120, 300)]]
    acc, acc_lse = parts[0]
    for out, lse in parts[1:]:
        merge_into(acc, acc_lse, out, lse)
    torch.testing.assert_close(acc, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acc_lse, full_lse, atol=1e-5, rtol=1e-5)
    # The fused CPU kernel and the plain math agree on the log-sum-exp too.
    torch.testing.assert_close(parts[1][1], attend_with_lse_math(q, k[:, :, 1:120], v[:, :, 1:120], None, D**-0.5)[1])


def test_forward_with_prefill_rows_matches_reference() -> None:
    """The whole step: cache writes, cascade decode rows, then a prefill chunk, as the runner calls it."""
    seqs, num_blocks = build_batch([(300, [4, 9, 1]), (64, [2])], 16)
    bs = 16
    prefill = SeqSpec(num_new=20, seq_len=20, block_table=[num_blocks, num_blocks + 1])
    steps = [*seqs, prefill]
    cache = random_cache(num_blocks + 2, bs, torch.float32, 5)
    slots = [s.block_table[(s.seq_len - 1) // bs] * bs + (s.seq_len - 1) % bs for s in seqs]
    slots += [num_blocks * bs + i for i in range(20)]
    n = len(slots)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (
        torch.randn(n, HQ, D, generator=gen),
        torch.randn(n, HKV, D, generator=gen),
        torch.randn(n, HKV, D, generator=gen),
    )
    outs = []
    # The default grouping: the native one (4 rows x 512 tokens) would decode this 300-token prefix per context.
    shared = SharedPrefixAttention(cache, HQ, HKV, D, NATIVE, grouping=GroupingConfig())
    for backend in (PagedAttention(cache, HQ, HKV, D, NATIVE), shared):
        backend.prepare(steps, torch.tensor(slots))
        outs.append(backend.forward(0, q, k, v))
    assert shared.plan is not None
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def test_registered_by_name_and_device() -> None:
    from parrot.engine.attention.registry import make_backend

    backend = make_backend("shared_prefix", KVCache(1, 4, 16, HKV, D, torch.float32), HQ, HKV, D)
    assert type(backend) is SharedPrefixAttention  # CPU cache: the PyTorch path, not the Triton one


@pytest.mark.parametrize("built_native", [True, False])
def test_small_groups_decode_per_context_when_the_native_kernel_is_on(built_native: bool) -> None:
    """With the native kernels (bf16 or float32), the (native) cascade needs 4+ rows sharing 512+
    tokens; the torch path keeps the lower thresholds; an explicit grouping is always kept."""
    from parrot.engine.attention.shared_prefix_backend import NATIVE_GROUPING

    def backend_for(dtype: torch.dtype, rows: int, shared_blocks: int, grouping: GroupingConfig | None = None):  # type: ignore[no-untyped-def]
        cache = KVCache(1, shared_blocks + rows + 1, 16, 3, 64, dtype)
        seqs = [SeqSpec(1, shared_blocks * 16 + 8, [*range(shared_blocks), shared_blocks + r]) for r in range(rows)]
        backend = SharedPrefixAttention(cache, 9, 3, 64, built_native, grouping)
        backend.prepare_decode(seqs)
        return backend

    native = built_native and NATIVE
    small = backend_for(torch.bfloat16, 2, 20)  # 2 rows x 320 shared tokens
    assert (small.plan is None) == native
    f32 = backend_for(torch.float32, 2, 20)
    assert (f32.plan is None) == (built_native and NATIVE_F32)  # torch path: groups of 2 pay
    assert (backend_for(torch.bfloat16, 3, 64).plan is None) == native  # 3 rows x 1,024 tokens
    four = backend_for(torch.bfloat16, 4, 32)  # 4 rows x 512 tokens: a cascade either way
    assert four.plan is not None and (four.pieces is not None) == native and (four.cascade is None) == native
    explicit = backend_for(torch.bfloat16, 2, 20, GroupingConfig())
    assert explicit.plan is not None and explicit.step_grouping() == GroupingConfig()
    if native:
        assert small.step_grouping() == NATIVE_GROUPING
